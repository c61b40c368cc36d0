//! The shadow vLLM's memory, read from `/proc/PID/smaps_rollup` and `/proc/PID/smaps`: what it
//! holds of its own and how much of it is the broker's weights, mapped rather than copied.

use gpu_broker::vllm::Group;
use serde::Serialize;

/// The name of the broker's weights memfd as it appears in a mapping.
const WEIGHTS: &str = "memfd:belayer-weights";

/// Memory over a vLLM's processes (API server, engine core, worker), in MiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Memory {
    pub rss_mib: f64,
    pub pss_mib: f64,
    /// RSS of the broker's weights mapped (shared with the primary, not copied).
    pub weights_shared_mib: f64,
}

impl Memory {
    /// Sums the group's processes; a process that cannot be read counts 0.
    pub fn of(g: &Group) -> Self {
        let mut pids = vec![g.child.id() as i32];
        if let Some((engine, worker)) = g.engine_and_worker() {
            pids.extend([engine, worker]);
        }
        let read = |p: i32, file: &str| {
            std::fs::read_to_string(format!("/proc/{p}/{file}")).unwrap_or_default()
        };
        let (mut rss, mut pss, mut weights) = (0, 0, 0);
        for p in pids {
            let (r, s) = rollup_kib(&read(p, "smaps_rollup"));
            rss += r;
            pss += s;
            weights += weights_kib(&read(p, "smaps"));
        }
        let mib = |kib: u64| kib as f64 / 1024.0;
        Self {
            rss_mib: mib(rss),
            pss_mib: mib(pss),
            weights_shared_mib: mib(weights),
        }
    }
}

/// The kB figure of a `Key:   N kB` line.
fn kib(line: &str) -> u64 {
    line.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// (Rss, Pss) in KiB of an `smaps_rollup`.
fn rollup_kib(text: &str) -> (u64, u64) {
    let field = |key: &str| text.lines().filter(|l| l.starts_with(key)).map(kib).sum();
    (field("Rss:"), field("Pss:"))
}

/// Rss in KiB of the mappings of the broker's weights in an `smaps`.
fn weights_kib(text: &str) -> u64 {
    let mut in_weights = false;
    let mut sum = 0;
    for l in text.lines() {
        let first = l.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            in_weights = l.contains(WEIGHTS);
        } else if in_weights && first == "Rss:" {
            sum += kib(l);
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rollup_and_weight_mappings() {
        let rollup = "00400000-7fff0000 ---p 00000000 00:00 0 [rollup]\nRss:  2048 kB\nPss:  1024 kB\nPss_Anon:  10 kB\n";
        assert_eq!(rollup_kib(rollup), (2048, 1024));
        let smaps = "7f00-7f10 r--s 00000000 00:01 5 /memfd:belayer-weights (deleted)\nSize: 64 kB\nRss:  48 kB\n\
                     7f20-7f30 rw-p 00000000 00:00 0\nRss:  16 kB\n\
                     7f40-7f50 r--s 00000000 00:01 5 /memfd:belayer-weights (deleted)\nRss:  8 kB\n";
        assert_eq!(weights_kib(smaps), 56);
    }
}
