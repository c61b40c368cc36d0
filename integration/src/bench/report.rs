//! What a benchmark run reports: the Markdown table, results.json and the one-line summary.

use serde_json::{Map, Value, json};

use crate::bench::check::Checks;
use crate::bench::stats::Samples;

/// The timed measurements, in table order: key, label.
pub const MEASURES: &[(&str, &str)] = &[
    (
        "replay",
        "replay: fresh runc container, `ctr run` → last action done",
    ),
    (
        "episode_belayer",
        "the same episode under the Belayer runtime (failure-free)",
    ),
    (
        "containerd_checkpoint",
        "containerd: `ctr c checkpoint --rw --task` (runc)",
    ),
    (
        "containerd_restore",
        "containerd: `ctr c restore --rw --live` → task running",
    ),
    (
        "podman_checkpoint",
        "podman: `container checkpoint --export` (stops it)",
    ),
    (
        "podman_restore",
        "podman: `container restore --import` → running",
    ),
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
        "Belayer: `belayer restore` in place after SIGKILL → running",
    ),
    (
        "belayer_restore_live",
        "Belayer: `belayer restore` of a live container → running",
    ),
    (
        "belayer_restore_shim",
        "Belayer: restore of a live container via the control API",
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
        "belayer_fork8",
        "Belayer: `belayer fork --count 8` → all 8 running",
    ),
];

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
        key: "restore_vs_replay",
        num: "replay",
        den: "belayer_restore",
        label: "Belayer restore vs replay (× faster)",
        target: Some(("≥", 10.0)),
    },
    Ratio {
        key: "restore_vs_containerd",
        num: "containerd_restore",
        den: "belayer_restore",
        label: "Belayer restore vs containerd's restore (× faster)",
        target: Some(("≥", 3.0)),
    },
    Ratio {
        key: "restore_vs_podman",
        num: "podman_restore",
        den: "belayer_restore",
        label: "Belayer restore vs podman's restore (× faster)",
        target: None,
    },
    Ratio {
        key: "fork8_vs_restore",
        num: "belayer_fork8",
        den: "belayer_restore",
        label: "fork of 8 vs one Belayer restore (× the time)",
        target: Some(("<", 2.0)),
    },
    Ratio {
        key: "episode_overhead",
        num: "episode_belayer",
        den: "replay",
        label: "episode under Belayer vs under runc (× the time)",
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
    t.push_str("\n| system | check (Belayer's gate the exit status) | passed | first failure |\n|---|---|---:|---|\n");
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
        "targets_met": met,
        "checks": checks.0.len(),
        "checks_failed": checks.failed(),
        "baseline_findings": checks.0.iter().filter(|c| !c.gating() && !c.ok).count(),
        "podman": podman,
    })
}

/// Everything: the summary, every sample, every check, and what was run where.
pub fn results(
    s: &Samples,
    checks: &Checks,
    podman: &str,
    context: Value,
    belayer: Vec<Value>,
) -> Value {
    let mut v = summary(s, checks, podman);
    v["context"] = context;
    v["samples"] = json!(s.0);
    v["belayer_checkpoints"] = json!(belayer);
    v["checks_detail"] = checks
        .0
        .iter()
        .map(|c| json!({ "system": c.system, "run": c.run, "target": c.target, "what": c.what, "ok": c.ok, "detail": c.detail }))
        .collect();
    v
}
