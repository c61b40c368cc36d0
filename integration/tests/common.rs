//! Helpers shared by the end-to-end suites.
#![allow(dead_code)]

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use belayer_integration::episode::{Sandbox, is_contiguous};
use belayer_integration::{Containerd, Out};

pub const BELAYER: &str = "io.containerd.belayer.v1";
pub const RUNC: &str = "io.containerd.runc.v2";
pub const BUSYBOX: &str = "belayer.local/busybox:latest";

/// The tests of one suite run side by side (`--test-threads 2` in `scripts/test`). A test that
/// times Belayer against a baseline run before it must have the machine to itself for both runs:
/// otherwise a neighbour that checkpoints or forks during one of them and not the other decides
/// the comparison. Every test of such a suite holds one of these guards.
static MACHINE: RwLock<()> = RwLock::new(());

/// Shares the machine with the suite's other sharing tests; waits while a timed one runs.
pub fn machine_shared() -> RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(PoisonError::into_inner)
}

/// Has the machine to itself among the suite's tests once those running have finished.
pub fn machine_alone() -> RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(PoisonError::into_inner)
}

/// Lines of a command's output with what legitimately differs between runs removed: log
/// timestamps, the container id, terminal carriage returns and NULs (`script` prints `^@`), and
/// ctr's log of a terminal resize that raced with the process's exit.
pub fn normalize(text: &str, id: &str) -> Vec<String> {
    text.replace(['\r', '\0'], "")
        .replace("^@", "")
        .lines()
        .map(|l| {
            let l = match l.find("level=") {
                Some(i) if l.starts_with("time=") => &l[i..],
                _ => l,
            };
            l.replace(id, "ID")
        })
        .filter(|l| !l.trim().is_empty() && !l.contains("resize pty"))
        .collect()
}

/// An observation of one command: its exit code and normalized output.
pub fn observe(label: &str, out: &Out, id: &str) -> Vec<String> {
    let mut v = vec![format!("{label}: code={}", out.code)];
    v.extend(
        normalize(&out.stdout, id)
            .into_iter()
            .map(|l| format!("{label} out: {l}")),
    );
    v.extend(
        normalize(&out.stderr, id)
            .into_iter()
            .map(|l| format!("{label} err: {l}")),
    );
    v
}

/// A shell loop appending 1, 2, 3, … to `/counter`, 100 a second: shows whether a container runs.
pub const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i >> /counter; sleep 0.01; done";

/// [`COUNTER`] into `/work/counter`, where
/// [`Sandbox::counter`](belayer_integration::episode::Sandbox::counter) reads it (the episode's
/// own counter file), making `/work` first: after a restore the file reads 1..N exactly when
/// memory and filesystem agree.
pub const COUNTER_LOOP: &str =
    "mkdir -p /work; i=0; while true; do i=$((i+1)); echo $i >> /work/counter; sleep 0.01; done";

/// `ctr tasks ls`'s columns after the id for task `id` (pid, status); empty when it is not listed.
pub fn task_row(c: &Containerd, id: &str) -> Vec<String> {
    task_row_in(c, &c.ns, id)
}

/// [`task_row`] in namespace `ns` (docker's is `moby`).
pub fn task_row_in(c: &Containerd, ns: &str, id: &str) -> Vec<String> {
    c.task_row_in(ns, id)
}

/// The status column of `ctr tasks ls` for `id`.
pub fn task_status(c: &Containerd, id: &str) -> String {
    task_row(c, id)
        .into_iter()
        .nth(1)
        .unwrap_or_else(|| "ABSENT".into())
}

/// The pid column of `ctr tasks ls` for `id` (empty when it is not listed).
pub fn task_pid(c: &Containerd, id: &str) -> String {
    task_row(c, id).into_iter().next().unwrap_or_default()
}

/// Polls until `f` holds, at most `limit`.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// Starts a detached container running `args`.
#[track_caller]
pub fn run_detached(c: &Containerd, runtime: &str, id: &str, args: &[&str]) {
    run_detached_with(c, runtime, &[], id, args);
}

/// [`run_detached`] with more `ctr run` flags (annotations, resources) before the image.
#[track_caller]
pub fn run_detached_with(c: &Containerd, runtime: &str, flags: &[&str], id: &str, args: &[&str]) {
    let mut a = vec!["run", "-d", "--runtime", runtime];
    a.extend_from_slice(flags);
    a.extend([BUSYBOX, id]);
    a.extend_from_slice(args);
    c.ctr(&a).ok();
}

/// Asserts that task `id`'s init is in containerd's cgroup for it, `/<namespace>/<id>`, in every
/// hierarchy it is in (cgroup v1's several, v2's one): not in the cgroup of the container it was
/// restored from.
#[track_caller]
pub fn assert_in_own_cgroup(c: &Containerd, id: &str) {
    let pid = task_pid(c, id);
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let own = format!("/{}/{id}", c.ns);
    let wrong: Vec<&str> = cgroups.lines().filter(|l| !l.ends_with(&own)).collect();
    assert!(
        !cgroups.is_empty() && wrong.is_empty(),
        "{id}'s init ({pid}) is outside {own}: {wrong:?}"
    );
}

/// Kills task `id` (SIGKILL: a crash) and waits until containerd sees it stopped.
#[track_caller]
pub fn crash(c: &Containerd, id: &str) {
    c.ctr(&["tasks", "kill", "-s", "9", id]).ok();
    assert!(
        wait_until(Duration::from_secs(10), || task_status(c, id) == "STOPPED"),
        "{id} did not stop"
    );
}

/// Kills and removes a task and its container, asserting each step works.
#[track_caller]
pub fn remove(c: &Containerd, id: &str) {
    let _ = c.ctr(&["tasks", "kill", "-s", "9", id]);
    assert!(
        wait_until(Duration::from_secs(10), || task_status(c, id) == "STOPPED"),
        "{id} did not stop"
    );
    c.ctr(&["tasks", "rm", id]).ok();
    c.ctr(&["containers", "rm", id]).ok();
}

/// Leaves a python3 in `s` stuck in vfork until something opens `/gate` for writing: glibc's
/// posix_spawn clones with CLONE_VFORK, and a file action opening that FIFO (nobody writes it)
/// holds the child before its exec, so the parent waits. CRIU cannot stop such a parent.
#[track_caller]
pub fn hold_in_vfork(s: &belayer_integration::episode::Sandbox) {
    let holder = "import os, time; os.posix_spawn('/bin/true', ['true'], os.environ, \
                  file_actions=[(os.POSIX_SPAWN_OPEN, 0, '/gate', os.O_RDONLY, 0)]); \
                  time.sleep(3600)";
    let started = s.exec(
        &format!("mkfifo /gate && (nohup python3 -c \"{holder}\" > /dev/null 2>&1 &)"),
        None,
    );
    assert_eq!(started.code, 0, "{started:?}");
    assert!(
        wait_until(Duration::from_secs(20), || !python_in_vfork(s).is_empty()),
        "python3 never got stuck in vfork"
    );
}

/// The python3 tasks of `s` waiting for a vfork child to exec, as `pid wchan` lines. Only
/// python3: the shell loops of a test vfork too, for a moment each time.
pub fn python_in_vfork(s: &belayer_integration::episode::Sandbox) -> String {
    // The names criu_bridge::blocked knows a vfork wait by, across kernel versions.
    s.exec(
        "for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = python3 ] || continue; \
         w=$(cat $p/wchan 2>/dev/null); \
         echo \"$w\" | grep -qxE 'kernel_clone|_do_fork|do_fork|wait_for_vfork_done' \
         && echo \"${p#/proc/} $w\"; done; true",
        None,
    )
    .stdout
}

/// Lets the task [`hold_in_vfork`] holds go on.
#[track_caller]
pub fn release_vfork(s: &belayer_integration::episode::Sandbox) {
    // Opening the FIFO is what the child waits for; writing to it could meet SIGPIPE, once the
    // child has exec'd `true` and that has exited.
    let opened = s.exec(": > /gate", None);
    assert_eq!(opened.code, 0, "{opened:?}");
    assert!(
        wait_until(Duration::from_secs(10), || python_in_vfork(s).is_empty()),
        "python3 still in vfork after its child got the FIFO: {}",
        python_in_vfork(s)
    );
}

/// Lines in `a` not in `b`, for readable failures.
pub fn diff(a: &[String], b: &[String]) -> Vec<String> {
    let bs: std::collections::HashSet<&String> = b.iter().collect();
    a.iter()
        .filter(|l| !bs.contains(l))
        .take(20)
        .cloned()
        .collect()
}

#[track_caller]
pub fn assert_same_tree(label: &str, expected: &[String], got: &[String]) {
    assert!(
        expected == got,
        "{label}: filesystem differs from the checkpoint instant\n  missing or changed: {:#?}\n  unexpected: {:#?}",
        diff(expected, got),
        diff(got, expected)
    );
}

#[track_caller]
pub fn checkpoint(c: &Containerd, id: &str) -> String {
    let out = c.belayer(&["checkpoint", id]);
    assert_eq!(out.code, 0, "checkpoint {id}: {out:?}");
    out.stdout.trim().to_string()
}

#[track_caller]
pub fn restore(c: &Containerd, id: &str, cp: Option<&str>) {
    let mut args = vec!["restore", id];
    if let Some(cp) = cp {
        args.extend(["--checkpoint", cp]);
    }
    let out = c.belayer(&args);
    assert_eq!(out.code, 0, "restore {id} {cp:?}: {out:?}");
    assert_eq!(task_status(c, id), "RUNNING");
}

/// The processes of a restored episode: memory intact, counter consistent with the files.
#[track_caller]
pub fn assert_processes_intact(s: &Sandbox) {
    let (now, at_start) = s.holder_digests();
    assert!(
        !now.is_empty() && now == at_start,
        "background process memory changed: {now:?} vs {at_start:?}"
    );
    let first = s.counter();
    assert!(
        is_contiguous(&first),
        "counter file is not exactly 1..N after restore (memory and filesystem disagree): {:?}…",
        &first[first.len().saturating_sub(5)..]
    );
    std::thread::sleep(Duration::from_millis(300));
    let later = s.counter();
    assert!(
        later.len() > first.len() && is_contiguous(&later),
        "the counter process does not continue"
    );
}

/// `belayer status` of container `id`, as JSON.
#[track_caller]
pub fn status(c: &Containerd, id: &str) -> serde_json::Value {
    serde_json::from_str(&c.belayer(&["status", id]).ok().stdout).expect("status JSON")
}

/// Runs `tar` with `args`; panics with its stderr if it fails.
#[track_caller]
pub fn tar(args: &[&str]) {
    let out = std::process::Command::new("tar")
        .args(args)
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "tar {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Kills node `a` whole, as a node loss does: the processes of its container `id` (all of them:
/// its init is its PID namespace's init), its shims and containerd; its store moves out of reach
/// (`<store>.lost`, returned, for the caller to remove).
pub fn kill_node(a: &Containerd, id: &str) -> std::path::PathBuf {
    kill_node_in(a, &a.ns, &[id])
}

/// [`kill_node`] for the containers `ids` of namespace `ns` (docker's is `moby`; a pod's are
/// its sandbox and its containers, in `k8s.io`).
pub fn kill_node_in(a: &Containerd, ns: &str, ids: &[&str]) -> std::path::PathBuf {
    let inits: Vec<i64> = ids
        .iter()
        .map(|id| {
            task_row_in(a, ns, id)
                .first()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no init pid of {id}"))
        })
        .collect();
    a.kill_daemon(a.pid());
    for shim in a.shim_pids() {
        let _ = belayer_integration::sigkill(shim.into());
    }
    for init in inits {
        let _ = belayer_integration::sigkill(init);
        assert!(
            wait_until(Duration::from_secs(10), || !std::path::Path::new(&format!(
                "/proc/{init}"
            ))
            .exists()
                || std::fs::read_to_string(format!("/proc/{init}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))),
            "the container's init {init} outlived its node"
        );
    }
    let lost = a.store.with_extension("lost");
    std::fs::rename(&a.store, &lost).expect("move node A's store away");
    lost
}
