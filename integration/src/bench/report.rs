//! What a benchmark run reports: the Markdown table, results.json and the one-line summary.

use serde_json::{Map, Value, json};

use crate::bench::belayer::{FORK_COUNTS, FORKS, fork_key};
use crate::bench::check::Checks;
use crate::bench::plot::{self, Bar};
use crate::bench::stats::{Samples, round3};

/// The timed measurements, in table order: key, label. "memory intact": the restored holder
/// answered with the digest of all its memory (every page touched). "eager": Belayer with the
/// baselines' restore settings (memory read first, CRIU's default iptables network lock).
pub const MEASURES: &[(&str, &str)] = &[
    (
        "replay",
        "replay: fresh runc container, `ctr run` → last action done",
    ),
    (
        "belayer_episode",
        "the same episode under the Belayer runtime (failure-free)",
    ),
    (
        "belayer_digest_live",
        "reference: the holder's memory digest asked of a live container (no restore; part of every → memory intact)",
    ),
    (
        "containerd_checkpoint",
        "containerd: `ctr c checkpoint --rw --task` (runc)",
    ),
    (
        "containerd_restore",
        "containerd: `ctr c restore --rw --live` into a new container → running",
    ),
    ("containerd_restore_memory", "… → memory intact"),
    (
        "podman_checkpoint_local",
        "podman: `container checkpoint` (local, stops it)",
    ),
    (
        "podman_restore_local",
        "podman: `container restore` (local) → running",
    ),
    ("podman_restore_local_memory", "… → memory intact"),
    (
        "podman_checkpoint",
        "podman: `container checkpoint --export` (stops it)",
    ),
    (
        "podman_restore",
        "podman: `container restore --import` into a new container → running",
    ),
    ("podman_restore_memory", "… → memory intact"),
    (
        "belayer_checkpoint",
        "Belayer: `belayer checkpoint` (CLI wall, leaves it running)",
    ),
    (
        "belayer_frozen",
        "Belayer: container frozen during that checkpoint (manifest)",
    ),
    (
        "belayer_restore",
        "Belayer (lazy, nftables): restore in place after SIGKILL → running",
    ),
    ("belayer_restore_memory", "… → memory intact"),
    (
        "belayer_restore_live",
        "Belayer (lazy, nftables): restore of a live container → running",
    ),
    ("belayer_restore_live_memory", "… → memory intact"),
    (
        "belayer_restore_shim",
        "Belayer: `belayer restore --json` of a live container (CLI wall)",
    ),
    (
        "belayer_restore_verify",
        "… of which integrity check (shim's `verify_ms`)",
    ),
    (
        "belayer_restore_mount",
        "… of which rootfs mount (shim's `mount_ms`)",
    ),
    (
        "belayer_restore_criu",
        "… of which CRIU restore (shim's `restore_ms`)",
    ),
    (
        "belayer_fork1",
        "Belayer (lazy, nftables): `belayer fork --count 1` (a new container) → running",
    ),
    ("belayer_fork1_memory", "… → memory intact"),
    (
        "belayer_fork2",
        "Belayer: `belayer fork --count 2` → both running",
    ),
    (
        "belayer_fork4",
        "Belayer: `belayer fork --count 4` → all 4 running",
    ),
    (
        "belayer_fork8",
        "Belayer: `belayer fork --count 8` → all 8 running",
    ),
    ("belayer_fork8_memory", "… → all 8 memories intact"),
    (
        "belayer_eager_checkpoint",
        "Belayer (eager, iptables): `belayer checkpoint`",
    ),
    (
        "belayer_eager_restore",
        "Belayer (eager, iptables): restore in place after SIGKILL → running",
    ),
    ("belayer_eager_restore_memory", "… → memory intact"),
    (
        "belayer_eager_fork1",
        "Belayer (eager, iptables): `belayer fork --count 1` (a new container) → running",
    ),
    ("belayer_eager_fork1_memory", "… → memory intact"),
];

/// How the fork scales with its count: per count, the medians of its wall time and of the
/// machine's busy CPU time over it (steal apart), that time against one restore, and the CPU per
/// fork.
pub fn fork_scaling(s: &Samples) -> Vec<Value> {
    let restore = s.median("belayer_restore");
    FORK_COUNTS
        .iter()
        .filter_map(|&n| {
            let key = fork_key("belayer", n);
            let wall = s.median(&key)?;
            let cpu = s.median(&format!("{key}_cpu"));
            Some(json!({
                "forks": n,
                "wall_s": round3(wall),
                "x_restore": restore.map(|r| round3(wall / r)),
                "busy_cpu_s": cpu.map(round3),
                "steal_s": s.median(&format!("{key}_steal")).map(round3),
                "cpu_per_fork_s": cpu.map(|c| round3(c / f64::from(n))),
            }))
        })
        .collect()
}

/// The fewest cores on which the fork of [`FORKS`] could finish within 2× one restore, if its
/// CPU time spread perfectly over them: a lower bound from the medians, not a measurement.
pub fn fork_cores_needed(s: &Samples) -> Option<f64> {
    let cpu = s.median(&format!("{}_cpu", fork_key("belayer", FORKS)))?;
    Some((cpu / (2.0 * s.median("belayer_restore")?)).ceil())
}

/// A ratio of two medians: key, numerator, denominator, label, target (`≥` or `<` a bound).
pub struct Ratio {
    pub key: &'static str,
    pub num: &'static str,
    pub den: &'static str,
    pub label: &'static str,
    pub target: Option<(&'static str, f64)>,
}

pub const RATIOS: &[Ratio] = &[
    Ratio {
        key: "like_for_like_memory",
        num: "containerd_restore_memory",
        den: "belayer_eager_fork1_memory",
        label: "like for like, to memory intact: containerd restore into a new container ÷ Belayer fork of 1 (eager, iptables)",
        target: Some(("≥", 3.0)),
    },
    Ratio {
        key: "like_for_like_running",
        num: "containerd_restore",
        den: "belayer_eager_fork1",
        label: "like for like, to running: containerd restore into a new container ÷ Belayer fork of 1 (eager, iptables)",
        target: None,
    },
    Ratio {
        key: "fork1_vs_containerd_memory",
        num: "containerd_restore_memory",
        den: "belayer_fork1_memory",
        label: "containerd restore into a new container ÷ Belayer fork of 1 with its defaults (lazy, nftables), to memory intact",
        target: None,
    },
    Ratio {
        key: "in_place_vs_containerd_memory",
        num: "containerd_restore_memory",
        den: "belayer_restore_memory",
        label: "containerd restore into a new container ÷ Belayer restore in place (lazy, nftables), to memory intact",
        target: None,
    },
    Ratio {
        key: "podman_local_vs_fork1_memory",
        num: "podman_restore_local_memory",
        den: "belayer_eager_fork1_memory",
        label: "podman local restore ÷ Belayer fork of 1 (eager, iptables), to memory intact",
        target: None,
    },
    Ratio {
        key: "podman_import_vs_fork1_memory",
        num: "podman_restore_memory",
        den: "belayer_eager_fork1_memory",
        label: "podman restore --import ÷ Belayer fork of 1 (eager, iptables), to memory intact",
        target: None,
    },
    Ratio {
        key: "restore_vs_replay_memory",
        num: "replay",
        den: "belayer_restore_memory",
        label: "replay in a fresh container ÷ Belayer restore in place (lazy, nftables), to memory intact",
        target: Some(("≥", 10.0)),
    },
    Ratio {
        key: "eager_vs_lazy_restore_memory",
        num: "belayer_eager_restore_memory",
        den: "belayer_restore_memory",
        label: "Belayer restore in place, eager + iptables ÷ lazy + nftables, to memory intact",
        target: None,
    },
    Ratio {
        key: "fork8_vs_restore",
        num: "belayer_fork8",
        den: "belayer_restore",
        label: "Belayer fork of 8 ÷ one restore in place, to running (× the time)",
        target: Some(("<", 2.0)),
    },
    Ratio {
        key: "fork8_vs_restore_memory",
        num: "belayer_fork8_memory",
        den: "belayer_restore_memory",
        label: "Belayer fork of 8 ÷ one restore in place, to memory intact (× the time)",
        target: None,
    },
    Ratio {
        key: "episode_overhead",
        num: "belayer_episode",
        den: "replay",
        label: "episode under Belayer ÷ under runc (× the time)",
        target: None,
    },
];

impl Ratio {
    pub fn value(&self, s: &Samples) -> Option<f64> {
        Some(s.median(self.num)? / s.median(self.den)?)
    }

    /// Whether the target is met; `None` without a target or a value.
    pub fn met(&self, s: &Samples) -> Option<bool> {
        let (op, bound) = self.target?;
        let v = self.value(s)?;
        Some(if op == "≥" { v >= bound } else { v < bound })
    }
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.3}"))
}

/// The Markdown report: medians with every sample, then the ratios against their targets.
pub fn table(s: &Samples, checks: &Checks, podman: &str, runs: u32) -> String {
    let mut t =
        format!("| measurement ({runs} runs) | median (s) | samples (s) |\n|---|---:|---|\n");
    for (key, label) in MEASURES {
        let samples = s
            .get(key)
            .iter()
            .map(|v| format!("{v:.3}"))
            .collect::<Vec<_>>()
            .join(", ");
        let samples = if samples.is_empty() && key.starts_with("podman") {
            format!("podman: {podman}")
        } else {
            samples
        };
        t.push_str(&format!(
            "| {label} | {} | {samples} |\n",
            secs(s.median(key))
        ));
    }
    t.push_str("\n| ratio (of medians) | value | target | met |\n|---|---:|---|---|\n");
    for r in RATIOS {
        let value = r
            .value(s)
            .map_or_else(|| "—".into(), |v| format!("{v:.2}×"));
        let target = r
            .target
            .map_or_else(|| "—".into(), |(op, b)| format!("{op} {b}×"));
        let met = match r.met(s) {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        t.push_str(&format!("| {} | {value} | {target} | {met} |\n", r.label));
    }
    let scaling = fork_scaling(s);
    if !scaling.is_empty() {
        let cell = |v: &Value, k: &str| {
            v[k].as_f64()
                .map_or_else(|| "—".into(), |x| format!("{x:.3}"))
        };
        let row = |label: &str, k: &str| {
            let cells: Vec<String> = scaling.iter().map(|v| cell(v, k)).collect();
            format!("| {label} | {} |\n", cells.join(" | "))
        };
        let counts: Vec<String> = scaling.iter().map(|v| v["forks"].to_string()).collect();
        t.push_str(&format!(
            "\n| forks (medians) | {} |\n|---|{}\n",
            counts.join(" | "),
            "---:|".repeat(counts.len())
        ));
        t.push_str(&row("`belayer fork` → all running (s)", "wall_s"));
        t.push_str(&row("× one restore", "x_restore"));
        t.push_str(&row("busy CPU of the machine, all cores (s)", "busy_cpu_s"));
        t.push_str(&row("busy CPU per fork (s)", "cpu_per_fork_s"));
        t.push_str(&row("stolen by the hypervisor, all cores (s)", "steal_s"));
        if let Some(cores) = fork_cores_needed(s) {
            t.push_str(&format!(
                "\nAt this CPU time, a fork of {FORKS} fits in 2× one restore only on {cores:.0} or more \
                 cores (its busy CPU ÷ 2 restores; a lower bound that assumes perfect parallelism). \
                 This machine has {}.\n",
                std::thread::available_parallelism().map_or(0, |n| n.get())
            ));
        }
    }
    t.push_str("\n| system | check (all gate the exit status but loopback, a finding) | passed | first failure |\n|---|---|---:|---|\n");
    for (system, what, passed, total, failure) in checks.summary() {
        let failure = failure.map_or_else(String::new, |f| f.replace('|', "/"));
        t.push_str(&format!(
            "| {system} | {what} | {passed}/{total} | {failure} |\n"
        ));
    }
    t
}

/// Medians and ratios: the last stdout line and the head of results.json.
pub fn summary(s: &Samples, checks: &Checks, podman: &str) -> Value {
    let mut medians = Map::new();
    for (key, _) in MEASURES {
        if let Some(m) = s.median(key) {
            medians.insert(format!("{key}_s"), json!((m * 1000.0).round() / 1000.0));
        }
    }
    let mut ratios = Map::new();
    let mut met = Map::new();
    for r in RATIOS {
        if let Some(v) = r.value(s) {
            ratios.insert(r.key.into(), json!((v * 100.0).round() / 100.0));
        }
        if let Some(m) = r.met(s) {
            met.insert(r.key.into(), json!(m));
        }
    }
    json!({
        "bench": "env",
        "medians": medians,
        "ratios": ratios,
        "fork_scaling": fork_scaling(s),
        "fork8_cores_needed": fork_cores_needed(s),
        "targets_met": met,
        "checks": checks.0.len(),
        "checks_failed": checks.failed(),
        "findings": checks.0.iter().filter(|c| !c.gating() && !c.ok).count(),
        "podman": podman,
    })
}

/// Everything: the summary, every sample, every check, and what was run where.
pub fn results(s: &Samples, checks: &Checks, podman: &str, belayer: Vec<Value>) -> Value {
    let mut v = summary(s, checks, podman);
    v["samples"] = json!(s.0);
    v["belayer_checkpoints"] = json!(belayer);
    v["checks_detail"] = checks
        .0
        .iter()
        .map(|c| json!({ "system": c.system, "run": c.run, "target": c.target, "what": c.what, "ok": c.ok, "detail": c.detail }))
        .collect();
    v
}

fn colour(key: &str) -> &'static str {
    match key.split('_').next() {
        Some("replay") => "#888888",
        Some("containerd") => "#3b6fb6",
        Some("podman") => "#8e5bb5",
        _ => "#2e9e5b",
    }
}

/// The bar plot of every measurement that has samples.
pub fn plot(s: &Samples, title: &str) -> String {
    let rows: Vec<Bar> = MEASURES
        .iter()
        .filter_map(|(key, label)| {
            Some(Bar {
                label: label.to_string(),
                value: s.median(key)?,
                samples: s.get(key).to_vec(),
                colour: colour(key),
            })
        })
        .collect();
    plot::bars(title, "s", &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_scaling_from_medians() {
        let mut s = Samples::default();
        s.push("belayer_restore", 0.2);
        for (n, wall, cpu) in [(1, 0.2, 0.25), (2, 0.25, 0.4), (8, 1.0, 2.0)] {
            s.push(&fork_key("belayer", n), wall);
            s.push(&format!("{}_cpu", fork_key("belayer", n)), cpu);
        }
        s.push(&format!("{}_steal", fork_key("belayer", 8)), 0.1);
        let rows = fork_scaling(&s);
        // The fork of 4 has no samples: no row for it.
        let counts: Vec<u64> = rows.iter().map(|r| r["forks"].as_u64().unwrap()).collect();
        assert_eq!(counts, [1, 2, 8]);
        assert_eq!(rows[2]["x_restore"], 5.0);
        assert_eq!(rows[2]["cpu_per_fork_s"], 0.25);
        assert_eq!(rows[2]["steal_s"], 0.1);
        assert!(rows[0]["steal_s"].is_null());
        // 2 s of CPU in 2 × 0.2 s: at least 5 cores.
        assert_eq!(fork_cores_needed(&s), Some(5.0));
        let t = table(&s, &Checks::default(), "", 1);
        assert!(t.contains("| forks (medians) | 1 | 2 | 8 |"), "{t}");
        assert!(t.contains("only on 5 or more cores"), "{t}");
        let svg = plot(&s, "a < b");
        assert!(svg.contains("a &lt; b") && !svg.contains("podman"));
    }
}
