//! `belayer-bench rollout`: concurrent sandboxes run multi-turn episodes against the reference
//! rollout worker while sandbox inits and the worker are SIGKILLed on a seeded schedule; three
//! runs (baseline, with Belayer, without). Writes results.json, table.md and plot.svg; the last
//! stdout line is one JSON object. Exits 1 when Belayer lost a trajectory or a final state differs.

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;

use belayer_integration::bench::rollout::args::{self, Args, Parsed};
use belayer_integration::bench::rollout::{self, Mode, faults, report};
use belayer_integration::{Containerd, Flavor, prereq};
use serde_json::json;

fn main() -> ExitCode {
    let parsed = args::parse(std::env::args().skip(1)).map(|p| match p {
        Parsed::Run(a) => Some(a),
        Parsed::Help => None,
    });
    // The target dir is shared with builds that replace these binaries while the benchmark
    // runs: run a private snapshot of them.
    let snapshot = || {
        let dir = snapshot_bins()?;
        // SAFETY: still single-threaded, nothing reads the environment concurrently.
        unsafe { std::env::set_var("BELAYER_BIN_DIR", dir) };
        Ok(())
    };
    belayer_integration::bench::run_main(
        "belayer-bench-rollout",
        args::USAGE,
        parsed,
        snapshot,
        bench,
    )
}

const BINS: [&str; 4] = [
    "containerd-shim-belayer-v1",
    "belayer",
    "belayer-gpu-broker",
    "belayer-worker",
];

/// Hard-links (or copies) the binaries under test into a private directory.
fn snapshot_bins() -> Result<PathBuf, String> {
    let from = prereq::bin_dir();
    let to = from.join(format!(".bench-rollout-{}", std::process::id()));
    std::fs::create_dir_all(&to).map_err(|e| format!("create {}: {e}", to.display()))?;
    for b in BINS {
        let (src, dst) = (from.join(b), to.join(b));
        if !src.is_file() {
            return Err(format!(
                "{} is missing: build the workspace (cargo build --release --workspace --bins)",
                src.display()
            ));
        }
        let _ = std::fs::remove_file(&dst);
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(|e| format!("copy {}: {e}", src.display()))?;
        }
    }
    Ok(to)
}

fn sh(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn bench(args: &Args) -> Result<bool, String> {
    let started = Instant::now();
    let bin_dir = prereq::bin_dir();
    let model = gpu_broker::worker::model_path();
    if !model.is_file() {
        return Err(format!(
            "model file {} is missing: run gpu-broker/scripts/fetch-model",
            model.display()
        ));
    }
    let context = json!({
        "git_head": sh("git rev-parse --short HEAD 2>/dev/null"),
        "load_average_at_start": sh("cut -d' ' -f1-3 /proc/loadavg"),
        "cpus": std::thread::available_parallelism().map_or(1, usize::from),
        "model": model.display().to_string(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
    });
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("create {}: {e}", args.out.display()))?;
    let sched = faults::schedule(
        args.seed,
        args.sandboxes,
        args.turns,
        args.sandbox_kills,
        args.worker_kills,
    );
    eprintln!(
        "belayer-bench rollout: {} sandboxes x {} turns, {} new tokens a turn, seed {}; schedule {}",
        args.sandboxes,
        args.turns,
        args.max_new,
        args.seed,
        serde_json::to_string(&sched).unwrap_or_default()
    );
    let c = Containerd::start(Flavor::V2);
    c.import(&prereq::image("sandbox.tar"));
    let work = PathBuf::from(format!("/tmp/belayer-bench-rollout-{}", std::process::id()));
    let mut runs = Vec::new();
    for mode in [Mode::Baseline, Mode::Belayer, Mode::Plain] {
        let r = rollout::run(&c, &bin_dir, args, mode, &sched, &work)?;
        eprintln!(
            "  {}: {}/{} completed, {:.1} s",
            r.label,
            r.completed(),
            r.trajectories.len(),
            r.wall_s
        );
        runs.push(r);
    }
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&bin_dir);
    let table = report::table(&runs);
    let summary = report::summary(&runs);
    let reproduce = format!(
        "sudo belayer-bench rollout --sandboxes {} --turns {} --seed {} --sandbox-kills {} --worker-kills {} --max-new {} --out DIR",
        args.sandboxes, args.turns, args.seed, args.sandbox_kills, args.worker_kills, args.max_new
    );
    let title = format!(
        "belayer-bench rollout: {} sandboxes x {} turns, {} sandbox + {} worker kills (seed {})",
        args.sandboxes, args.turns, args.sandbox_kills, args.worker_kills, args.seed
    );
    let results = json!({
        "args": { "sandboxes": args.sandboxes, "turns": args.turns, "seed": args.seed,
                  "sandbox_kills": args.sandbox_kills, "worker_kills": args.worker_kills, "max_new": args.max_new },
        "schedule": sched, "context": context, "summary": summary, "runs": runs,
        "reproduce": reproduce, "bench_seconds": started.elapsed().as_secs_f64(),
    });
    let write = |name: &str, data: String| {
        let p = args.out.join(name);
        std::fs::write(&p, data).map_err(|e| format!("write {}: {e}", p.display()))
    };
    write(
        "results.json",
        serde_json::to_string_pretty(&results).unwrap_or_default(),
    )?;
    write("table.md", table.clone())?;
    write("plot.svg", report::plot(&runs, &title))?;
    println!(
        "{title}\n\n{table}\nreproduce: {reproduce}\nfiles: {}/{{results.json,table.md,plot.svg}}",
        args.out.display()
    );
    println!("{}", json!({ "rollout": summary }));
    let belayer = runs.iter().find(|r| r.mode == Mode::Belayer);
    Ok(belayer.is_some_and(|r| r.lost() == 0))
}
