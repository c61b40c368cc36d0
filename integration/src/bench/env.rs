//! `belayer-bench env`: environment recovery on the reference episode — replay in a fresh
//! container vs containerd's and podman's checkpoint/restore vs Belayer's checkpoint, restore and
//! forks of 1, 2, 4 and 8 (with the CPU they take), under Belayer's defaults and under the
//! baselines' own restore settings; every restore timed to "running" and to "memory intact" and
//! checked the same way on every side. Writes results.json,
//! table.md and plot.svg; the last stdout line is one JSON object with the medians and ratios.
//! Fails when a check fails.

use serde_json::json;

use crate::bench::check::Checks;
use crate::bench::podman::{self, Podman};
use crate::bench::record::{Record, first_line};
use crate::bench::stats::Samples;
use crate::bench::{Common, belayer, ctrd, report};
use crate::episode::{self, SANDBOX};
use crate::{Containerd, Flavor, prereq};

/// `belayer-bench env`: needs root, containerd 2.x, runc, CRIU ≥ 4.2, the images of
/// scripts/images and the workspace's binaries (containerd-shim-belayer-v1, belayer) beside
/// this one or in $BELAYER_BIN_DIR.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Repetitions of every measurement; medians and all samples reported
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Memory of the episode's background process, MB
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..))]
    pub holder_mb: u32,
    /// Skip podman even when it is installed
    #[arg(long)]
    pub no_podman: bool,
    #[command(flatten)]
    pub common: Common,
}

/// Runs every measurement `args.runs` times and reports; `Ok(false)` when a check failed.
pub fn run(args: &Args) -> Result<bool, String> {
    let bins = crate::bench::snapshot_bins(&["containerd-shim-belayer-v1", "belayer"])?;
    let rec = Record::start("env", &args.common.out("env"))?;
    eprintln!(
        "belayer-bench env: {} runs, holder {} MB",
        args.runs, args.holder_mb
    );
    let actions = episode::actions(args.holder_mb);
    let c = Containerd::start(Flavor::V2);
    c.import(&prereq::image("sandbox.tar"));
    // A second containerd whose Belayer shims restore as the baselines do: eagerly, with CRIU's
    // default network lock.
    let config = rec.out.join("belayer-like-baselines.toml");
    let like = belayer::LIKE_BASELINES;
    std::fs::write(&config, like.config.unwrap_or_default())
        .map_err(|e| format!("write {}: {e}", config.display()))?;
    let c_like = Containerd::start_configured(Flavor::V2, None, Some(config.clone()));
    c_like.import(&prereq::image("sandbox.tar"));
    let (pd, mut podman_status) = match (!args.no_podman, podman::installed()) {
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
        for (cd, set) in [(&c, belayer::DEFAULTS), (&c_like, like)] {
            belayer_info.push(belayer::measure(
                cd,
                set,
                run,
                &actions,
                &mut samples,
                &mut checks,
            ));
        }
    }
    let podman_version = pd.as_ref().map(Podman::version);
    drop(pd);
    drop(c);
    drop(c_like);
    let _ = std::fs::remove_file(&config);
    drop(bins);

    let table = report::table(&samples, &checks, &podman_status, args.runs);
    let mut results = report::results(&samples, &checks, &podman_status, belayer_info);
    results["versions"] = json!({
        "image": SANDBOX,
        "holder_mb": args.holder_mb,
        "forks": belayer::FORK_COUNTS,
        "podman": podman_version,
        "containerd": first_line("containerd", &["--version"]),
        "runc": first_line("runc", &["--version"]),
        "criu": first_line("criu", &["--version"]),
        "bin_dir": std::env::var("BELAYER_BIN_DIR").unwrap_or_default(),
        "settings": {
            "belayer": "Belayer's defaults: lazy_restore = auto (on here), network_lock = auto (nftables here)",
            "belayer_eager": like.config,
            "containerd, podman": "CRIU as runc runs it: eager restore, CRIU's default network lock (iptables) unless /etc/criu/runc.conf says otherwise",
            "criu_runc_conf": std::fs::read_to_string("/etc/criu/runc.conf").ok(),
        },
    });
    let title = format!(
        "Belayer env recovery, holder {} MB, {} runs",
        args.holder_mb, args.runs
    );
    let failed = checks.failed();
    let table = if failed > 0 {
        format!("{table}\n{failed} correctness checks FAILED (see stderr and results.json)\n")
    } else {
        table
    };
    rec.report(
        &table,
        results,
        Some(report::plot(&samples, &title)),
        report::summary(&samples, &checks, &podman_status),
    )?;
    Ok(failed == 0)
}
