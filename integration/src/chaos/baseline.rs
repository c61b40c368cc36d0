//! The overhead figure: the same trajectories — the episode's set-up, then turns with LLM-like
//! gaps drawn from the same seeded streams — under runc-v2, with no fault and no Belayer, for
//! the same duration, on the same containerd right after the soak. Their turn latency and turns
//! per sandbox-minute stand beside the soak's, as a ratio with both sides named.

use std::time::{Duration, Instant};

use super::Config;
use super::rng::Rng;
use super::trajectory::{remove, turn_script};
use crate::Containerd;
use crate::episode::{self, Sandbox};

const RUNC: &str = "io.containerd.runc.v2";

/// What the runc-v2 trajectories did.
#[derive(Clone, Debug, Default)]
pub struct Baseline {
    /// Turns that ran (exit 0), all sandboxes together.
    pub turns: u64,
    /// Each turn's exec, ms.
    pub turn_ms: Vec<f64>,
    /// Turns that failed (none expected: nothing is injected).
    pub failed: u64,
    /// The turns' running time, summed over sandboxes (set-up left out).
    pub sandbox_s: f64,
}

/// Runs `cfg.sandboxes` runc-v2 trajectories for `cfg.duration`, side by side.
pub fn run(c: &Containerd, cfg: &Config) -> Baseline {
    let each: Vec<Baseline> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..cfg.sandboxes)
            .map(|i| scope.spawn(move || one(c, cfg, i)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    let mut all = Baseline::default();
    for b in each {
        all.turns += b.turns;
        all.failed += b.failed;
        all.sandbox_s += b.sandbox_s;
        all.turn_ms.extend(b.turn_ms);
    }
    all
}

fn one(c: &Containerd, cfg: &Config, index: usize) -> Baseline {
    let id = format!("runc-{index}");
    let s = Sandbox::start(c, RUNC, &id);
    let mut b = Baseline::default();
    for a in episode::actions(cfg.holder_mb) {
        if s.exec(&a.script, a.stdin.as_deref()).code != 0 {
            b.failed += 1;
        }
    }
    let mut rng = Rng::for_sandbox(cfg.seed, index);
    let start = Instant::now();
    while start.elapsed() < cfg.duration {
        let gap = Duration::from_millis(rng.range(300, 1500));
        // The soak's draw, so that the gaps follow the same stream until its first fault.
        let _ = cfg.schedule.draw(&mut rng);
        std::thread::sleep(gap);
        let t = Instant::now();
        let out = s.exec(&turn_script(b.turns + 1), None);
        if out.code == 0 {
            b.turns += 1;
            b.turn_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        } else {
            b.failed += 1;
        }
    }
    b.sandbox_s = start.elapsed().as_secs_f64();
    remove(c, &id);
    b
}
