//! `belayer-bench env`: Belayer's environment checkpoint, restore and fork against what a
//! framework has today (replaying the episode in a fresh container), containerd's own
//! checkpoint/restore and podman's, all on the reference episode and in one run.

pub mod args;
pub mod belayer;
pub mod check;
pub mod control;
pub mod ctrd;
pub mod openai;
pub mod podman;
pub mod report;
pub mod rollout;
pub mod stats;
pub mod svg;

use std::time::{Duration, Instant};

/// Polls `f` every 20 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}
