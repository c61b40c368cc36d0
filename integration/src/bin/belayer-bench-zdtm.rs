//! `belayer-bench zdtm`: CRIU's ZDTM static suite through Belayer. Every test built by
//! `scripts/setup` runs in a plain container (control); those that pass there run again and are
//! checkpointed + SIGKILLed + restored in place, forked, recovered after a crash with automatic
//! checkpoints, and — the baseline — checkpointed and restored by containerd's own
//! `ctr c checkpoint --rw --task` / `ctr c restore --rw --live` under runc. Prints per mode
//! tried / control-passed / passed / failed with the failing tests and why; writes results.json.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use belayer_integration::zdtm::{Harness, Mode, Outcome, Suite, tally};
use belayer_integration::{Containerd, Flavor};
use serde_json::json;

const USAGE: &str = "usage: belayer-bench zdtm [--tests A,B,…] [--modes M,…] [--jobs N] [--out DIR]\n\n  \
    --tests A,B   only these tests (default: every built test zdtm.py runs for the ns flavour)\n  \
    --modes M,…   of restore, fork, auto, containerd (default: all; control always runs)\n  \
    --jobs N      tests run side by side (default 2)\n  \
    --out DIR     where results.json goes (default bench-results/zdtm)";

struct Args {
    tests: Option<Vec<String>>,
    modes: Vec<Mode>,
    jobs: usize,
    out: PathBuf,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut a = Args {
        tests: None,
        modes: vec![Mode::Restore, Mode::Fork, Mode::Auto, Mode::Containerd],
        jobs: 2,
        out: PathBuf::from("bench-results/zdtm"),
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--tests" => a.tests = Some(value()?.split(',').map(str::to_string).collect()),
            "--modes" => {
                a.modes = value()?
                    .split(',')
                    .map(|m| Mode::parse(m).ok_or(format!("--modes: unknown mode {m:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--jobs" => {
                let v = value()?;
                a.jobs = v
                    .parse()
                    .map_err(|_| format!("--jobs: {v:?} is no count"))?
            }
            "--out" => a.out = PathBuf::from(value()?),
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    Ok(Some(a))
}

fn main() -> ExitCode {
    let parsed = parse(std::env::args().skip(1));
    belayer_integration::bench::run_main("belayer-bench-zdtm", USAGE, parsed, || Ok(()), bench)
}

fn bench(args: &Args) -> Result<bool, String> {
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
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    eprintln!(
        "zdtm: {} tests ({} built tests not tried), modes {:?}, {} jobs",
        tests.len(),
        suite.not_tried.len(),
        args.modes.iter().map(|m| m.name()).collect::<Vec<_>>(),
        args.jobs
    );
    let c = Containerd::start(Flavor::V2);
    let h = Harness::new(&c, &suite);
    let start = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let reports = h.run_all(&tests, &args.modes, args.jobs, &|r| {
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
    let tallies = tally(&reports, &args.modes);

    let mut reproduce = String::from("sudo target/release/belayer-bench zdtm");
    if let Some(t) = &args.tests {
        reproduce += &format!(" --tests {}", t.join(","));
    }
    reproduce += &format!(
        " --modes {} --jobs {} --out {}",
        args.modes
            .iter()
            .map(|m| m.name())
            .collect::<Vec<_>>()
            .join(","),
        args.jobs,
        args.out.display()
    );
    println!("| mode | tried | control passed | passed | failed |");
    println!("| --- | --- | --- | --- | --- |");
    for t in &tallies {
        println!(
            "| {} | {} | {} | {} | {} |",
            t.mode.name(),
            t.tried,
            t.control_passed,
            t.passed,
            t.failed.len()
        );
    }
    for t in tallies.iter().filter(|t| t.mode != Mode::Control) {
        if t.failed.is_empty() {
            continue;
        }
        println!("\n{} failed ({}):", t.mode.name(), t.failed.len());
        for (name, why) in &t.failed {
            println!("  {name}: {}", truncate(why, 400));
        }
    }
    println!("\n{:.0} s; reproduce: {reproduce}", wall);

    let results = json!({
        "suite": "zdtm",
        "criu_src": belayer_integration::zdtm::criu_src(),
        "wall_s": wall,
        "reproduce": reproduce,
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
        "not_tried": suite.not_tried.iter().map(|n| json!({"test": n.name, "why": n.why})).collect::<Vec<_>>(),
    });
    let path = args.out.join("results.json");
    std::fs::write(
        &path,
        serde_json::to_vec_pretty(&results).unwrap_or_default(),
    )
    .map_err(|e| format!("write {}: {e}", path.display()))?;
    println!("{}", path.display());
    // The benchmark measures; it fails only when nothing could be tried.
    Ok(tallies.first().is_some_and(|t| t.control_passed > 0))
}

fn truncate(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}
