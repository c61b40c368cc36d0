//! The baselines on containerd: replaying the episode in a fresh container (what a framework
//! does today when a sandbox dies) and containerd's own `ctr container checkpoint/restore`.
//! Also the task helpers the Belayer measurements share.

use std::time::{Duration, Instant};

use crate::bench::check::{self, Checks};
use crate::bench::stats::Samples;
use crate::bench::wait_until;
use crate::containerd::Containerd;
use crate::episode::{self, Action, SANDBOX, Sandbox};

pub const RUNC: &str = "io.containerd.runc.v2";
pub const BELAYER: &str = "io.containerd.belayer.v1";

/// The status column of `ctr tasks ls` for `id` (`ABSENT` when it has no task).
pub fn task_status(c: &Containerd, id: &str) -> String {
    c.ctr(&["tasks", "ls"])
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        .unwrap_or_else(|| "ABSENT".into())
}

/// The pid of `id`'s task, from `ctr tasks ls`.
pub fn task_pid(c: &Containerd, id: &str) -> Option<u32> {
    c.ctr(&["tasks", "ls"])
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

/// Polls `ctr tasks ls` until every one of `ids` shows `want`.
pub fn wait_status(c: &Containerd, ids: &[&str], want: &str, limit: Duration) -> bool {
    wait_until(limit, || {
        let ls = c.ctr(&["tasks", "ls"]).stdout;
        ids.iter().all(|id| {
            ls.lines().any(|l| {
                let mut f = l.split_whitespace();
                f.next() == Some(id) && f.nth(1) == Some(want)
            })
        })
    })
}

/// Kills `id`'s task with SIGKILL (a crash) and waits until containerd reports it stopped.
#[track_caller]
pub fn crash(c: &Containerd, id: &str) {
    c.ctr(&["tasks", "kill", "-s", "9", id]).ok();
    assert!(
        wait_status(c, &[id], "STOPPED", Duration::from_secs(30)),
        "{id} did not stop after SIGKILL"
    );
}

/// Kills and removes `id`'s task and container, whatever state they are in.
pub fn remove(c: &Containerd, id: &str) {
    let _ = c.ctr(&["tasks", "kill", "-s", "9", id]);
    wait_until(Duration::from_secs(10), || {
        matches!(task_status(c, id).as_str(), "STOPPED" | "ABSENT")
    });
    let _ = c.ctr(&["tasks", "rm", "-f", id]);
    let _ = c.ctr(&["containers", "rm", id]);
}

/// Starts the sandbox with `runtime` and runs the episode; returns the time from `ctr run` to
/// the last action done.
#[track_caller]
pub fn episode<'a>(
    c: &'a Containerd,
    runtime: &str,
    id: &str,
    actions: &[Action],
) -> (Sandbox<'a>, f64) {
    let start = Instant::now();
    c.ctr(&[
        "run",
        "-d",
        "--runtime",
        runtime,
        SANDBOX,
        id,
        "sleep",
        "infinity",
    ])
    .ok();
    let s = Sandbox::attach(c, id);
    s.run(actions);
    (s, start.elapsed().as_secs_f64())
}

/// Replay: a fresh runc container re-running the episode.
pub fn replay(c: &Containerd, run: u32, actions: &[Action], samples: &mut Samples) {
    let id = format!("replay-{run}");
    let (_, secs) = episode(c, RUNC, &id, actions);
    samples.push("replay", secs);
    eprintln!("  replay {secs:.2}s");
    remove(c, &id);
}

/// containerd's own: `ctr c checkpoint --rw --task` of the episode under runc, more changes,
/// the task crashes, `ctr c restore --rw --live` into a new container (eagerly, with CRIU's
/// default network lock); timed until the task runs and until its memory is intact, checked
/// like Belayer's.
pub fn containerd_own(
    c: &Containerd,
    run: u32,
    actions: &[Action],
    samples: &mut Samples,
    checks: &mut Checks,
) {
    let id = format!("ctrd-{run}");
    let restored = format!("ctrd-{run}-restored");
    let image = format!("belayer.local/bench-checkpoint:{run}");
    let (s, _) = episode(c, RUNC, &id, actions);

    let start = Instant::now();
    let out = c.ctr(&["containers", "checkpoint", "--rw", "--task", &id, &image]);
    let checkpoint = start.elapsed().as_secs_f64();
    checks.record(
        "containerd",
        run,
        &id,
        "ctr c checkpoint succeeds",
        out.code == 0,
        out.stderr.trim(),
    );
    s.run(&episode::more_changes());
    crash(c, &id);
    remove(c, &id);

    let start = Instant::now();
    let out = c.ctr(&["containers", "restore", "--rw", "--live", &restored, &image]);
    let running = out.code == 0 && wait_status(c, &[&restored], "RUNNING", Duration::from_secs(60));
    let restore = start.elapsed().as_secs_f64();
    checks.record(
        "containerd",
        run,
        &restored,
        "ctr c restore runs the task",
        running,
        format!("{out:?}"),
    );
    if running {
        let s = Sandbox::attach(c, &restored);
        let exec = |script: &str| s.exec(script, None);
        let pid = task_pid(c, &restored);
        let digest = check::digest_after_restore(checks, "containerd", run, &restored, pid, &exec);
        let memory = start.elapsed().as_secs_f64();
        samples.push("containerd_checkpoint", checkpoint);
        samples.push("containerd_restore", restore);
        samples.push("containerd_restore_memory", memory);
        eprintln!(
            "  containerd checkpoint {checkpoint:.2}s restore {restore:.2}s (memory intact {memory:.2}s)"
        );
        check::restored(checks, "containerd", run, &restored, &digest, &exec);
    }
    remove(c, &restored);
    let _ = c.ctr(&["images", "rm", &image]);
}
