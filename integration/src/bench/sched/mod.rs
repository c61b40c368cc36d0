//! `belayer-bench sched`: simulates checkpoint policies on synthetic or recorded agent episodes
//! and compares visible overhead with expected work lost per failure (`scheduler/README.md`).
//!
//! The I/O edge around the pure simulation: flags, trace files, the table, results.json and
//! plot.svg.

pub mod args;
pub mod report;
pub mod rng;
pub mod sim;
pub mod synth;
pub mod trace;

use std::fs;
use std::io::BufReader;

use scheduler::SchedulerConfig;
use serde_json::json;

use crate::bench::record::Record;
use args::Args;
use sim::{Outcome, Policy, Setup};
use trace::Episode;

/// The policies compared: Belayer's (with and without hints), every-k synchronous and in the
/// gap for k = 1 and each of `ks`, and never.
pub fn policies(ks: &[u32]) -> Vec<Policy> {
    let mut ks: Vec<u32> = std::iter::once(1).chain(ks.iter().copied()).collect();
    ks.sort_unstable();
    ks.dedup();
    let mut p = vec![
        Policy::Belayer { hints: false },
        Policy::Belayer { hints: true },
    ];
    for k in ks {
        p.push(Policy::Every { k, sync: true });
        p.push(Policy::Every { k, sync: false });
    }
    p.push(Policy::Never);
    p
}

/// Runs the simulation and writes the record.
pub fn run(args: &Args) -> Result<bool, String> {
    let rec = Record::start("sched", &args.common.out("sched"))?;
    let cfg = load_config(args)?;
    let truth = args.truth();
    let (nodes, source) = load_nodes(args)?;
    if let Some(path) = &args.write_trace {
        let all: Vec<Episode> = nodes.iter().flatten().cloned().collect();
        let f =
            fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        trace::write(std::io::BufWriter::new(f), &source, &all)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let started = std::time::Instant::now();
    let rows: Vec<report::Row> = policies(&args.ks)
        .into_iter()
        .map(|p| {
            let per_node: Vec<Outcome> = nodes
                .iter()
                .enumerate()
                .map(|(n, eps)| {
                    let setup = Setup {
                        cfg: &cfg,
                        truth: &truth,
                        failures_per_h: args.failures_per_h,
                        seed: rng::mix(&[args.seed, n as u64]),
                        feed: args.feed,
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
    let table = format!(
        "## belayer-bench sched: {source}\n\n{} nodes × {} containers, {episodes} episodes, {actions} actions; \
         max {} concurrent checkpoints; failures {} per container-hour; footprints fed: {}; simulated in {elapsed:.2} s\n\n{}",
        nodes.len(),
        args.containers,
        cfg.max_concurrent,
        args.failures_per_h,
        args.feed.describe(),
        report::markdown(&rows)
    );
    let results = json!({
        "format": "belayer-bench-sched-results",
        "version": 2,
        "source": source,
        "nodes": nodes.len(),
        "containers_per_node": args.containers,
        "episodes": episodes,
        "failures_per_h": args.failures_per_h,
        "feed": args.feed.describe(),
        "config": cfg,
        "shape": if args.trace.is_none() { args.shape().ok().and_then(|s| serde_json::to_value(s).ok()) } else { None },
        "true_cost": truth,
        "results": rows,
    });
    let summary = json!({
        "source": source,
        "feed": args.feed.describe(),
        "policies": rows.iter().map(|r| json!({
            "policy": r.policy,
            "overhead_pct": r.overhead_pct,
            "lost_per_failure_s": r.lost_per_failure_s,
        })).collect::<Vec<_>>(),
    });
    let plot = report::plot(&rows, &format!("checkpoint policies: {source}"));
    rec.report(&table, results, Some(plot), summary)?;
    Ok(true)
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
            let shape = args.shape()?;
            let nodes = (0..args.nodes)
                .map(|n| synth::node(args.seed, n, args.containers, &shape))
                .collect();
            Ok((nodes, format!("synthetic, seed {}", args.seed)))
        }
    }
}
