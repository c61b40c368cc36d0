//! `belayer-bench openhands`: what Belayer costs an unchanged OpenHands V1 conversation (issue
//! 22, points 3 and 4). The scripted conversation of `tests/openhands.rs` (8 model turns, 7 tool
//! steps, the stub model thinking a fixed time a turn) runs N times on a private dockerd whose
//! default runtime is runc and N times on one whose default runtime is Belayer with
//! `checkpoint = "auto"` and `actions = "activity"`, alternating runc, Belayer, Belayer, runc,
//! in one run. Stop points, both sides: the conversation from `Conversation(...)` called to
//! `conversation.run()` returned with FINISHED, as the driver sees them; the sandbox's start
//! (`DockerWorkspace` → the server's `/health`) is reported apart. Each automatic checkpoint is
//! placed among the model's turns and reported with its phases (its manifest: what `belayer
//! inspect` prints). Then, on the Belayer daemon, one more conversation holds the model at
//! chosen steps: a checkpoint and an in-place restore (`belayer restore --json`) at each, the
//! client's websocket open, timed per phase; that conversation must still finish as expected.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::bench::Common;
use crate::bench::record::Record;
use crate::bench::stats::{median, round3};
use crate::openhands::{Daemons, Placement, Report, Run, SERVER, Turn, model_turns};

/// Belayer's config on its side: automatic checkpoints at the boundaries the sandbox's cgroup
/// shows (the agent-server never execs).
pub const BELAYER_TOML: &str = "checkpoint = \"auto\"\nactions = \"activity\"\nkeep = 100\n";

/// The targets for this sandbox's checkpoint.
pub const FROZEN_TARGET_S: f64 = 0.5;
pub const TOTAL_TARGET_S: f64 = 2.0;

/// `belayer-bench openhands`: needs root, containerd 2.x, dockerd, the workspace's binaries,
/// OpenHands (`scripts/setup-openhands`) and its image.
#[derive(clap::Args, Clone, Debug, PartialEq)]
pub struct Args {
    /// Conversations a side
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// The stub model's time per turn, seconds (both sides)
    #[arg(long, default_value_t = 4.0)]
    pub think_s: f64,
    /// Steps at which the restore conversation checkpoints and restores the sandbox (0 for
    /// none): comma-separated model turns, 1–7
    #[arg(long, default_value = "2,4,6", value_delimiter = ',')]
    pub restore_at: Vec<u64>,
    #[command(flatten)]
    pub common: Common,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Runc,
    Belayer,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Belayer => "belayer",
        }
    }
}

/// One checkpoint: where it began, and its manifest's timings, CRIU statistics and sizes.
struct Taken {
    seq: u64,
    at: Placement,
    manifest: Value,
}

impl Taken {
    fn us(&self, phase: &str) -> Option<f64> {
        self.manifest["timings"][phase].as_f64()
    }
}

/// One conversation, timed.
struct Conversation {
    side: Side,
    report: Report,
    turns: Vec<Turn>,
    taken: Vec<Taken>,
}

impl Conversation {
    fn wall_s(&self) -> f64 {
        self.report.0["conversation_s"].as_f64().unwrap_or(f64::NAN)
    }
}

/// The checkpoints of sandbox `id` the store holds, placed among `turns`.
fn taken(x: &Daemons, id: &str, turns: &[Turn]) -> Vec<Taken> {
    x.manifests(id)
        .into_iter()
        .map(|m| Taken {
            seq: m["seq"].as_u64().unwrap_or_default(),
            at: Placement::of(turns, m["created_unix_ms"].as_f64().unwrap_or(0.0) / 1e3),
            manifest: m,
        })
        .collect()
}

/// Runs one failure-free conversation on `x`, checks it did the task, reads back its
/// checkpoints.
fn conversation(x: &Daemons, side: Side, n: usize, think_s: f64) -> Conversation {
    let run = Run::new(x.scratch.path(), &format!("{}-{n}", side.name()));
    let child = run.spawn(&x.d, &[], think_s);
    let id = run.container_id(Duration::from_secs(240));
    let report = run.finish(child, Duration::from_secs(600), String::new);
    report.assert_task_done();
    assert_eq!(report.0["runtime"], side.name(), "{:#}", report.0);
    let turns = model_turns(&run.events());
    let taken = match side {
        Side::Runc => Vec::new(),
        Side::Belayer => taken(x, &id, &turns),
    };
    Conversation {
        side,
        report,
        turns,
        taken,
    }
}

/// `belayer ARGS` on sandbox `id`, tried again while another checkpoint or restore of it (an
/// automatic one) is in progress.
fn belayer_when_free(x: &Daemons, args: &[&str]) -> Result<(crate::Out, Duration), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let start = Instant::now();
        let out = x.belayer(args);
        if out.code == 0 {
            return Ok((out, start.elapsed()));
        }
        if !out.stderr.contains("already in progress") || Instant::now() > deadline {
            return Err(format!("belayer {}: {out:?}", args.join(" ")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One checkpoint and in-place restore while the model was held.
struct Restored {
    step: u64,
    checkpoint_cli_s: f64,
    checkpoint: Value,
    restore_cli_s: f64,
    /// From the restore sent until the agent-server answered `GET /health` (its Python heap
    /// at work: with lazy pages, memory is filled as it is touched).
    healthy_s: f64,
    restore: Value,
}

/// The agent-server (on the host's network, 127.0.0.1) answers `GET /health` with 200.
fn server_healthy() -> bool {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], crate::openhands::SERVER_PORT));
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    let mut head = [0u8; 12];
    s.write_all(req.as_bytes()).is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.1 200")
}

/// At each of `steps`, once the model was asked for it (the stub holds it): a checkpoint and an
/// in-place restore of sandbox `id`, timed, then the model answers.
fn held_steps(x: &Daemons, run: &Run, id: &str, steps: &[u64]) -> Result<Vec<Restored>, String> {
    let mut out = Vec::new();
    for &k in steps {
        run.wait_asked(k, Duration::from_secs(300));
        let (cp, cp_took) = belayer_when_free(x, &["checkpoint", id])?;
        let cp = cp.stdout.trim().to_string();
        let checkpoint: Value =
            serde_json::from_str(&x.belayer(&["inspect", id, &cp]).stdout).unwrap_or_default();
        let (answer, took) = belayer_when_free(x, &["restore", "--json", "--checkpoint", &cp, id])?;
        let restore: Value = serde_json::from_str(answer.stdout.trim())
            .map_err(|e| format!("belayer restore --json: {e}: {:?}", answer.stdout))?;
        let health = Instant::now();
        if !crate::bench::wait_until(Duration::from_secs(60), server_healthy) {
            return Err(format!(
                "the agent-server did not answer /health within 60 s of the restore of checkpoint {cp}"
            ));
        }
        let healthy_s = took.as_secs_f64() + health.elapsed().as_secs_f64();
        eprintln!(
            "  step {k}: checkpoint {cp} (cli {:.2} s, frozen {} us, total {} us), restored in \
             place (cli {:.2} s, server healthy after {healthy_s:.2} s): {restore}",
            cp_took.as_secs_f64(),
            checkpoint["timings"]["frozen_us"],
            checkpoint["timings"]["total_us"],
            took.as_secs_f64()
        );
        out.push(Restored {
            step: k,
            checkpoint_cli_s: cp_took.as_secs_f64(),
            checkpoint,
            restore_cli_s: took.as_secs_f64(),
            healthy_s,
            restore,
        });
        run.release(k as usize);
    }
    Ok(out)
}

/// The restore conversation: held at each of `steps`, the sandbox is checkpointed and restored
/// in place (the client's websocket open), then the model answers. It must still finish with
/// the task done.
fn restores(x: &Daemons, steps: &[u64]) -> Result<(Vec<Restored>, Report), String> {
    let run = Run::new(x.scratch.path(), "restore");
    let hold: Vec<usize> = steps.iter().map(|&k| k as usize).collect();
    let mut child = run.spawn(&x.d, &hold, 0.2);
    let id = run.container_id(Duration::from_secs(240));
    let out = match held_steps(x, &run, &id, steps) {
        Ok(out) => out,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    let report = run.finish(child, Duration::from_secs(600), || {
        format!("belayer status: {:?}", x.belayer(&["status", &id]))
    });
    report.assert_task_done();
    Ok((out, report))
}

/// The phases of a checkpoint, in order: manifest key, label.
const PHASES: [(&str, &str); 8] = [
    (
        "release_us",
        "older checkpoints' cached images released (container running)",
    ),
    ("freeze_us", "freeze (`runc pause`)"),
    ("dump_us", "CRIU dump (`runc checkpoint`)"),
    ("fs_capture_us", "fs layer capture"),
    ("thaw_us", "thaw (`runc resume`)"),
    ("frozen_us", "**frozen** (freeze → thaw)"),
    ("write_us", "hash, manifest, fsync, rename"),
    ("total_us", "**total**"),
];

/// CRIU's own figures of the dump (`stats-dump`), in its frozen window.
const CRIU_PHASES: [(&str, &str); 4] = [
    ("freezing_time_us", "CRIU: seizing the tasks"),
    ("frozen_time_us", "CRIU: tasks held"),
    ("memdump_time_us", "CRIU: collecting pages"),
    ("memwrite_time_us", "CRIU: writing pages"),
];

fn ms(xs: &[f64]) -> String {
    match median(xs) {
        Some(m) => format!("{:.0} ms", m / 1e3),
        None => "–".into(),
    }
}

fn spread(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if xs.is_empty() {
        String::new()
    } else {
        format!("{:.0}–{:.0}", lo / 1e3, hi / 1e3)
    }
}

/// Runs the benchmark; `Ok(false)` when a check failed.
pub fn run(args: &Args) -> Result<bool, String> {
    let rec = Record::start("openhands", &args.common.out("openhands"))?;
    let _bins = crate::bench::snapshot_bins(&["containerd-shim-belayer-v1", "belayer"])?;
    let _port = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    eprintln!(
        "belayer-bench openhands: starting a runc and a Belayer dockerd (each imports the ~1 GB \
         agent-server image)"
    );
    let (runc, belayer) = std::thread::scope(|s| {
        let runc = s.spawn(|| Daemons::with_runc("bench-runc"));
        let belayer = Daemons::with_belayer("bench-belayer", BELAYER_TOML);
        (runc.join(), belayer)
    });
    let runc = runc.map_err(|_| "the runc daemons did not start".to_string())?;
    let daemons = |side: Side| match side {
        Side::Runc => &runc,
        Side::Belayer => &belayer,
    };
    eprintln!(
        "belayer-bench openhands: {} conversations a side, runc and Belayer alternating, the \
         model thinking {} s a turn",
        args.runs, args.think_s
    );
    let mut convs: Vec<Conversation> = Vec::new();
    for round in 0..args.runs as usize {
        let order = if round % 2 == 0 {
            [Side::Runc, Side::Belayer]
        } else {
            [Side::Belayer, Side::Runc]
        };
        for side in order {
            let c = conversation(daemons(side), side, round, args.think_s);
            eprintln!(
                "  {} {round}: conversation {:.2} s, sandbox ready {} s; {} checkpoints{}",
                side.name(),
                c.wall_s(),
                c.report.0["sandbox_ready_s"],
                c.taken.len(),
                c.taken
                    .iter()
                    .map(|t| format!(
                        "\n    {}: {} (frozen {} ms, total {} ms)",
                        t.seq,
                        t.at,
                        t.us("frozen_us").unwrap_or(f64::NAN) / 1e3,
                        t.us("total_us").unwrap_or(f64::NAN) / 1e3
                    ))
                    .collect::<String>()
            );
            convs.push(c);
        }
    }
    let steps: Vec<u64> = args.restore_at.iter().copied().filter(|&k| k > 0).collect();
    eprintln!("belayer-bench openhands: checkpoint and restore in place at steps {steps:?}");
    let (restored, restore_report) = restores(&belayer, &steps)?;
    drop((runc, belayer));

    let side = |s: Side| convs.iter().filter(move |c| c.side == s);
    let walls = |s: Side| side(s).map(Conversation::wall_s).collect::<Vec<_>>();
    let readies = |s: Side| {
        side(s)
            .filter_map(|c| c.report.0["sandbox_ready_s"].as_f64())
            .collect::<Vec<_>>()
    };
    let (runc_wall, bel_wall) = (walls(Side::Runc), walls(Side::Belayer));
    let (runc_med, bel_med) = (
        median(&runc_wall).unwrap_or(f64::NAN),
        median(&bel_wall).unwrap_or(f64::NAN),
    );
    let overhead_s = bel_med - runc_med;
    let overhead = bel_med / runc_med - 1.0;
    let auto: Vec<&Taken> = side(Side::Belayer).flat_map(|c| c.taken.iter()).collect();
    let count = |kind: &str| auto.iter().filter(|t| t.at.kind() == kind).count();
    let phase = |key: &str| auto.iter().filter_map(|t| t.us(key)).collect::<Vec<_>>();
    let criu = |key: &str| {
        auto.iter()
            .filter_map(|t| t.manifest["criu_stats"][key].as_f64())
            .collect::<Vec<_>>()
    };
    let (frozen, total) = (phase("frozen_us"), phase("total_us"));
    let (frozen_med, total_med) = (
        median(&frozen).unwrap_or(f64::NAN) / 1e6,
        median(&total).unwrap_or(f64::NAN) / 1e6,
    );
    let restore_field = |f: &str| {
        restored
            .iter()
            .filter_map(|r| r.restore[f].as_f64().map(|ms| ms * 1e3))
            .collect::<Vec<_>>()
    };

    let mut t = String::new();
    let turns = convs.first().map_or(0, |c| c.turns.len());
    let _ = writeln!(
        t,
        "| OpenHands conversation ({turns} model turns, 7 tool steps, model {} s a turn), {} a side | runc | Belayer auto | Belayer − runc |",
        args.think_s, args.runs
    );
    let _ = writeln!(t, "| --- | --- | --- | --- |");
    let _ = writeln!(
        t,
        "| conversation, median (`Conversation(...)` called → `run()` returned FINISHED) | {runc_med:.2} s | {bel_med:.2} s | {overhead_s:+.2} s ({:+.1} %) |",
        overhead * 100.0
    );
    let list = |xs: &[f64]| {
        xs.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        t,
        "| conversation, samples (s) | {} | {} | |",
        list(&runc_wall),
        list(&bel_wall)
    );
    let _ = writeln!(
        t,
        "| sandbox ready, samples (`DockerWorkspace(...)` → server healthy; untimed above) | {} | {} | |",
        list(&readies(Side::Runc)),
        list(&readies(Side::Belayer))
    );
    let _ = writeln!(
        t,
        "\nBelayer's automatic checkpoints: {} in {} conversations; {} began inside a model turn, \
         {} during a tool, {} before the first turn, {} after the last.\n",
        auto.len(),
        args.runs,
        count("turn"),
        count("tool"),
        count("before"),
        count("after")
    );
    let _ = writeln!(
        t,
        "| conversation | checkpoint | began | frozen | total | CRIU images |"
    );
    let _ = writeln!(t, "| --- | --- | --- | ---: | ---: | ---: |");
    for (n, c) in side(Side::Belayer).enumerate() {
        for k in &c.taken {
            let _ = writeln!(
                t,
                "| {n} | {} | {} | {:.0} ms | {:.0} ms | {:.0} MB |",
                k.seq,
                k.at,
                k.us("frozen_us").unwrap_or(f64::NAN) / 1e3,
                k.us("total_us").unwrap_or(f64::NAN) / 1e3,
                k.manifest["sizes"]["criu_bytes"].as_f64().unwrap_or(0.0) / 1e6
            );
        }
    }
    let _ = writeln!(
        t,
        "\n| checkpoint phase ({} automatic checkpoints) | median | range (ms) |",
        auto.len()
    );
    let _ = writeln!(t, "| --- | ---: | --- |");
    for (key, label) in PHASES {
        let xs = phase(key);
        let _ = writeln!(t, "| {label} | {} | {} |", ms(&xs), spread(&xs));
    }
    for (key, label) in CRIU_PHASES {
        let xs = criu(key);
        let _ = writeln!(t, "| {label} | {} | {} |", ms(&xs), spread(&xs));
    }
    let pages = criu("pages_written");
    let _ = writeln!(
        t,
        "| CRIU: pages written (4 KiB) | {:.0} | |",
        median(&pages).unwrap_or(f64::NAN)
    );
    let _ = writeln!(
        t,
        "\n| checkpoint + in-place restore, model held at steps {steps:?} | median | samples |"
    );
    let _ = writeln!(t, "| --- | ---: | --- |");
    let row = |t: &mut String, label: &str, xs: &[f64]| {
        let _ = writeln!(
            t,
            "| {label} | {} | {} |",
            ms(xs),
            xs.iter()
                .map(|x| format!("{:.0}", x / 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let cli = |f: fn(&Restored) -> f64| restored.iter().map(|r| f(r) * 1e6).collect::<Vec<_>>();
    let cp_phase = |key: &str| {
        restored
            .iter()
            .filter_map(|r| r.checkpoint["timings"][key].as_f64())
            .collect::<Vec<_>>()
    };
    row(
        &mut t,
        "`belayer checkpoint` (CLI wall)",
        &cli(|r| r.checkpoint_cli_s),
    );
    row(&mut t, "… frozen", &cp_phase("frozen_us"));
    row(&mut t, "… total", &cp_phase("total_us"));
    row(
        &mut t,
        "`belayer restore --json` in place (CLI wall)",
        &cli(|r| r.restore_cli_s),
    );
    row(
        &mut t,
        "… shim total (`total_ms`)",
        &restore_field("total_ms"),
    );
    row(
        &mut t,
        "… of which integrity check (`verify_ms`)",
        &restore_field("verify_ms"),
    );
    row(
        &mut t,
        "… of which rootfs mount (`mount_ms`)",
        &restore_field("mount_ms"),
    );
    row(
        &mut t,
        "… of which CRIU restore (`restore_ms`)",
        &restore_field("restore_ms"),
    );
    row(
        &mut t,
        "restore sent → agent-server answers `GET /health`",
        &cli(|r| r.healthy_s),
    );
    let lazy = restored
        .iter()
        .filter(|r| r.restore["lazy_pages"] == true)
        .count();
    let _ = writeln!(
        t,
        "\nRestores with lazy pages (memory filled after the processes run): {lazy} of {}; the \
         restore conversation finished the task in {} s (reconnects {}).",
        restored.len(),
        restore_report.0["conversation_s"],
        restore_report.0["reconnects"]
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    let _ = writeln!(
        t,
        "\nTargets (issue 22, point 4), medians of the automatic checkpoints: frozen {frozen_med:.2} s < {FROZEN_TARGET_S} s: {}; total {total_med:.2} s < {TOTAL_TARGET_S} s: {}",
        met(frozen_med < FROZEN_TARGET_S),
        met(total_med < TOTAL_TARGET_S)
    );
    let checks = json!({
        "every conversation finished with the expected history and files": true,
        "every Belayer conversation had an automatic checkpoint begin inside a model turn":
            side(Side::Belayer).all(|c| c.taken.iter().any(|k| k.at.kind() == "turn")),
    });
    let mut ok = true;
    for (what, passed) in checks.as_object().into_iter().flatten() {
        ok &= passed == true;
        let verdict = if passed == true { "ok" } else { "FAILED" };
        let _ = writeln!(t, "check {what}: {verdict}");
    }
    let phases_json = |f: &dyn Fn(&str) -> Vec<f64>, keys: &[&str]| -> Value {
        keys.iter()
            .map(|k| (k.to_string(), crate::bench::stats::dist(&f(k))))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let results = json!({
        "runs": args.runs,
        "think_s": args.think_s,
        "sides": {
            "runc": "dockerd with docker's default runtime (io.containerd.runc.v2)",
            "belayer": format!("dockerd with configs/docker/daemon-default-runtime.json \
                                (io.containerd.belayer.v1), Belayer config {BELAYER_TOML:?}"),
        },
        "stop_points": {
            "conversation": "Conversation(...) called -> conversation.run() returned, status \
                             FINISHED (conversation.py's conversation_s)",
            "sandbox_ready": "DockerWorkspace(...) called -> the agent-server answered /health \
                              (sandbox_ready_s; not in the conversation's time)",
            "checkpoint": "the checkpoint's manifest: freeze began (created_unix_ms) and its \
                           timings; placed among the stub's request/answer instants",
        },
        "conversation_s": {"runc": crate::bench::stats::dist(&runc_wall),
                           "belayer": crate::bench::stats::dist(&bel_wall),
                           "overhead_s": round3(overhead_s), "overhead": round3(overhead)},
        "checkpoints": {
            "count": auto.len(), "in_turn": count("turn"), "in_tool": count("tool"),
            "before": count("before"), "after": count("after"),
            "phases_us": phases_json(&phase, &PHASES.map(|p| p.0)),
            "criu_us": phases_json(&criu, &CRIU_PHASES.map(|p| p.0)),
        },
        "restores": restored.iter().map(|r| json!({
            "step": r.step, "checkpoint_cli_s": round3(r.checkpoint_cli_s),
            "checkpoint_timings": r.checkpoint["timings"], "checkpoint_criu": r.checkpoint["criu_stats"],
            "checkpoint_sizes": r.checkpoint["sizes"],
            "restore_cli_s": round3(r.restore_cli_s), "healthy_s": round3(r.healthy_s),
            "restore": r.restore,
        })).collect::<Vec<_>>(),
        "conversations": convs.iter().map(|c| json!({
            "runtime": c.side.name(),
            "conversation_s": c.report.0["conversation_s"],
            "sandbox_ready_s": c.report.0["sandbox_ready_s"],
            "reconnects": c.report.0["reconnects"],
            "model_turns": c.turns.iter().map(|t| json!([t.k, t.request, t.answer])).collect::<Vec<_>>(),
            "checkpoints": c.taken.iter().map(|k| json!({
                "seq": k.seq, "began": k.at.to_string(), "where": k.at.kind(),
                "timings": k.manifest["timings"], "criu_stats": k.manifest["criu_stats"],
                "sizes": k.manifest["sizes"],
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "targets": {"frozen_s": FROZEN_TARGET_S, "total_s": TOTAL_TARGET_S,
                    "frozen_median_s": round3(frozen_med), "total_median_s": round3(total_med)},
        "checks": checks,
    });
    let summary = json!({
        "conversation_overhead_s": round3(overhead_s),
        "conversation_overhead": round3(overhead),
        "frozen_median_s": round3(frozen_med),
        "total_median_s": round3(total_med),
        "restore_median_ms": median(&restore_field("total_ms")).map(|x| round3(x / 1e3)),
        "checks": checks,
    });
    rec.report(&t, results, None, summary)?;
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_default_and_parse() {
        let a: Args = crate::bench::parse_args(&[]).unwrap();
        assert_eq!((a.runs, a.think_s, a.restore_at), (3, 4.0, vec![2, 4, 6]));
        let a: Args =
            crate::bench::parse_args(&["--runs", "1", "--think-s", "2", "--restore-at", "0"])
                .unwrap();
        assert_eq!((a.runs, a.think_s, a.restore_at), (1, 2.0, vec![0]));
        assert!(crate::bench::parse_args::<Args>(&["--runs", "0"]).is_err());
    }
}
