//! The soak's figures: faults per kind and outcome, trajectories completed and lost, recovery
//! latency and checkpoint frozen time percentiles, the machine's load; a table and one JSON line.

use std::collections::BTreeMap;
use std::time::Duration;

use std::fmt::Write;

use serde_json::json;

use super::trajectory::Outcome as Trajectory;
use super::{Config, Event, Journal, Kind, Outcome};

/// Per fault kind: how many were injected and what came of them.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub survived: usize,
    pub violated: usize,
    pub lost: usize,
    pub missed: usize,
}

impl Tally {
    pub fn injected(&self) -> usize {
        self.survived + self.violated + self.lost
    }
}

pub struct Report {
    pub seed: u64,
    pub command: String,
    pub sandboxes: usize,
    pub wall: Duration,
    pub per_kind: BTreeMap<Kind, Tally>,
    pub trajectories: Vec<Trajectory>,
    pub events: Vec<Event>,
    pub recovery_ms: Vec<u64>,
    /// `worker-kill`: the primary's kill → the shadow generating again, ms.
    pub worker_takeover_ms: Vec<u64>,
    pub frozen_ms: Vec<f64>,
    pub violations: Vec<String>,
    pub leaks: Vec<String>,
    /// Store checks over the retention bound, and by how many checkpoints at most.
    pub over_retention: (usize, usize),
    /// The first of those checks in detail.
    pub over_retention_seen: Vec<String>,
    pub load: (f64, f64),
    pub cpu: Option<(f64, f64)>,
    /// Each fault-free turn's exec under Belayer, ms.
    pub turn_ms: Vec<f64>,
    /// The same trajectories under runc-v2 without faults, when asked for.
    pub baseline: Option<super::baseline::Baseline>,
}

/// The `p`-th percentile (nearest rank) of `xs`: the benchmarks' own.
pub use crate::bench::stats::percentile;

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cfg: &Config,
        wall: Duration,
        trajectories: Vec<Trajectory>,
        journal: Journal,
        leaks: Vec<String>,
        load_before: f64,
        load_after: f64,
        cpu: Option<(f64, f64)>,
    ) -> Self {
        let mut per_kind: BTreeMap<Kind, Tally> = cfg
            .schedule
            .kinds
            .iter()
            .map(|k| (*k, Tally::default()))
            .collect();
        for e in &journal.events {
            let t = per_kind.entry(e.kind).or_default();
            match e.outcome {
                Outcome::Survived => t.survived += 1,
                Outcome::Violated => t.violated += 1,
                Outcome::Lost => t.lost += 1,
                Outcome::Missed => t.missed += 1,
            }
        }
        let mut violations = journal.violations;
        for e in &journal.events {
            if e.outcome == Outcome::Violated {
                violations.push(format!(
                    "{} turn {} {}: {}",
                    e.sandbox,
                    e.turn,
                    e.kind.name(),
                    e.detail
                ));
            }
        }
        Self {
            seed: cfg.seed,
            command: cfg.command.clone(),
            sandboxes: cfg.sandboxes,
            wall,
            per_kind,
            trajectories,
            events: journal.events,
            recovery_ms: journal.recovery_ms,
            worker_takeover_ms: journal.worker_takeover_ms,
            frozen_ms: journal
                .frozen_us
                .values()
                .map(|us| *us as f64 / 1000.0)
                .collect(),
            violations,
            leaks,
            over_retention: (
                journal.over_retention.len(),
                journal.over_retention.iter().copied().max().unwrap_or(0),
            ),
            over_retention_seen: journal.over_retention_seen,
            load: (load_before, load_after),
            cpu,
            turn_ms: journal.turn_ms,
            baseline: None,
        }
    }

    pub fn injected(&self) -> usize {
        self.per_kind.values().map(Tally::injected).sum()
    }

    pub fn lost(&self) -> Vec<&Trajectory> {
        self.trajectories
            .iter()
            .filter(|t| t.lost.is_some())
            .collect()
    }

    /// Nothing lost, no invariant failed, nothing leaked.
    pub fn passed(&self) -> bool {
        self.lost().is_empty() && self.violations.is_empty() && self.leaks.is_empty()
    }

    fn recovery(&self, p: f64) -> Option<f64> {
        let xs: Vec<f64> = self.recovery_ms.iter().map(|v| *v as f64).collect();
        percentile(&xs, p)
    }

    fn worker_takeover(&self, p: f64) -> Option<f64> {
        let xs: Vec<f64> = self.worker_takeover_ms.iter().map(|v| *v as f64).collect();
        percentile(&xs, p)
    }

    pub fn json(&self) -> serde_json::Value {
        let kinds: serde_json::Map<String, serde_json::Value> = self
            .per_kind
            .iter()
            .map(|(k, t)| {
                (
                    k.name().to_string(),
                    json!({"injected": t.injected(), "survived": t.survived,
                           "violated": t.violated, "lost": t.lost, "missed": t.missed}),
                )
            })
            .collect();
        json!({
            "bench": "chaos",
            "seed": self.seed,
            "command": self.command,
            "sandboxes": self.sandboxes,
            "wall_s": self.wall.as_secs_f64(),
            "faults_injected": self.injected(),
            "faults": kinds,
            "trajectories": {
                "completed": self.trajectories.len() - self.lost().len(),
                "lost": self.lost().len(),
                "turns_executed": self.trajectories.iter().map(|t| t.executed).sum::<u64>(),
                "rewinds": self.trajectories.iter().map(|t| t.rewinds).sum::<u64>(),
            },
            "recovery_ms": {"n": self.recovery_ms.len(), "p50": self.recovery(50.0), "p99": self.recovery(99.0)},
            "worker_takeover_ms": {"n": self.worker_takeover_ms.len(),
                                   "p50": self.worker_takeover(50.0), "p99": self.worker_takeover(99.0)},
            "frozen_ms": {"n": self.frozen_ms.len(), "p50": percentile(&self.frozen_ms, 50.0),
                          "p99": percentile(&self.frozen_ms, 99.0)},
            "over_retention": {"checks": self.over_retention.0, "max_excess": self.over_retention.1,
                               "first": self.over_retention_seen},
            "violations": self.violations,
            "leaks": self.leaks,
            "loadavg_1m": {"start": self.load.0, "end": self.load.1},
            "machine_cpu_s": self.cpu.map(|(busy, steal)| json!({"busy": busy, "stolen": steal})),
            "overhead": self.overhead(),
            "passed": self.passed(),
        })
    }

    /// Turns per sandbox-minute under Belayer (every turn executed, re-executions after rewinds
    /// included, over the run's wall time).
    fn belayer_turns_per_min(&self) -> f64 {
        let turns: u64 = self.trajectories.iter().map(|t| t.executed).sum();
        turns as f64 / (self.sandboxes as f64 * self.wall.as_secs_f64() / 60.0)
    }

    /// The overhead figure against runc-v2 (null without a baseline).
    fn overhead(&self) -> serde_json::Value {
        let Some(b) = &self.baseline else {
            return serde_json::Value::Null;
        };
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        let runc_per_min = b.turns as f64 / (b.sandbox_s / 60.0).max(f64::MIN_POSITIVE);
        json!({
            "belayer": {"runtime": "io.containerd.belayer.v1", "faults": self.injected(),
                        "turns": self.turn_ms.len(),
                        "turn_ms_p50": percentile(&self.turn_ms, 50.0),
                        "turn_ms_p99": percentile(&self.turn_ms, 99.0),
                        "turns_per_sandbox_min": self.belayer_turns_per_min()},
            "runc": {"runtime": "io.containerd.runc.v2", "faults": 0, "turns": b.turns,
                     "failed": b.failed,
                     "turn_ms_p50": percentile(&b.turn_ms, 50.0),
                     "turn_ms_p99": percentile(&b.turn_ms, 99.0),
                     "turns_per_sandbox_min": runc_per_min},
            "turn_ms_p50_ratio": ratio(percentile(&self.turn_ms, 50.0), percentile(&b.turn_ms, 50.0)),
            "turn_ms_p99_ratio": ratio(percentile(&self.turn_ms, 99.0), percentile(&b.turn_ms, 99.0)),
            "turns_per_min_ratio": self.belayer_turns_per_min() / runc_per_min,
        })
    }

    /// The table, the failures with how to reproduce them, and the JSON line last.
    pub fn print(&self) {
        println!("{}", self.table());
        println!("{}", self.json());
    }

    /// The table: faults per kind, trajectories, latencies, the retention checks, the load, the
    /// overhead against runc-v2 when measured, then every loss, violation and leak, and how to
    /// reproduce the run when it failed.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "chaos: {} sandboxes, {:.0} s, seed {} — reproduce: {}",
            self.sandboxes,
            self.wall.as_secs_f64(),
            self.seed,
            self.command
        );
        let _ = writeln!(
            t,
            "\n| fault | injected | survived | violated | lost | missed |\n|---|---:|---:|---:|---:|---:|"
        );
        for (k, n) in &self.per_kind {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {} | {} |",
                k.name(),
                n.injected(),
                n.survived,
                n.violated,
                n.lost,
                n.missed
            );
        }
        let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.0}"));
        let _ = writeln!(
            t,
            "\ntrajectories: {} completed, {} lost; {} turns executed, {} rewinds checked",
            self.trajectories.len() - self.lost().len(),
            self.lost().len(),
            self.trajectories.iter().map(|t| t.executed).sum::<u64>(),
            self.trajectories.iter().map(|t| t.rewinds).sum::<u64>()
        );
        let _ = writeln!(
            t,
            "recovery (kill → next action works): p50 {} ms, p99 {} ms (n={})",
            fmt(self.recovery(50.0)),
            fmt(self.recovery(99.0)),
            self.recovery_ms.len()
        );
        if !self.worker_takeover_ms.is_empty() {
            let _ = writeln!(
                t,
                "rollout worker takeover (primary killed → shadow generating again): p50 {} ms, \
                 p99 {} ms (n={})",
                fmt(self.worker_takeover(50.0)),
                fmt(self.worker_takeover(99.0)),
                self.worker_takeover_ms.len()
            );
        }
        let _ = writeln!(
            t,
            "checkpoint frozen time: p50 {} ms, p99 {} ms (n={} checkpoints seen)",
            fmt(percentile(&self.frozen_ms, 50.0)),
            fmt(percentile(&self.frozen_ms, 99.0)),
            self.frozen_ms.len()
        );
        let _ = writeln!(
            t,
            "store checks over the retention bound: {} (at most {} checkpoints over)",
            self.over_retention.0, self.over_retention.1
        );
        for seen in &self.over_retention_seen {
            let _ = writeln!(t, "  {seen}");
        }
        let _ = writeln!(
            t,
            "load average (1 min): {:.1} at start, {:.1} at end",
            self.load.0, self.load.1
        );
        if let Some(b) = &self.baseline {
            let o = self.overhead();
            let f = |v: &serde_json::Value| v.as_f64().map_or("-".into(), |v| format!("{v:.2}"));
            let _ = writeln!(
                t,
                "overhead: a fault-free turn's exec p50 {} ms / p99 {} ms under Belayer with {} \
                 faults (io.containerd.belayer.v1, automatic checkpoints and recovery) vs p50 {} \
                 ms / p99 {} ms under runc-v2 without faults: ×{} / ×{}; turns per \
                 sandbox-minute {} vs {} (×{}, rewinds' re-executions included); runc-v2 turns \
                 failed: {}",
                fmt(percentile(&self.turn_ms, 50.0)),
                fmt(percentile(&self.turn_ms, 99.0)),
                self.injected(),
                fmt(percentile(&b.turn_ms, 50.0)),
                fmt(percentile(&b.turn_ms, 99.0)),
                f(&o["turn_ms_p50_ratio"]),
                f(&o["turn_ms_p99_ratio"]),
                f(&o["belayer"]["turns_per_sandbox_min"]),
                f(&o["runc"]["turns_per_sandbox_min"]),
                f(&o["turns_per_min_ratio"]),
                b.failed
            );
        }
        for l in self.lost() {
            let _ = writeln!(
                t,
                "LOST {} at turn {}: {}",
                if l.name == l.id {
                    l.name.clone()
                } else {
                    format!("{} = {}", l.name, l.id)
                },
                l.turns,
                l.lost.as_deref().unwrap_or_default()
            );
        }
        for v in &self.violations {
            let _ = writeln!(t, "VIOLATION {v}");
        }
        for l in &self.leaks {
            let _ = writeln!(t, "LEAK {l}");
        }
        if !self.passed() {
            let _ = writeln!(t, "reproduce: {}", self.command);
        }
        t
    }

    /// The plot: recovery latency and checkpoint frozen time under the faults (every sample a
    /// dot), and with a baseline a fault-free turn's exec on both sides.
    pub fn plot(&self) -> String {
        use crate::bench::plot::{Bar, COLOURS, bars};
        let row = |label: String, samples: Vec<f64>, colour: &'static str| Bar {
            value: percentile(&samples, 50.0).unwrap_or(0.0),
            label,
            samples,
            colour,
        };
        let mut rows = vec![
            row(
                format!(
                    "recovery, kill → next action works (n={})",
                    self.recovery_ms.len()
                ),
                self.recovery_ms.iter().map(|v| *v as f64).collect(),
                COLOURS[3],
            ),
            row(
                format!("checkpoint frozen time (n={})", self.frozen_ms.len()),
                self.frozen_ms.clone(),
                COLOURS[0],
            ),
        ];
        if let Some(b) = &self.baseline {
            rows.push(row(
                format!("turn exec, Belayer with {} faults", self.injected()),
                self.turn_ms.clone(),
                COLOURS[1],
            ));
            rows.push(row(
                "turn exec, runc-v2 without faults".into(),
                b.turn_ms.clone(),
                COLOURS[2],
            ));
        }
        bars(
            &format!(
                "chaos: {} sandboxes, {} faults, seed {}",
                self.sandboxes,
                self.injected(),
                self.seed
            ),
            "ms",
            &rows,
        )
    }

    /// Every event, one a line (for a post-mortem).
    pub fn print_events(&self) {
        for e in &self.events {
            println!(
                "{:>7.1}s {} turn {} {} {:?}: {}",
                e.at_s,
                e.sandbox,
                e.turn,
                e.kind.name(),
                e.outcome,
                e.detail
            );
        }
    }
}
