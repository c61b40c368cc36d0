//! Stopped tasks and the frozen window's bound (issue: "a stopped process freezes its sandbox
//! forever"). A task stopped by SIGSTOP or job control is checkpointed and restored still stopped,
//! and runs on SIGCONT. Under the cgroup v1 freezer CRIU cannot seize it from a frozen container
//! (its seize waits in the kernel until the container thaws), so there CRIU seizes the tasks one
//! by one, the cgroup thawed meanwhile, and freezes it again before the filesystem is captured;
//! a task another process traces is refused before anything is frozen. Whatever CRIU does, a
//! checkpoint never keeps its container frozen past `frozen_limit_ms`.

mod common;

use std::time::{Duration, Instant};

use belayer_integration::{Containerd, Flavor, Scratch};
use common::*;

/// The container's init: a `sleep 1000` stopped at once, and a shell that goes on.
const WITH_STOPPED: &str = "sleep 1000 & kill -STOP $!; while :; do sleep 1; done";

/// [`WITH_STOPPED`] whose shell keeps `i` in memory and appends it to `/counter`: after a restore
/// the file reads exactly 1..N only if memory and filesystem are of one instant.
const STOPPED_AND_COUNTER: &str = "sleep 1000 & kill -STOP $!; i=0; while :; do i=$((i+1)); echo $i >> /counter; sleep 0.01; done";

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

/// Asserts that container `id`'s init has exactly one stopped descendant, continues it with
/// SIGCONT, and waits until it runs `sleep 1000`.
#[track_caller]
fn assert_stopped_then_continue(c: &Containerd, id: &str) {
    let init = task_pid(c, id);
    let tasks = descendants(&init);
    assert_eq!(
        tasks.iter().filter(|(_, s)| *s == 'T').count(),
        1,
        "{id}: not one stopped task: {tasks:?}"
    );
    let stopped = stopped_task(c, id);
    let pid: i32 = stopped.parse().unwrap();
    // SAFETY: kill(2) on a pid read from /proc just now; at worst it names no process.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(
        wait_until(Duration::from_secs(5), || {
            descendants(&init).iter().any(|(p, s)| {
                *p == stopped
                    && *s == 'S'
                    && std::fs::read(format!("/proc/{p}/cmdline"))
                        .is_ok_and(|a| a == b"sleep\x001000\x00")
            })
        }),
        "{id}: the stopped task did not continue into `sleep 1000`: {:?}",
        descendants(&init)
    );
}

/// Asserts that container `id`'s `/counter` reads exactly 1..N, N growing: the shell's `i`
/// (memory) and the file (filesystem) came back from one instant.
#[track_caller]
fn assert_counter_continues(c: &Containerd, id: &str) {
    let read = |exec: &str| {
        let out = c.ctr(&["tasks", "exec", "--exec-id", exec, id, "cat", "/counter"]);
        assert_eq!(out.code, 0, "cat /counter in {id}: {out:?}");
        out.stdout
            .lines()
            .map(|l| l.parse::<u64>().unwrap())
            .collect::<Vec<_>>()
    };
    let first = read("count1");
    std::thread::sleep(Duration::from_millis(300));
    let lines = read("count2");
    assert!(
        lines.len() > first.len(),
        "{id}: the counter does not advance"
    );
    let expected: Vec<u64> = (1..=lines.len() as u64).collect();
    assert!(
        lines == expected,
        "{id}: /counter is not 1..{}: memory and filesystem of different instants (first \
         break at line {:?}; it reads {:?})",
        lines.len(),
        lines.iter().zip(&expected).position(|(a, b)| a != b),
        &lines[..lines.len().min(16)]
    );
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

/// The dump log of checkpoint `cp` of `id`.
#[track_caller]
fn dump_log(c: &Containerd, id: &str, cp: &str) -> String {
    let info: serde_json::Value =
        serde_json::from_str(&c.belayer(&["inspect", id, cp]).ok().stdout).expect("inspect JSON");
    let path = std::path::Path::new(info["path"].as_str().expect("inspect: path"));
    std::fs::read_to_string(path.join("criu/dump.log"))
        .unwrap_or_else(|e| panic!("dump.log of {id} checkpoint {cp}: {e}"))
}

/// The issue's own steps on this (cgroup v1) machine, now a round trip. A container with one
/// stopped process: while a process exec'd into it runs, a checkpoint is refused at once naming
/// both (CRIU's one-by-one seize would let the exec run through the dump) and the container
/// runs on; once it ends, a requested checkpoint goes through — CRIU seizes the tasks one by
/// one — and the container runs on, the task still stopped. Restored in place and forked from
/// that checkpoint, the task is stopped again, the counter is of the checkpoint's instant, and
/// SIGCONT continues the task.
#[test]
fn a_stopped_task_is_checkpointed_restored_and_forked_stopped_on_cgroup_v1() {
    assert!(
        !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        "this test is for a cgroup v1 host"
    );
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "f1", &["sh", "-c", STOPPED_AND_COUNTER]);
    let stopped = stopped_task(&c, "f1");

    let out = c.ctr(&[
        "tasks",
        "exec",
        "--detach",
        "--exec-id",
        "long",
        "f1",
        "sleep",
        "1000",
    ]);
    assert_eq!(out.code, 0, "exec: {out:?}");
    let out = c.belayer(&["checkpoint", "f1"]);
    assert_eq!(out.code, 6, "a checkpoint beside a running exec: {out:?}");
    assert!(
        out.stderr.contains(&format!("task {stopped} ("))
            && out.stderr.contains("exec'd into the container, runs"),
        "the refusal does not name the stopped task {stopped} and the exec: {:?}",
        out.stderr
    );
    assert_eq!(task_status(&c, "f1"), "RUNNING");
    assert_eq!(c.belayer(&["checkpoints", "f1"]).stdout.trim(), "");
    c.ctr(&["tasks", "kill", "--exec-id", "long", "-s", "9", "f1"])
        .ok();
    std::thread::sleep(Duration::from_millis(300));

    let cp = checkpoint(&c, "f1");
    assert!(
        dump_log(&c, "f1", &cp).contains("unfreezing cgroup for plugin compatibility"),
        "CRIU did not seize the tasks one by one"
    );
    assert_eq!(task_status(&c, "f1"), "RUNNING");
    assert_eq!(
        descendants(&task_pid(&c, "f1"))
            .into_iter()
            .find(|(p, _)| *p == stopped),
        Some((stopped.clone(), 'T')),
        "the checkpoint continued the stopped task"
    );
    exec_echo(&c, "f1", "e1");
    assert_counter_continues(&c, "f1");

    // A fork of it: the task stopped there too, the counter of the checkpoint's instant.
    let out = c.belayer(&["fork", "f1", "--checkpoint", &cp, "--count", "1"]);
    assert_eq!(out.code, 0, "fork: {out:?}");
    let fork = out.stdout.trim().to_string();
    assert_eq!(task_status(&c, &fork), "RUNNING");
    assert_counter_continues(&c, &fork);
    assert_stopped_then_continue(&c, &fork);
    exec_echo(&c, &fork, "e2");
    remove(&c, &fork);

    // In place, after a crash.
    crash(&c, "f1");
    restore(&c, "f1", Some(&cp));
    assert_counter_continues(&c, "f1");
    assert_stopped_then_continue(&c, "f1");
    exec_echo(&c, "f1", "e3");
    remove(&c, "f1");
}

/// Automatic checkpoints of a container with a stopped task (the first steps): every
/// exec completes, an automatic checkpoint is taken with the task stopped, and the recovery
/// after a crash brings it back stopped.
#[test]
fn a_stopped_task_is_checkpointed_automatically_and_recovered_stopped() {
    let c = Containerd::start(Flavor::V2);
    run_detached_with(
        &c,
        BELAYER,
        &[
            "--annotation",
            "io.belayer.checkpoint=auto",
            "--annotation",
            "io.belayer.recover=auto",
        ],
        "a1",
        &["sh", "-c", STOPPED_AND_COUNTER],
    );
    stopped_task(&c, "a1");
    let checkpoints = || c.belayer(&["checkpoints", "a1"]).stdout;
    let mut taken = false;
    for e in ["e1", "e2", "e3"] {
        // Each exec's end may start an automatic checkpoint; the next exec must not hang on it.
        exec_echo(&c, "a1", e);
        assert_eq!(task_status(&c, "a1"), "RUNNING", "after {e}");
        c.belayer(&["hint", "a1", "llm-start", "--expected-ms", "2000"])
            .ok();
        if wait_until(Duration::from_secs(8), || !checkpoints().trim().is_empty()) {
            taken = true;
            break;
        }
    }
    assert!(
        taken,
        "no automatic checkpoint of a container with a stopped task"
    );
    std::thread::sleep(Duration::from_millis(300));
    let init: i32 = task_pid(&c, "a1").parse().unwrap();
    // SAFETY: kill(2) on the init's pid as ctr lists it.
    assert_eq!(unsafe { libc::kill(init, libc::SIGKILL) }, 0);
    assert!(
        wait_until(Duration::from_secs(30), || {
            status(&c, "a1")["recoveries"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
        }) && wait_until(Duration::from_secs(10), || task_status(&c, "a1")
            == "RUNNING"),
        "no recovery"
    );
    eprintln!(
        "DEBUG checkpoints: {}",
        c.belayer(&["checkpoints", "a1"]).stdout
    );
    eprintln!(
        "DEBUG inspect: {}",
        c.belayer(&["inspect", "a1", "1"]).stdout
    );
    eprintln!("DEBUG store: {:?}", std::process::Command::new("sh").arg("-c").arg(format!("rm -rf /tmp/dbgcp; cp -a {} /tmp/dbgcp; find /tmp/dbgcp -name counter | while read f; do echo $f; tr '\\n' ' ' < $f; echo; done", c.checkpoints_dir("a1").display())).output());
    assert_counter_continues(&c, "a1");
    assert_stopped_then_continue(&c, "a1");
    remove(&c, "a1");
}

/// A task another process traces (here: this test, as a debugger would) cannot be taken by
/// CRIU: the checkpoint is refused at once naming the task and its tracer, nothing is frozen,
/// and once the tracer lets go the checkpoint goes through.
#[test]
fn a_traced_task_is_refused_before_anything_is_frozen() {
    let c = Containerd::start(Flavor::V2);
    run_detached(
        &c,
        BELAYER,
        "t1",
        &["sh", "-c", "sleep 1000 & while :; do sleep 1; done"],
    );
    let init = task_pid(&c, "t1");
    let mut sleeper = None;
    wait_until(Duration::from_secs(10), || {
        sleeper = descendants(&init).into_iter().map(|(p, _)| p).find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|a| a == b"sleep\x001000\x00")
        });
        sleeper.is_some()
    });
    let sleeper: i32 = sleeper.expect("no sleep 1000").parse().unwrap();
    // The tracer is the thread that attaches; it lets go when it ends.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (seized, is_seized) = std::sync::mpsc::channel::<(i32, i32)>();
    let tracer = std::thread::spawn(move || {
        let null = std::ptr::null_mut::<libc::c_void>();
        // SAFETY: PTRACE_SEIZE reads no memory (addr and data null); at worst it fails.
        let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, sleeper, null, null) };
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        seized.send((rc as i32, tid)).unwrap();
        let _ = released.recv();
    });
    let (rc, tid) = is_seized.recv().unwrap();
    assert_eq!(rc, 0, "PTRACE_SEIZE of {sleeper}");

    let out = c.belayer(&["checkpoint", "t1"]);
    assert_ne!(out.code, 0, "a checkpoint with a traced task: {out:?}");
    assert!(
        out.stderr
            .contains(&format!("task {sleeper} (sleep) is traced by pid {tid}"))
            && out.stderr.contains("nothing was frozen"),
        "the refusal does not name the traced task {sleeper}: {:?}",
        out.stderr
    );
    assert_eq!(task_status(&c, "t1"), "RUNNING");
    assert_eq!(c.belayer(&["checkpoints", "t1"]).stdout.trim(), "");
    exec_echo(&c, "t1", "e1");

    release.send(()).unwrap();
    tracer.join().unwrap();
    checkpoint(&c, "t1");
    remove(&c, "t1");
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

/// A shell appending to a 4 MB log in a loop, with a stopped child; an append that fails is
/// written to `/errors`.
const STOPPED_AND_APPENDS: &str = "head -c 4000000 /dev/zero > /log; sleep 1000 & kill -STOP $!; \
     i=0; while :; do i=$((i+1)); { echo $i >> /log; } 2>>/errors || echo lost $i >> /errors; done";

/// The line CI lost (2026-12, `a_stopped_task_is_checkpointed_automatically_and_recovered_
/// stopped`: /counter read 1..8, 10): a task restored stopped stops again once CRIU lets it go,
/// and that fresh stop sends its parent a SIGCHLD. CRIU let the parent go first, so the signal
/// came while the shell ran on — inside the open() of its next `echo >> /log`, an overlayfs
/// copy-up of the log the restore left in a lower layer — and busybox sh's handler has no
/// SA_RESTART: "can't create /log: Interrupted system call", a line no run without a restore
/// loses. Belayer's CRIU (scripts/criu-patches/0001) lets the stopped tasks go first, waits for
/// their stop, then their parents, which take the queued SIGCHLD where the dump left them.
/// Six restores in place, each checked; before the patch about one in three lost a line (the
/// test failed 2 runs in 3 with three restores).
#[test]
fn a_task_restored_stopped_does_not_interrupt_its_parent() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "p1", &["sh", "-c", STOPPED_AND_APPENDS]);
    stopped_task(&c, "p1");
    let errors = |exec: &str| {
        let out = c.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            exec,
            "p1",
            "sh",
            "-c",
            "cat /errors 2>/dev/null; true",
        ]);
        assert_eq!(out.code, 0, "cat /errors: {out:?}");
        out.stdout
    };
    for round in 0..6 {
        let cp = checkpoint(&c, "p1");
        crash(&c, "p1");
        restore(&c, "p1", Some(&cp));
        std::thread::sleep(Duration::from_millis(200));
        let errors = errors(&format!("errors{round}"));
        assert!(
            errors.is_empty(),
            "restore {round}: the shell's appends failed after the restore: {errors:?}"
        );
        assert_eq!(
            descendants(&task_pid(&c, "p1"))
                .iter()
                .filter(|(_, s)| *s == 'T')
                .count(),
            1,
            "restore {round}: the child is not stopped"
        );
    }
    remove(&c, "p1");
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
