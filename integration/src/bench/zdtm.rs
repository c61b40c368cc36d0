//! `belayer-bench zdtm`: CRIU's ZDTM static suite through Belayer. Every test built by
//! `scripts/setup` runs in a plain container (control); those that pass there run again and are
//! checkpointed + SIGKILLed + restored in place, forked, recovered after a crash with automatic
//! checkpoints, and — the baseline — checkpointed and restored by containerd's own
//! `ctr c checkpoint --rw --task` / `ctr c restore --rw --live` under runc. Prints per mode
//! tried / control-passed / passed / failed with the failing tests and why; writes results.json.

use std::fmt::Write;
use std::time::Instant;

use serde_json::json;

use crate::bench::Common;
use crate::bench::record::Record;
use crate::zdtm::{Harness, Mode, Outcome, Suite, tally};
use crate::{Containerd, Flavor};

/// `belayer-bench zdtm`: needs root, containerd 2.x, runc, CRIU and the ZDTM tests built by
/// scripts/setup.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Only these tests, comma-separated [default: every built test zdtm.py runs for the ns
    /// flavour]
    #[arg(long, value_delimiter = ',')]
    pub tests: Option<Vec<String>>,
    /// Of restore, fork, auto, containerd, comma-separated [default: all; control always runs]
    #[arg(long, value_delimiter = ',', value_parser = mode)]
    pub modes: Vec<Mode>,
    /// Tests run side by side
    #[arg(long, default_value_t = 2)]
    pub jobs: usize,
    /// The tests CRIU's own harness passes on this machine, one per line
    /// (`scripts/zdtm-criu-harness OUT` writes `OUT/passed.txt`): each mode is also reported
    /// against those of them that pass in control, the set issue 28 holds Belayer to
    #[arg(long, value_name = "FILE")]
    pub required: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub common: Common,
}

fn mode(s: &str) -> Result<Mode, String> {
    Mode::parse(s).ok_or(format!("unknown mode {s:?}"))
}

impl Args {
    fn modes(&self) -> Vec<Mode> {
        if self.modes.is_empty() {
            vec![Mode::Restore, Mode::Fork, Mode::Auto, Mode::Containerd]
        } else {
            self.modes.clone()
        }
    }
}

/// Runs the suite; fails only when nothing could be tried (it measures).
pub fn run(args: &Args) -> Result<bool, String> {
    let modes = args.modes();
    let suite = Suite::try_load().map_err(|e| format!("{e}: run scripts/setup"))?;
    let tests: Vec<_> = match &args.tests {
        None => suite.tests.clone(),
        Some(names) => names
            .iter()
            .map(|n| {
                suite
                    .tests
                    .iter()
                    .find(|t| &t.name == n)
                    .cloned()
                    .ok_or(format!("no ZDTM test {n} here"))
            })
            .collect::<Result<_, _>>()?,
    };
    // The whole run (about 35 minutes) tests one build, whatever is built meanwhile.
    let bins = crate::bench::snapshot_bins(&["containerd-shim-belayer-v1", "belayer"])?;
    let required = match &args.required {
        Some(p) => Some(read_required(p)?),
        None => None,
    };
    let rec = Record::start("zdtm", &args.common.out("zdtm"))?;
    eprintln!(
        "zdtm: {} tests ({} built tests not tried), modes {:?}, {} jobs",
        tests.len(),
        suite.not_tried.len(),
        modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        args.jobs
    );
    let c = Containerd::start(Flavor::V2);
    let h = Harness::new(&c, &suite);
    let start = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let reports = h.run_all(&tests, &modes, args.jobs, &|r| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let line: Vec<String> = r
            .outcomes
            .iter()
            .map(|(m, o)| format!("{}={}", m.name(), if o.passed() { "PASS" } else { "FAIL" }))
            .collect();
        eprintln!(
            "[{n}/{}] {} {:.1}s {}",
            tests.len(),
            r.test,
            r.secs,
            line.join(" ")
        );
    });
    let wall = start.elapsed().as_secs_f64();
    let tallies = tally(&reports, &modes);

    let mut table = String::new();
    let _ = writeln!(table, "| mode | tried | control passed | passed | failed |");
    let _ = writeln!(table, "| --- | --- | --- | --- | --- |");
    for t in &tallies {
        let _ = writeln!(
            table,
            "| {} | {} | {} | {} | {} |",
            t.mode.name(),
            t.tried,
            t.control_passed,
            t.passed,
            t.failed.len()
        );
    }
    let held = required.as_ref().map(|r| held_to(&reports, &modes, r));
    if let (Some(held), Some(path)) = (&held, &args.required) {
        let _ = writeln!(
            table,
            "\nHeld to the {} tests that pass in control and under CRIU's own harness ({}):\n",
            held.required.len(),
            path.display()
        );
        let _ = writeln!(table, "| mode | required | passed | failed |");
        let _ = writeln!(table, "| --- | --- | --- | --- |");
        for (mode, failed) in &held.failed {
            let _ = writeln!(
                table,
                "| {} | {} | {} | {} |",
                mode.name(),
                held.required.len(),
                held.required.len() - failed.len(),
                if failed.is_empty() {
                    "none".to_string()
                } else {
                    failed.join(", ")
                }
            );
        }
        if !held.not_in_harness.is_empty() {
            let _ = writeln!(
                table,
                "\nPass in control but not under CRIU's harness (not held to): {}",
                held.not_in_harness.join(", ")
            );
        }
    }
    for t in tallies.iter().filter(|t| t.mode != Mode::Control) {
        if t.failed.is_empty() {
            continue;
        }
        let _ = writeln!(table, "\n{} failed ({}):", t.mode.name(), t.failed.len());
        for (name, why) in &t.failed {
            let _ = writeln!(table, "  {name}: {}", truncate(why, 400));
        }
    }
    let results = json!({
        "criu_src": crate::zdtm::criu_src(),
        "wall_s": wall,
        "modes": tallies.iter().map(|t| json!({
            "mode": t.mode.name(),
            "tried": t.tried,
            "control_passed": t.control_passed,
            "passed": t.passed,
            "failed": t.failed.iter().map(|(n, w)| json!({"test": n, "why": w})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "tests": reports.iter().map(|r| json!({
            "test": r.test,
            "secs": r.secs,
            "criu_opts": suite.tests.iter().find(|t| t.name == r.test).map(|t| t.criu_opts.clone()),
            "outcomes": r.outcomes.iter().map(|(m, o)| (m.name().to_string(), match o {
                Outcome::Pass => json!("PASS"),
                Outcome::Fail(why) => json!(why),
            })).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "required": held.as_ref().map(|h| json!({
            "file": args.required.as_ref().map(|p| p.display().to_string()),
            "tests": h.required,
            "failed": h.failed.iter().map(|(m, f)| (m.name().to_string(), json!(f))).collect::<serde_json::Map<_, _>>(),
            "not_in_harness": h.not_in_harness,
        })),
        "not_tried": suite.not_tried.iter().map(|n| json!({"test": n.name, "why": n.why})).collect::<Vec<_>>(),
    });
    let summary = json!({ "modes": results["modes"].as_array().map(|m| m.iter().map(|m| json!({
        "mode": m["mode"], "tried": m["tried"], "control_passed": m["control_passed"], "passed": m["passed"],
    })).collect::<Vec<_>>()) });
    rec.report(&table, results, None, summary)?;
    drop(bins);
    // The benchmark measures; it fails only when nothing could be tried.
    Ok(tallies.first().is_some_and(|t| t.control_passed > 0))
}

/// The test names of `path`, one per line (blank lines and `#` comments skipped).
fn read_required(path: &std::path::Path) -> Result<std::collections::BTreeSet<String>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--required {}: {e}", path.display()))?;
    let names: std::collections::BTreeSet<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    if names.is_empty() {
        return Err(format!("--required {}: no test named", path.display()));
    }
    Ok(names)
}

/// The modes' results on the tests a run is held to.
struct Held {
    /// Tests that pass in control and under CRIU's harness.
    required: Vec<String>,
    /// Per mode (control left out), the required tests it failed.
    failed: Vec<(Mode, Vec<String>)>,
    /// Tests that pass in control that CRIU's harness does not pass.
    not_in_harness: Vec<String>,
}

fn held_to(
    reports: &[crate::zdtm::Report],
    modes: &[Mode],
    harness: &std::collections::BTreeSet<String>,
) -> Held {
    let (required, not): (Vec<&crate::zdtm::Report>, Vec<&crate::zdtm::Report>) = reports
        .iter()
        .filter(|r| r.outcomes.get(&Mode::Control).is_some_and(Outcome::passed))
        .partition(|r| harness.contains(&r.test));
    let failed = modes
        .iter()
        .filter(|m| **m != Mode::Control)
        .map(|m| {
            let f: Vec<String> = required
                .iter()
                .filter(|r| !r.outcomes.get(m).is_some_and(Outcome::passed))
                .map(|r| r.test.clone())
                .collect();
            (*m, f)
        })
        .collect();
    Held {
        required: required.iter().map(|r| r.test.clone()).collect(),
        failed,
        not_in_harness: not.iter().map(|r| r.test.clone()).collect(),
    }
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
