//! Stopped tasks and the frozen window's bound (issue: "a stopped process freezes its sandbox
//! forever"). A task stopped by SIGSTOP or job control: under the cgroup v1 freezer CRIU cannot
//! take it from a frozen container (its seize waits in the kernel until the container thaws), so a
//! checkpoint is refused before anything is frozen and the container runs on; under cgroup v2 it
//! is checkpointed and restored still stopped. Whatever CRIU does, a checkpoint never keeps its
//! container frozen past `frozen_limit_ms`.

mod common;

use std::time::{Duration, Instant};

use belayer_integration::{Containerd, Flavor};
use common::*;

/// The container's init: a `sleep 1000` stopped at once, and a shell that goes on.
const WITH_STOPPED: &str = "sleep 1000 & kill -STOP $!; while :; do sleep 1; done";

/// The pid and state letter of every descendant of `pid`.
fn descendants(pid: &str) -> Vec<(String, char)> {
    let mut found = Vec::new();
    let mut pending = vec![pid.to_string()];
    while let Some(p) = pending.pop() {
        let children =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        for c in children.split_whitespace() {
            let stat = std::fs::read_to_string(format!("/proc/{c}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .unwrap_or('?');
            found.push((c.to_string(), state));
            pending.push(c.to_string());
        }
    }
    found
}

/// The stopped descendant of container `id`'s init, once there is one.
#[track_caller]
fn stopped_task(c: &Containerd, id: &str) -> String {
    let init = task_pid(c, id);
    let mut stopped = None;
    wait_until(Duration::from_secs(10), || {
        stopped = descendants(&init)
            .into_iter()
            .find(|(_, s)| *s == 'T')
            .map(|(p, _)| p);
        stopped.is_some()
    });
    stopped.unwrap_or_else(|| panic!("no stopped task under {id}'s init {init}"))
}

#[track_caller]
fn exec_echo(c: &Containerd, id: &str, exec_id: &str) {
    let out = c.ctr(&["tasks", "exec", "--exec-id", exec_id, id, "echo", "hi"]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "hi\n"),
        "exec {exec_id} in {id}: {out:?}"
    );
}

/// The issue's own steps on this (cgroup v1) machine: automatic checkpoints on, one stopped
/// process. Every exec completes, a requested checkpoint is refused at once naming the task, the
/// container is never left frozen and takes signals; once the task is continued, checkpoints
/// and restores work again.
#[test]
fn a_stopped_task_never_leaves_its_container_frozen() {
    let c = Containerd::start(Flavor::V2);
    run_detached_with(
        &c,
        BELAYER,
        &["--annotation", "io.belayer.checkpoint=auto"],
        "f1",
        &["sh", "-c", WITH_STOPPED],
    );
    let stopped = stopped_task(&c, "f1");
    // Each exec's end may start an automatic checkpoint; the next exec must not hang on it.
    for e in ["e1", "e2", "e3"] {
        exec_echo(&c, "f1", e);
        assert_eq!(task_status(&c, "f1"), "RUNNING", "after {e}");
    }
    let out = c.belayer(&["checkpoint", "f1"]);
    assert_ne!(out.code, 0, "a checkpoint with a stopped task: {out:?}");
    assert!(
        out.stderr.contains(&format!("task {stopped} ("))
            && out.stderr.contains(") is stopped")
            && out.stderr.contains("nothing was frozen"),
        "the refusal does not name the stopped task {stopped}: {:?}",
        out.stderr
    );
    assert_eq!(task_status(&c, "f1"), "RUNNING");
    assert_eq!(c.belayer(&["checkpoints", "f1"]).stdout.trim(), "");
    exec_echo(&c, "f1", "e4");

    // Continued, it is checkpointed; a restore brings the container back with it.
    let pid: i32 = stopped.parse().unwrap();
    // SAFETY: kill(2) on a pid read from /proc just now; at worst it names no process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let cp = checkpoint(&c, "f1");
    crash(&c, "f1");
    restore(&c, "f1", Some(&cp));
    // The restored tasks have new pids on the host; the continued one runs `sleep 1000`.
    let init = task_pid(&c, "f1");
    let tasks = descendants(&init);
    assert!(
        tasks.iter().all(|(_, s)| *s != 'T')
            && tasks.iter().any(|(p, _)| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|a| a == b"sleep\x001000\x00")
            }),
        "the continued sleep is not back, running: {tasks:?}"
    );
    exec_echo(&c, "f1", "e5");
    remove(&c, "f1");
}

/// On a cgroup v2 host the freezer lets CRIU take a stopped task: a checkpoint of a container
/// with one goes through, the restored task is stopped again, and it runs on SIGCONT.
#[test]
fn a_stopped_task_is_checkpointed_and_restored_stopped_on_cgroup_v2() {
    let c = Containerd::start_unified();
    run_detached_with(
        &c,
        BELAYER,
        &["--cpu-shares", "0"],
        "s2",
        &["sh", "-c", WITH_STOPPED],
    );
    stopped_task(&c, "s2");
    let cp = checkpoint(&c, "s2");
    assert_eq!(task_status(&c, "s2"), "RUNNING");
    crash(&c, "s2");
    restore(&c, "s2", Some(&cp));
    // The restored tasks have new pids on the host.
    let init = task_pid(&c, "s2");
    let tasks = descendants(&init);
    assert_eq!(
        tasks.iter().filter(|(_, s)| *s == 'T').count(),
        1,
        "the restored sleep is not stopped: {tasks:?}"
    );
    let stopped = stopped_task(&c, "s2");
    let pid: i32 = stopped.parse().unwrap();
    // SAFETY: kill(2) on a pid read from /proc just now; at worst it names no process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(
        wait_until(Duration::from_secs(5), || {
            descendants(&init)
                .iter()
                .any(|(p, s)| *p == stopped && *s == 'S')
        }),
        "the restored sleep did not continue: {:?}",
        descendants(&init)
    );
    remove(&c, "s2");
}

/// A checkpoint whose CRIU does not finish is abandoned at `frozen_limit_ms`: CRIU is held on
/// purpose by a pre-dump action script (named by the container's own `org.criu.config`) that
/// sleeps while a flag file exists. The checkpoint fails within the bound naming the stall, the
/// container runs again (its counter advances, execs answer), nothing of CRIU is left, the next
/// checkpoint goes through, and a kill ends the container.
#[test]
fn a_checkpoint_frozen_past_its_bound_is_abandoned_and_the_container_thaws() {
    let held = HeldDump::new("frozen-bound");
    let limit = held.limit;
    let c = Containerd::start_configured(Flavor::V2, None, Some(held.config.clone()));
    run_detached_with(
        &c,
        BELAYER,
        &["--annotation", &held.annotation],
        "h1",
        &["sh", "-c", COUNTER],
    );
    let counter = |c: &Containerd| {
        c.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            "n",
            "h1",
            "wc",
            "-l",
            "/counter",
        ])
        .stdout
    };
    wait_until(Duration::from_secs(5), || !counter(&c).is_empty());

    let started = Instant::now();
    let out = c.belayer(&["checkpoint", "h1"]);
    let took = started.elapsed();
    println!(
        "held checkpoint: failed after {took:?} (bound {limit:?}): {}",
        out.stderr.trim()
    );
    assert_ne!(out.code, 0, "a held checkpoint: {out:?}");
    assert!(
        out.stderr.contains("abandoned after 2s frozen") && out.stderr.contains("CRIU (pid"),
        "the error does not say the checkpoint was abandoned: {:?}",
        out.stderr
    );
    // The bound, plus the shim's and CLI's own work (no speed target: a hang fails this).
    assert!(took < limit + Duration::from_secs(8), "held {took:?}");
    assert_eq!(task_status(&c, "h1"), "RUNNING");
    let before = counter(&c);
    std::thread::sleep(Duration::from_millis(300));
    assert_ne!(counter(&c), before, "the container is still frozen");
    exec_echo(&c, "h1", "after");
    let script_name = held.script.display().to_string();
    assert!(
        wait_until(Duration::from_secs(5), || {
            belayer_integration::leaks::pids_mentioning(&held.sleeper).is_empty()
                && belayer_integration::leaks::pids_mentioning(&script_name).is_empty()
        }),
        "CRIU's action script outlived the abandoned checkpoint"
    );
    assert_eq!(c.belayer(&["checkpoints", "h1"]).stdout.trim(), "");

    // Not held, the next checkpoint goes through: nothing was left locked or frozen.
    std::fs::remove_file(&held.hold).unwrap();
    let cp = checkpoint(&c, "h1");
    assert_eq!(c.belayer(&["checkpoints", "h1"]).stdout.trim(), cp);
    remove(&c, "h1");
}

/// An automatic checkpoint abandoned at the bound backs off: the execs that follow run without
/// a new freeze (CRIU's pre-dump script, which logs each dump, is not run again), and the
/// container stays up.
#[test]
fn an_abandoned_automatic_checkpoint_backs_off() {
    let held = HeldDump::new("frozen-backoff");
    let c = Containerd::start_configured(Flavor::V2, None, Some(held.config.clone()));
    run_detached_with(
        &c,
        BELAYER,
        &[
            "--annotation",
            &held.annotation,
            "--annotation",
            "io.belayer.checkpoint=auto",
        ],
        "b1",
        &["sh", "-c", "while :; do sleep 1; done"],
    );
    // The first exec's end starts an automatic checkpoint; its dump is held, then abandoned.
    exec_echo(&c, "b1", "first");
    assert!(
        wait_until(Duration::from_secs(20), || held.dumps() == 1),
        "no automatic checkpoint began a dump"
    );
    assert!(
        wait_until(held.limit + Duration::from_secs(8), || {
            belayer_integration::leaks::pids_mentioning(&held.sleeper).is_empty()
        }),
        "the held dump was not abandoned"
    );
    for e in ["second", "third", "fourth"] {
        exec_echo(&c, "b1", e);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        held.dumps(),
        1,
        "an automatic checkpoint froze the container again"
    );
    assert_eq!(task_status(&c, "b1"), "RUNNING");
    remove(&c, "b1");
}

/// A Belayer config with a 2 s frozen bound, and a CRIU config (for a container's own
/// `org.criu.config` annotation) whose pre-dump action script logs each dump and, while the
/// `hold` file exists, sleeps for 10 minutes: a dump that does not finish.
struct HeldDump {
    _scratch: Scratch,
    limit: Duration,
    config: std::path::PathBuf,
    script: std::path::PathBuf,
    hold: std::path::PathBuf,
    log: std::path::PathBuf,
    annotation: String,
    /// The held dump's `sleep` command line, unique to this test.
    sleeper: String,
}

impl HeldDump {
    fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new(name);
        let dir = scratch.path();
        let limit = Duration::from_millis(2000);
        let config = dir.join("belayer.toml");
        std::fs::write(
            &config,
            format!("frozen_limit_ms = {}\n", limit.as_millis()),
        )
        .unwrap();
        let (hold, log) = (dir.join("hold"), dir.join("dumps.log"));
        let script = dir.join("hold-pre-dump.sh");
        let sleeper = format!("sleep 600.{}{}", std::process::id(), name.len());
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n[ \"$CRTOOLS_SCRIPT_ACTION\" = pre-dump ] || exit 0\n\
                 echo dump >> {}\n[ -e {} ] && exec {sleeper}\nexit 0\n",
                log.display(),
                hold.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let criu_conf = dir.join("criu.conf");
        std::fs::write(&criu_conf, format!("action-script {}\n", script.display())).unwrap();
        std::fs::write(&hold, "").unwrap();
        let annotation = format!("org.criu.config={}", criu_conf.display());
        Self {
            _scratch: scratch,
            limit,
            config,
            script,
            hold,
            log,
            annotation,
            sleeper,
        }
    }

    /// Dumps begun so far.
    fn dumps(&self) -> usize {
        std::fs::read_to_string(&self.log).map_or(0, |l| l.lines().count())
    }
}
