//! `belayer-bench SUITE [ARGS…]`: Belayer's benchmarks (`belayer_integration::bench`). Each
//! suite prints its table, writes results.json (and table.md, plot.svg) to `--out`, and prints
//! one JSON object as its last line. A suite not built in here runs as `belayer-bench-SUITE`,
//! found beside this binary or on PATH, git-style.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

use belayer_integration::bench::{
    auto, chaos, env, gateway, rollout, run_main, sched, worker, zdtm,
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "belayer-bench", about = "Belayer's benchmarks", version)]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
}

#[derive(Subcommand)]
enum Suite {
    /// Environment checkpoint/restore/fork vs replay, containerd and podman (root)
    Env(env::Args),
    /// Automatic checkpoints' cost to an agent episode, against runc-v2 (root)
    Auto(auto::Args),
    /// LLM gateway: latency added per request, hints to a real shim (root)
    Gateway(gateway::Args),
    /// End-to-end rollout with injected failures: Belayer vs replay vs none (root)
    Rollout(rollout::args::Args),
    /// Rollout worker: cold start + re-prefill vs shadow takeover + KV rebuild
    Worker(worker::Args),
    /// Checkpoint-scheduling simulator: policy vs every-k, never
    Sched(sched::args::Args),
    /// Seeded fault-injection soak: faults survived, trajectories lost, recovery (root)
    Chaos(chaos::Args),
    /// CRIU's ZDTM static suite: restore, fork, auto recovery vs containerd's (root)
    Zdtm(zdtm::Args),
    /// A suite installed as its own binary, belayer-bench-SUITE
    #[command(external_subcommand)]
    External(Vec<OsString>),
}

fn find(name: &str) -> Option<PathBuf> {
    let beside = std::env::current_exe().ok()?.with_file_name(name);
    if beside.is_file() {
        return Some(beside);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

fn external(args: Vec<OsString>) -> ExitCode {
    let suite = args[0].to_string_lossy().into_owned();
    let name = format!("belayer-bench-{suite}");
    let Some(bin) = find(&name) else {
        eprintln!(
            "belayer-bench: unknown suite {suite:?}: neither built in nor {name} beside this binary or on PATH (see --help)"
        );
        return ExitCode::from(2);
    };
    let err = Command::new(&bin).args(&args[1..]).exec();
    eprintln!("belayer-bench: cannot run {}: {err}", bin.display());
    ExitCode::from(2)
}

fn main() -> ExitCode {
    match Cli::parse().suite {
        Suite::Env(a) => run_main("env", true, || env::run(&a)),
        Suite::Auto(a) => run_main("auto", true, || auto::run(&a)),
        Suite::Gateway(a) => run_main("gateway", true, || gateway::run(&a)),
        Suite::Rollout(a) => run_main("rollout", true, || rollout::suite::main(&a)),
        Suite::Worker(a) => run_main("worker", false, || worker::run(&a)),
        Suite::Sched(a) => run_main("sched", false, || sched::run(&a)),
        Suite::Chaos(a) => run_main("chaos", true, || chaos::run(&a)),
        Suite::Zdtm(a) => run_main("zdtm", true, || zdtm::run(&a)),
        Suite::External(args) => external(args),
    }
}
