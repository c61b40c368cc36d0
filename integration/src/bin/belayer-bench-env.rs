//! `belayer-bench env`: environment recovery on the reference episode — replay in a fresh
//! container vs containerd's and podman's checkpoint/restore vs Belayer's checkpoint, restore and
//! forks of 1, 2, 4 and 8 (with the CPU they take), every restore checked. Writes results.json,
//! table.md and plot.svg; the last stdout line is one JSON object with the medians and ratios.
//! Exits non-zero when a check fails.

use std::process::{Command, ExitCode};
use std::time::Instant;

use belayer_integration::bench::args::{self, Args, Parsed};
use belayer_integration::bench::check::Checks;
use belayer_integration::bench::podman::{self, Podman};
use belayer_integration::bench::stats::Samples;
use belayer_integration::bench::{belayer, ctrd, report, svg};
use belayer_integration::episode::{self, SANDBOX};
use belayer_integration::{Containerd, Flavor, prereq};
use serde_json::{Value, json};

fn main() -> ExitCode {
    let parsed = args::parse(std::env::args().skip(1)).map(|p| match p {
        Parsed::Run(a) => Some(a),
        Parsed::Help => None,
    });
    belayer_integration::bench::run_main("belayer-bench-env", args::USAGE, parsed, || Ok(()), bench)
}

/// Runs every measurement `args.runs` times and reports; `Ok(false)` when a check failed.
fn bench(args: &Args) -> Result<bool, String> {
    let started = Instant::now();
    // Read before measuring: the tree (and its git HEAD) may move while the benchmark runs.
    let mut context = context(args);
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("create {}: {e}", args.out.display()))?;
    eprintln!(
        "belayer-bench env: {} runs, holder {} MB",
        args.runs, args.holder_mb
    );
    let actions = episode::actions(args.holder_mb);
    let c = Containerd::start(Flavor::V2);
    c.import(&prereq::image("sandbox.tar"));
    let (pd, mut podman_status) = match (args.podman, podman::installed()) {
        (false, _) => (None, "skipped (--no-podman)".to_string()),
        (true, false) => (None, "not installed, skipped".to_string()),
        (true, true) => match Podman::start() {
            Ok(p) => (Some(p), "ok".to_string()),
            Err(e) => (None, format!("failed to start: {e}")),
        },
    };
    if pd.is_none() {
        eprintln!("podman: {podman_status}");
    }
    let (mut samples, mut checks, mut belayer_info) =
        (Samples::default(), Checks::default(), Vec::new());
    for run in 1..=args.runs {
        eprintln!("run {run}/{}", args.runs);
        ctrd::replay(&c, run, &actions, &mut samples);
        ctrd::containerd_own(&c, run, &actions, &mut samples, &mut checks);
        if let Some(p) = pd.as_ref().filter(|_| podman_status == "ok")
            && let Err(e) = p.measure(run, &actions, &mut samples, &mut checks)
        {
            eprintln!("podman: {e}");
            podman_status = format!("failed: {e}");
        }
        belayer_info.push(belayer::measure(
            &c,
            run,
            &actions,
            &mut samples,
            &mut checks,
        ));
    }
    let podman_version = pd.as_ref().map(Podman::version);
    drop(pd);
    drop(c);

    context["podman"] = json!(podman_version);
    context["wall_s"] = json!(started.elapsed().as_secs_f64());
    let table = report::table(&samples, &checks, &podman_status, args.runs);
    let reproduce = format!("sudo {}", context["command"].as_str().unwrap_or_default());
    let results = report::results(&samples, &checks, &podman_status, context, belayer_info);
    let title = format!(
        "Belayer env recovery, holder {} MB, {} runs",
        args.holder_mb, args.runs
    );
    let md = format!("{table}\nReproduce: `{reproduce}` (podman: {podman_status})\n");
    write(args, "table.md", &md)?;
    write(
        args,
        "results.json",
        &serde_json::to_string_pretty(&results).unwrap_or_default(),
    )?;
    write(args, "plot.svg", &svg::plot(&samples, &title))?;

    println!("{table}");
    println!("Reproduce: {reproduce}");
    println!("podman: {podman_status}");
    println!(
        "Wrote {}/{{results.json,table.md,plot.svg}}; the benchmark took {:.0} s.",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    if checks.failed() > 0 {
        println!(
            "{} of Belayer's correctness checks FAILED (see the table, stderr and results.json)",
            checks.failed()
        );
    }
    let mut summary = report::summary(&samples, &checks, &podman_status);
    summary["wall_s"] = json!(started.elapsed().as_secs_f64().round());
    println!("{summary}");
    Ok(checks.failed() == 0)
}

fn write(args: &Args, name: &str, text: &str) -> Result<(), String> {
    let path = args.out.join(name);
    std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))
}

/// The first line `program args` prints, or why not.
fn version(program: &str, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(o) => String::from_utf8_lossy(if o.stdout.is_empty() {
            &o.stderr
        } else {
            &o.stdout
        })
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string(),
        Err(e) => format!("{program}: {e}"),
    }
}

/// What ran where, and the command that reproduces it.
fn context(args: &Args) -> Value {
    // /proc/self/exe reads "… (deleted)" once a rebuild replaced the file.
    let exe = std::env::current_exe()
        .map(|e| {
            e.display()
                .to_string()
                .trim_end_matches(" (deleted)")
                .to_string()
        })
        .unwrap_or_default();
    let bin_dir = std::env::var("BELAYER_BIN_DIR").unwrap_or_default();
    let command = format!(
        "BELAYER_BIN_DIR={bin_dir} {exe} --runs {} --holder-mb {} --out {}{}",
        args.runs,
        args.holder_mb,
        args.out.display(),
        if args.podman { "" } else { " --no-podman" }
    );
    let repo = env!("CARGO_MANIFEST_DIR");
    let dirty = !version(
        "git",
        &["-C", repo, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_empty();
    let git = version("git", &["-C", repo, "rev-parse", "--short", "HEAD"])
        + if dirty { "+dirty" } else { "" };
    json!({
        "command": command,
        "runs": args.runs,
        "holder_mb": args.holder_mb,
        "forks": belayer::FORK_COUNTS,
        "image": SANDBOX,
        "kernel": version("uname", &["-r"]),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "containerd": version("containerd", &["--version"]),
        "runc": version("runc", &["--version"]),
        "criu": version("criu", &["--version"]),
        "git": git,
        "bin_dir": bin_dir,
    })
}
