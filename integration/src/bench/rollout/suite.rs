//! The `belayer-bench rollout` suite: the runs, on one seed and one failure schedule, and the
//! record. Fails when Belayer lost a trajectory or a final state differs.

use std::path::PathBuf;

use serde_json::json;

use super::args::Args;
use super::{Mode, faults, report};
use crate::bench::record::Record;
use crate::{Containerd, Flavor, prereq};

/// Runs the suite. Call while single-threaded (it points `$BELAYER_BIN_DIR` at the snapshot).
pub fn main(args: &Args) -> Result<bool, String> {
    args.validate()?;
    let _bins = crate::bench::snapshot_bins(&[
        "containerd-shim-belayer-v1",
        "belayer",
        "belayer-gpu-broker",
        "belayer-worker",
    ])?;
    let rec = Record::start("rollout", &args.common.out("rollout"))?;
    let bin_dir = prereq::bin_dir();
    let model = gpu_broker::worker::model_path();
    if !model.is_file() {
        return Err(format!(
            "model file {} is missing: run gpu-broker/scripts/fetch-model",
            model.display()
        ));
    }
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
    for mode in Mode::ALL {
        let r = super::run(&c, &bin_dir, args, mode, &sched, &work)?;
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
    let title = format!(
        "belayer-bench rollout: {} sandboxes x {} turns, {} sandbox + {} worker kills (seed {})",
        args.sandboxes, args.turns, args.sandbox_kills, args.worker_kills, args.seed
    );
    let summary = report::summary(&runs);
    let results = json!({
        "args": { "sandboxes": args.sandboxes, "turns": args.turns, "seed": args.seed,
                  "sandbox_kills": args.sandbox_kills, "worker_kills": args.worker_kills, "max_new": args.max_new },
        "model": model.display().to_string(),
        "schedule": sched, "summary": summary, "runs": runs,
    });
    let trace_path = rec.out.join("trace.jsonl");
    let f = std::fs::File::create(&trace_path)
        .map_err(|e| format!("create {}: {e}", trace_path.display()))?;
    crate::bench::sched::trace::write(
        std::io::BufWriter::new(f),
        &format!(
            "belayer-bench rollout, failure-free run, {}",
            rec.context["git"]
        ),
        &report::trace(&runs),
    )
    .map_err(|e| format!("write {}: {e}", trace_path.display()))?;
    rec.report(
        &format!("{title}\n\n{}", report::table(&runs)),
        results,
        Some(report::plot(&runs, &title)),
        json!({ "rollout": summary }),
    )?;
    let belayer = runs.iter().find(|r| r.mode == Mode::Belayer);
    Ok(belayer.is_some_and(|r| r.lost() == 0))
}
