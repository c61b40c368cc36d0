//! `belayer-bench sched`: simulates checkpoint policies on synthetic or recorded agent episodes
//! and compares visible overhead with expected work lost per failure (`scheduler/README.md`).
//!
//! The I/O edge around the pure simulation: flags, trace files, the table, results.json and
//! plot.svg.

mod args;
mod report;
mod rng;
mod sim;
mod svg;
mod synth;
mod trace;

use std::fs;
use std::io::BufReader;
use std::process::ExitCode;

use scheduler::SchedulerConfig;

use crate::args::Args;
use crate::sim::{Outcome, Policy, Setup};
use crate::trace::Episode;

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            print!("{}", args::USAGE);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("belayer-bench sched: {e}\n\n{}", args::USAGE);
            return ExitCode::from(2);
        }
    };
    match run(&args, &argv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("belayer-bench sched: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, argv: &[String]) -> Result<(), String> {
    let cfg = load_config(args)?;
    let (nodes, source) = load_nodes(args)?;
    if let Some(path) = &args.write_trace {
        let all: Vec<Episode> = nodes.iter().flatten().cloned().collect();
        let f =
            fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        trace::write(std::io::BufWriter::new(f), &source, &all)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let mut policies = vec![
        Policy::Belayer { hints: false },
        Policy::Belayer { hints: true },
    ];
    policies.push(Policy::Every { k: 1, sync: true });
    policies.push(Policy::Every { k: 1, sync: false });
    policies.extend(
        args.ks
            .iter()
            .filter(|&&k| k > 1)
            .map(|&k| Policy::Every { k, sync: true }),
    );
    policies.push(Policy::Never);

    let started = std::time::Instant::now();
    let rows: Vec<report::Row> = policies
        .iter()
        .map(|&p| {
            let per_node: Vec<Outcome> = nodes
                .iter()
                .enumerate()
                .map(|(n, eps)| {
                    let setup = Setup {
                        cfg: &cfg,
                        truth: &args.truth,
                        failures_per_h: args.failures_per_h,
                        seed: rng::mix(&[args.seed, n as u64]),
                    };
                    sim::run(eps, p, &setup)
                })
                .collect();
            report::row(p.name(), &per_node)
        })
        .collect();
    let elapsed = started.elapsed().as_secs_f64();

    let episodes: usize = nodes.iter().map(Vec::len).sum();
    let actions = rows.first().map_or(0, |r| r.totals.actions);
    println!(
        "## belayer-bench sched: {source}\n\n{} nodes × {} containers, {episodes} episodes, {actions} actions; \
         max {} concurrent checkpoints; failures {} per container-hour; simulated in {elapsed:.2} s\n",
        nodes.len(),
        args.containers,
        cfg.max_concurrent,
        args.failures_per_h
    );
    print!("{}", report::markdown(&rows));

    fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let json = serde_json::json!({
        "format": "belayer-bench-sched-results",
        "version": 1,
        "source": source,
        "command": reproduce(argv),
        "nodes": nodes.len(),
        "containers_per_node": args.containers,
        "episodes": episodes,
        "failures_per_h": args.failures_per_h,
        "config": cfg,
        "shape": if args.trace.is_none() { serde_json::to_value(&args.shape).ok() } else { None },
        "true_cost": args.truth,
        "results": rows,
    });
    let results = args.out.join("results.json");
    let plot = args.out.join("plot.svg");
    let text =
        serde_json::to_string_pretty(&json).map_err(|e| format!("cannot encode results: {e}"))?;
    fs::write(&results, text + "\n")
        .map_err(|e| format!("cannot write {}: {e}", results.display()))?;
    fs::write(
        &plot,
        svg::plot(&rows, &format!("checkpoint policies: {source}")),
    )
    .map_err(|e| format!("cannot write {}: {e}", plot.display()))?;
    println!("\nwrote {} and {}", results.display(), plot.display());
    println!("reproduce: {}", reproduce(argv));
    Ok(())
}

fn load_config(args: &Args) -> Result<SchedulerConfig, String> {
    let mut cfg = match &args.config {
        None => SchedulerConfig::default(),
        Some(p) => {
            let text =
                fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            serde_json::from_str(&text)
                .map_err(|e| format!("{}: invalid config: {e}", p.display()))?
        }
    };
    if let Some(m) = args.max_concurrent {
        cfg.max_concurrent = m;
    }
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// The episodes, grouped into nodes of `--containers`, and a description of where they came from.
fn load_nodes(args: &Args) -> Result<(Vec<Vec<Episode>>, String), String> {
    match &args.trace {
        Some(path) => {
            let f =
                fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            let eps = trace::read(BufReader::new(f)).map_err(|e| {
                let mut msg = format!("{}: {e}", path.display());
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg += &format!(": {s}");
                    src = s.source();
                }
                msg
            })?;
            if eps.is_empty() {
                return Err(format!("{}: no episodes", path.display()));
            }
            let nodes = eps
                .chunks(args.containers)
                .map(<[Episode]>::to_vec)
                .collect();
            Ok((nodes, format!("trace {}", path.display())))
        }
        None => {
            let nodes = (0..args.nodes)
                .map(|n| synth::node(args.seed, n, args.containers, &args.shape))
                .collect();
            Ok((nodes, format!("synthetic, seed {}", args.seed)))
        }
    }
}

fn reproduce(argv: &[String]) -> String {
    let mut cmd = String::from("belayer-bench sched");
    if !argv.iter().any(|a| a == "--seed") {
        cmd += " --seed 1";
    }
    for a in argv {
        cmd.push(' ');
        cmd += a;
    }
    cmd
}
