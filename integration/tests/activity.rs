//! Automatic checkpoints of a sandbox whose actions are not execs (`io.belayer.actions=activity`),
//! as OpenHands' agent-server runs its tools: the shim finds the action boundaries from the
//! container's cgroup CPU and I/O, and its checkpoints land in the idle gaps.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use belayer_integration::{Containerd, Flavor};
use common::*;

/// The init's own agent loop: an "action" burns a core for ~0.8 s, then the "model thinks" for
/// 4 s; each action's start and end (`/proc/uptime`, seconds) go to `/actions`.
const AGENT: &str = "busy() { e=$(awk '{print $1+0.8}' /proc/uptime); \
    while awk -v e=$e '{exit !($1<e)}' /proc/uptime; do :; done; }; \
    while :; do echo start $(cut -d' ' -f1 /proc/uptime) >> /actions; busy; \
    echo end $(cut -d' ' -f1 /proc/uptime) >> /actions; sleep 4; done";

/// The Unix time of boot, in seconds: `/proc/uptime` in the container is the host's.
fn boot_unix_s() -> f64 {
    let up: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    now - up
}

/// The actions `id`'s init logged, as (start, end) in Unix seconds, read from the host side
/// (an exec would be activity of its own).
fn actions(c: &Containerd, id: &str, boot: f64) -> Vec<(f64, f64)> {
    let pid = task_pid(c, id);
    let log = std::fs::read_to_string(format!("/proc/{pid}/root/actions")).unwrap_or_default();
    let mut out = Vec::new();
    let mut start = None;
    for line in log.lines() {
        match line.split_once(' ') {
            Some(("start", t)) => start = t.parse::<f64>().ok(),
            Some(("end", t)) => {
                if let (Some(s), Ok(e)) = (start.take(), t.parse::<f64>()) {
                    out.push((boot + s, boot + e));
                }
            }
            _ => {}
        }
    }
    out
}

/// Each listed checkpoint's instant (its freeze began), Unix seconds.
fn checkpoint_instants(c: &Containerd, id: &str) -> Vec<f64> {
    c.belayer(&["checkpoints", id])
        .stdout
        .lines()
        .map(|cp| {
            let out = c.belayer(&["inspect", id, cp]);
            let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
            v["created_unix_ms"].as_f64().unwrap_or(0.0) / 1e3
        })
        .collect()
}

#[test]
fn automatic_checkpoints_land_in_the_gaps_of_a_sandbox_without_execs() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let auto = ["--annotation", "io.belayer.checkpoint=auto"];
    let keep = ["--annotation", "io.belayer.keep=10"];
    let activity = [
        &auto[..],
        &keep[..],
        &["--annotation", "io.belayer.actions=activity"],
    ]
    .concat();
    run_detached_with(&c, BELAYER, &activity, "agent", &["sh", "-c", AGENT]);
    // The same loop with the default boundaries (execs): it never execs, so nothing is new to
    // checkpoint, ever.
    let exec = [&auto[..], &keep[..]].concat();
    run_detached_with(&c, BELAYER, &exec, "agent-exec", &["sh", "-c", AGENT]);
    let boot = boot_unix_s();

    let start = Instant::now();
    let enough = wait_until(Duration::from_secs(45), || {
        checkpoint_instants(&c, "agent").len() >= 3
    });
    let instants = checkpoint_instants(&c, "agent");
    let acts = actions(&c, "agent", boot);
    assert!(
        enough,
        "{} automatic checkpoints in {:?} of a sandbox acting every 4.8 s: {instants:?}; actions \
         {acts:?}; shim log:\n{}",
        instants.len(),
        start.elapsed(),
        c.log_lines("agent", 40)
    );
    // Every checkpoint fell in a gap, and no gap holds two: a checkpoint's own work in the
    // container (CRIU's parasite) was not read as an action.
    for t in &instants {
        let during = acts.iter().find(|(s, e)| s <= t && t <= e);
        assert!(
            during.is_none(),
            "checkpoint at {t:.3} taken during the action {during:?}; actions {acts:?}"
        );
    }
    let gap_of = |t: f64| acts.iter().filter(|(s, _)| *s < t).count();
    let mut gaps: Vec<usize> = instants.iter().map(|t| gap_of(*t)).collect();
    let n = gaps.len();
    gaps.dedup();
    assert_eq!(
        gaps.len(),
        n,
        "two checkpoints in one gap: {instants:?}; actions {acts:?}"
    );
    let fell: Vec<String> = instants
        .iter()
        .map(|t| {
            let end = acts.iter().rev().find(|(_, e)| e < t).map(|(_, e)| *e);
            end.map_or("before the first action's end".into(), |e| {
                format!("{:.2} s after an action ended", t - e)
            })
        })
        .collect();
    println!("automatic checkpoints of a sandbox without execs: {fell:?}");
    assert_eq!(
        c.belayer(&["checkpoints", "agent-exec"]).stdout,
        "",
        "automatic checkpoints of a sandbox with exec boundaries and no exec"
    );
    let status = status(&c, "agent");
    assert_eq!(status["policy"]["activity"], true, "{status:#}");

    // The newest checkpoint restores, and the agent loop goes on acting and being checkpointed.
    let before = instants.len();
    restore(&c, "agent", None);
    assert!(
        wait_until(Duration::from_secs(30), || {
            checkpoint_instants(&c, "agent").len() > before
        }),
        "no automatic checkpoint after the restore; shim log:\n{}",
        c.log_lines("agent", 40)
    );
    remove(&c, "agent");
    remove(&c, "agent-exec");
}
