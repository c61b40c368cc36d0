//! `belayer-bench SUITE [ARGS…]`: one entry point for Belayer's benchmarks.
//!
//! Each suite is its own binary, `belayer-bench-SUITE`, built by the crate that owns the thing it
//! measures (`scheduler` → `sched`, `gpu-broker` → `worker`, `integration` → `env`, `rollout`,
//! `gateway`, `zdtm`).
//! This dispatcher finds it beside itself or on PATH and hands over the arguments, git-style, so a
//! crate's benchmark builds and runs without linking every other crate.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

const SUITES: &[(&str, &str)] = &[
    (
        "env",
        "environment checkpoint/restore/fork vs replay, containerd and podman",
    ),
    (
        "chaos",
        "seeded fault-injection soak: faults survived, trajectories lost, recovery",
    ),
    (
        "sched",
        "checkpoint-scheduling simulator: policy vs every-turn, every-k, never",
    ),
    (
        "worker",
        "GPU broker: rollout-worker cold start vs shadow takeover and KV rebuild",
    ),
    ("rollout", "end-to-end rollout with injected failures"),
    (
        "gateway",
        "LLM gateway: latency added per request, hints to a real shim",
    ),
    (
        "zdtm",
        "CRIU's ZDTM static suite: restore, fork, auto recovery vs containerd's",
    ),
];

fn usage() -> String {
    let mut s = String::from("usage: belayer-bench SUITE [ARGS…]\n\nsuites:\n");
    for (name, what) in SUITES {
        s.push_str(&format!("  {name:<8} {what}\n"));
    }
    s
}

fn find(suite: &str) -> Option<PathBuf> {
    let name = format!("belayer-bench-{suite}");
    let beside = std::env::current_exe().ok()?.with_file_name(&name);
    if beside.is_file() {
        return Some(beside);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(&name))
            .find(|p| p.is_file())
    })
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(suite) = args.next() else {
        eprint!("{}", usage());
        return ExitCode::from(2);
    };
    if suite == "-h" || suite == "--help" {
        print!("{}", usage());
        return ExitCode::SUCCESS;
    }
    if !SUITES.iter().any(|(name, _)| *name == suite) {
        eprintln!("belayer-bench: unknown suite {suite:?}\n{}", usage());
        return ExitCode::from(2);
    }
    let Some(bin) = find(&suite) else {
        eprintln!(
            "belayer-bench: belayer-bench-{suite} is not installed beside this binary or on PATH (run scripts/setup)"
        );
        return ExitCode::from(2);
    };
    let err = Command::new(&bin).args(args).exec();
    eprintln!("belayer-bench: cannot run {}: {err}", bin.display());
    ExitCode::from(2)
}
