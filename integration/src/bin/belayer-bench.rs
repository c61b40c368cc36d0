//! `belayer-bench SUITE [ARGS…]`: Belayer's benchmarks (`belayer_integration::bench`). Each
//! suite prints its table, writes results.json (and table.md, plot.svg) to `--out`, and prints
//! one JSON object as its last line.

use std::process::ExitCode;

use belayer_api::report::chain;
use belayer_integration::bench::{
    auto, chaos, env, gateway, openhands, push, rollout, run_main, sched, vllm, worker, zdtm,
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
    /// Unchanged vLLM losing its worker: shadow takeover through the broker vs a cold restart
    Vllm(vllm::Args),
    /// Checkpoint-scheduling simulator: policy vs every-k, never
    Sched(sched::args::Args),
    /// Seeded fault-injection soak: faults survived, trajectories lost, recovery (root)
    Chaos(chaos::Args),
    /// CRIU's ZDTM static suite: restore, fork, auto recovery vs containerd's (root)
    Zdtm(zdtm::Args),
    /// Checkpoints through a registry to another node, replication lag, vs `ctr` (root)
    Push(push::Args),
    /// OpenHands conversation: runc vs Belayer auto, checkpoint and restore by phase (root)
    Openhands(openhands::Args),
}

fn main() -> ExitCode {
    match Cli::parse().suite {
        Suite::Env(a) => run_main("env", true, || env::run(&a)),
        Suite::Auto(a) => run_main("auto", true, || auto::run(&a)),
        Suite::Gateway(a) => run_main("gateway", true, || gateway::run(&a)),
        Suite::Rollout(a) => run_main("rollout", true, || rollout::suite::main(&a)),
        Suite::Worker(a) => run_main("worker", false, || worker::run(&a)),
        Suite::Vllm(a) => run_main("vllm", false, || vllm::run(&a).map_err(|e| chain(&e))),
        Suite::Sched(a) => run_main("sched", false, || sched::run(&a)),
        Suite::Chaos(a) => run_main("chaos", true, || chaos::run(&a)),
        Suite::Zdtm(a) => run_main("zdtm", true, || zdtm::run(&a)),
        Suite::Push(a) => run_main("push", true, || push::run(&a)),
        Suite::Openhands(a) => run_main("openhands", true, || openhands::run(&a)),
    }
}
