//! Action boundaries found from a container's cgroup counters, for sandboxes whose actions never
//! pass through `exec` (OpenHands V1's agent-server, SWE-ReX's server: the agent loop runs its
//! tools in its own processes). CPU time and block I/O busy → an action runs; both quiet for
//! `settle_ms` → the action ended, backdated to when the quiet began. The boundaries feed
//! [`NodeScheduler::on_exec_start`](crate::NodeScheduler::on_exec_start) /
//! [`on_exec_exit`](crate::NodeScheduler::on_exec_exit) as execs would, so the gap model learns
//! the model's generation gaps with no hint and no framework change.
//!
//! Pure logic like the rest of the crate: the caller reads the counters (cgroup v1
//! `cpuacct.usage` and `blkio.throttle.io_service_bytes`, v2 `cpu.stat usage_usec` and
//! `io.stat`) and passes them with the time.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Thresholds of [`ActivityDetector`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ActivityConfig {
    /// CPU use above this fraction of one core between two samples is activity.
    pub cpu_busy_frac: f64,
    /// Block I/O above this many bytes per second between two samples is activity.
    pub io_busy_bytes_per_s: f64,
    /// Quiet for this long ends an action (shorter lulls belong to the action).
    pub settle_ms: u64,
}

impl Default for ActivityConfig {
    fn default() -> Self {
        // An idle agent-server answering the client's status poll once a second uses ~1 % of a
        // core; a tool or the agent loop's own work uses tens of percent.
        Self {
            cpu_busy_frac: 0.05,
            io_busy_bytes_per_s: 1024.0 * 1024.0,
            settle_ms: 300,
        }
    }
}

/// Cumulative counters of one container's cgroup at time `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActivitySample {
    /// The caller's monotonic clock (the scheduler's time base).
    pub t: Duration,
    /// CPU time used by the cgroup so far.
    pub cpu: Duration,
    /// Block I/O bytes read and written by the cgroup so far.
    pub io_bytes: u64,
}

/// A boundary between an action and an idle gap, at the time it is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Boundary {
    /// Activity began (report it as an exec start).
    ActionStart(Duration),
    /// Activity ended at this time, quiet since (report it as an exec exit).
    ActionEnd(Duration),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No sample yet.
    Unknown,
    Busy,
    /// Quiet since the time held, not yet for `settle_ms`.
    Settling(Duration),
    Idle,
}

/// Per-container detector: feed it samples in time order; it returns the boundaries, which
/// alternate `ActionStart`, `ActionEnd`, … starting with `ActionStart` at the first sample (a
/// container's start is activity).
#[derive(Debug, Clone)]
pub struct ActivityDetector {
    cfg: ActivityConfig,
    last: Option<ActivitySample>,
    state: State,
}

impl ActivityDetector {
    pub fn new(cfg: ActivityConfig) -> Self {
        Self {
            cfg,
            last: None,
            state: State::Unknown,
        }
    }

    /// Whether the container is in an idle gap now (quiet for at least `settle_ms`).
    pub fn idle(&self) -> bool {
        self.state == State::Idle
    }

    /// The next sample. A sample not later than the previous one, or with counters that went
    /// back (a restored container's new cgroup), only becomes the new baseline.
    pub fn observe(&mut self, s: ActivitySample) -> Option<Boundary> {
        let Some(prev) = self.last.replace(s) else {
            self.state = State::Busy;
            return Some(Boundary::ActionStart(s.t));
        };
        if s.t <= prev.t || s.cpu < prev.cpu || s.io_bytes < prev.io_bytes {
            return None;
        }
        let dt = (s.t - prev.t).as_secs_f64();
        let cpu_frac = (s.cpu - prev.cpu).as_secs_f64() / dt;
        let io_rate = (s.io_bytes - prev.io_bytes) as f64 / dt;
        let busy = cpu_frac > self.cfg.cpu_busy_frac || io_rate > self.cfg.io_busy_bytes_per_s;
        let settle = Duration::from_millis(self.cfg.settle_ms);
        let (state, boundary) = match (self.state, busy) {
            (State::Unknown | State::Busy, true) => (State::Busy, None),
            (State::Unknown | State::Busy, false) if s.t - prev.t >= settle => {
                (State::Idle, Some(Boundary::ActionEnd(prev.t)))
            }
            (State::Unknown | State::Busy, false) => (State::Settling(prev.t), None),
            (State::Settling(_), true) => (State::Busy, None),
            (State::Settling(since), false) if s.t - since >= settle => {
                (State::Idle, Some(Boundary::ActionEnd(since)))
            }
            (State::Settling(since), false) => (State::Settling(since), None),
            (State::Idle, true) => (State::Busy, Some(Boundary::ActionStart(prev.t))),
            (State::Idle, false) => (State::Idle, None),
        };
        self.state = state;
        boundary
    }

    /// Takes `s` as the new baseline without judging the interval before it: call it after a
    /// checkpoint or restore of the container, whose work (CRIU's parasite runs inside the
    /// container's tasks) is not the agent's.
    pub fn rebase(&mut self, s: ActivitySample) {
        self.last = Some(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Decision, NodeScheduler, SchedulerConfig};
    use proptest::prelude::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Samples every 100 ms of a container whose CPU runs at `load(t_ms)` of a core.
    fn feed(d: &mut ActivityDetector, until_ms: u64, load: impl Fn(u64) -> f64) -> Vec<Boundary> {
        let mut cpu = 0.0;
        let mut out = Vec::new();
        for step in 0..=until_ms / 100 {
            let t = step * 100;
            if step > 0 {
                cpu += load(t) * 0.1;
            }
            let s = ActivitySample {
                t: ms(t),
                cpu: Duration::from_secs_f64(cpu),
                io_bytes: 0,
            };
            out.extend(d.observe(s));
        }
        out
    }

    #[test]
    fn a_turn_is_start_then_end_backdated_to_the_quiet() {
        let mut d = ActivityDetector::new(ActivityConfig::default());
        // Busy 0–1 s (boot), quiet 1–4 s (the model), busy 4–5 s (a tool), quiet after.
        let load = |t: u64| match t {
            0..=1000 => 0.8,
            4100..=5000 => 0.5,
            _ => 0.01,
        };
        let b = feed(&mut d, 7000, load);
        assert_eq!(
            b,
            vec![
                Boundary::ActionStart(ms(0)),
                Boundary::ActionEnd(ms(1000)),
                Boundary::ActionStart(ms(4000)),
                Boundary::ActionEnd(ms(5000)),
            ]
        );
        assert!(d.idle());
    }

    #[test]
    fn short_lulls_and_background_polls_are_no_boundary() {
        let mut d = ActivityDetector::new(ActivityConfig::default());
        // A 200 ms lull inside an action; a 10 ms poll every second while idle (1 % of a core
        // averaged over 1 s, 10 % in its own 100 ms window would count: keep polls below 5 %).
        let load = |t: u64| match t {
            0..=1000 => 0.9,
            1100..=1200 => 0.0,
            1300..=2000 => 0.9,
            t if t % 1000 == 0 => 0.04,
            _ => 0.0,
        };
        let b = feed(&mut d, 6000, load);
        assert_eq!(
            b,
            vec![Boundary::ActionStart(ms(0)), Boundary::ActionEnd(ms(2000))]
        );
    }

    #[test]
    fn io_counts_and_counters_going_back_only_rebase() {
        let mut d = ActivityDetector::new(ActivityConfig::default());
        let s = |t, cpu_ms, io| ActivitySample {
            t: ms(t),
            cpu: ms(cpu_ms),
            io_bytes: io,
        };
        assert_eq!(d.observe(s(0, 0, 0)), Some(Boundary::ActionStart(ms(0))));
        assert_eq!(d.observe(s(500, 0, 0)), Some(Boundary::ActionEnd(ms(0))));
        // 10 MB written in 100 ms with no CPU to speak of: activity.
        assert_eq!(
            d.observe(s(600, 1, 10_000_000)),
            Some(Boundary::ActionStart(ms(500)))
        );
        // A restored container's fresh cgroup: counters back to 0, no verdict.
        assert_eq!(d.observe(s(700, 0, 0)), None);
        d.rebase(s(800, 0, 0));
        assert_eq!(d.observe(s(1200, 0, 0)), Some(Boundary::ActionEnd(ms(800))));
    }

    /// Wired as the shim would: boundaries are exec starts and exits; the scheduler checkpoints
    /// inside a long quiet gap, and not during activity.
    #[test]
    fn boundaries_drive_the_scheduler_into_the_gaps() {
        let mut node = NodeScheduler::new(SchedulerConfig::default()).unwrap();
        let mut d = ActivityDetector::new(ActivityConfig::default());
        let id = "sandbox";
        let mut checkpoints = Vec::new();
        let mut cpu = 0.0;
        // Turns of 0.5 s tool work and 6 s of model generation.
        let busy = |t: u64| t % 6500 < 500;
        for step in 0..=400u64 {
            let t = step * 100;
            if step > 0 && busy(t) {
                cpu += 0.08;
            }
            let s = ActivitySample {
                t: ms(t),
                cpu: Duration::from_secs_f64(cpu),
                io_bytes: 0,
            };
            match d.observe(s) {
                Some(Boundary::ActionStart(at)) => node.on_exec_start(id, at),
                Some(Boundary::ActionEnd(at)) => {
                    node.on_exec_exit(id, at);
                    if let dec @ (Decision::CheckpointNow | Decision::Force) =
                        node.decide(id, ms(t))
                    {
                        checkpoints.push((t, dec));
                        let cost = crate::CheckpointCost {
                            footprint: crate::Footprint::default(),
                            seconds: 0.8,
                        };
                        node.on_checkpoint_done(id, cost).unwrap();
                        d.rebase(s);
                    }
                }
                None => {}
            }
        }
        assert!(checkpoints.len() >= 5, "{checkpoints:?}");
        for (t, _) in &checkpoints {
            assert!(!busy(*t), "checkpoint at {t} ms falls into activity");
        }
    }

    proptest! {
        /// Whatever the load, boundaries alternate start/end, start first, times never decrease,
        /// and each is no later than the sample that revealed it.
        #[test]
        fn boundaries_alternate_and_are_monotone(loads in proptest::collection::vec(0.0f64..1.0, 1..200)) {
            let mut d = ActivityDetector::new(ActivityConfig::default());
            let b = feed(&mut d, (loads.len() as u64 - 1) * 100, |t| loads[(t / 100) as usize]);
            let mut last = Duration::ZERO;
            for (i, x) in b.iter().enumerate() {
                let (start, at) = match x {
                    Boundary::ActionStart(at) => (true, *at),
                    Boundary::ActionEnd(at) => (false, *at),
                };
                prop_assert_eq!(start, i % 2 == 0);
                prop_assert!(at >= last);
                last = at;
            }
        }
    }
}
