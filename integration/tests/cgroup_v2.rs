//! Belayer on a cgroup v2 (unified) host, the default of current distributions (Debian 12,
//! Ubuntu 22.04, Fedora, RHEL 9). These machines boot cgroup v1, so the test's containerd runs
//! in a mount namespace of its own over the kernel's cgroup2 hierarchy
//! ([`Containerd::start_unified`]): runc takes its v2 paths (`cgroup.freeze` for a pause and for
//! CRIU's freeze, the eBPF device filter), CRIU dumps and restores v2 cgroups, and the shim
//! reports v2 metrics. Here every controller stays bound to its v1 hierarchy, so containers run
//! without resource settings (`--cpu-shares 0`: ctr's default of 1024 needs `cpu.weight`); on a
//! host that boots v2 the test runs on the host's own hierarchy, controllers and all.

mod common;

use std::path::{Path, PathBuf};

use belayer_integration::Containerd;
use belayer_integration::episode::{self, Sandbox};
use common::*;

/// No resource settings: the v2 hierarchy of a v1 host has no controllers.
const NO_RESOURCES: &[&str] = &["--cpu-shares", "0"];

/// The cgroup2 directory of task `id`'s init, checked to hold it and to be containerd's
/// `/<namespace>/<id>`.
#[track_caller]
fn cgroup_of(c: &Containerd, id: &str) -> PathBuf {
    let pid: u32 = task_pid(c, id)
        .parse()
        .unwrap_or_else(|_| panic!("{id} has no pid"));
    let dir = c
        .cgroup_v2_dir(pid)
        .unwrap_or_else(|| panic!("{id}'s init ({pid}) is in no cgroup2 cgroup"));
    assert!(
        dir.ends_with(Path::new(&c.ns).join(id)),
        "{id}'s cgroup2 cgroup is {}, not /{}/{id}",
        dir.display(),
        c.ns
    );
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    assert!(
        procs.lines().any(|p| p == pid.to_string()),
        "{id}'s init ({pid}) is not in {}/cgroup.procs: {procs:?}",
        dir.display()
    );
    dir
}

/// `cgroup.freeze` of `dir`: "1" while frozen.
fn freeze(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("cgroup.freeze"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn checkpoint_restore_pause_and_forks_on_cgroup_v2() {
    let c = Containerd::start_unified();
    // containerd sees cgroup v2: /sys/fs/cgroup is the unified hierarchy's root for it.
    let root = c.cgroup_root();
    assert!(
        root.join("cgroup.controllers").is_file(),
        "containerd's /sys/fs/cgroup is not a cgroup2 hierarchy"
    );

    let s = Sandbox::start_with(&c, BELAYER, "v2", NO_RESOURCES);
    s.run(&episode::actions(16));
    let dir = cgroup_of(&c, "v2");
    // The shim reads v2's files for containerd's metrics (v1's names are `cpu.usage.total`…).
    let metrics = c.ctr(&["tasks", "metrics", "v2"]).ok().stdout;
    let usage: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cpu.usage_usec"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no v2 cpu.usage_usec in the metrics:\n{metrics}"));
    assert!(usage > 0, "the episode used no CPU:\n{metrics}");

    // A checkpoint freezes through cgroup.freeze and thaws again.
    let at_checkpoint = s.tree();
    let cp = checkpoint(&c, "v2");
    assert_eq!(task_status(&c, "v2"), "RUNNING");
    assert_eq!(freeze(&dir), "0", "{} left frozen", dir.display());

    // Crash, restore in place: files and processes from the checkpoint, back in the cgroup.
    s.run(&episode::more_changes());
    crash(&c, "v2");
    restore(&c, "v2", None);
    assert_same_tree("restore on cgroup v2", &at_checkpoint, &s.tree());
    assert_processes_intact(&s);
    let dir = cgroup_of(&c, "v2");
    assert_eq!(freeze(&dir), "0");

    // A paused container is checkpointed paused and stays paused.
    c.ctr(&["tasks", "pause", "v2"]).ok();
    assert_eq!(
        freeze(&dir),
        "1",
        "ctr pause did not freeze {}",
        dir.display()
    );
    checkpoint(&c, "v2");
    assert_eq!(task_status(&c, "v2"), "PAUSED");
    assert_eq!(
        freeze(&dir),
        "1",
        "the checkpoint thawed a paused container"
    );
    c.ctr(&["tasks", "resume", "v2"]).ok();
    assert_eq!(freeze(&dir), "0");
    assert_processes_intact(&s);

    // Forks: each in a cgroup of its own, each at the checkpoint, none seeing another's writes.
    let out = c.belayer(&["fork", "v2", "--checkpoint", &cp, "--count", "2"]);
    assert_eq!(out.code, 0, "fork: {out:?}");
    let forks: Vec<String> = out.stdout.lines().map(str::to_string).collect();
    assert_eq!(forks.len(), 2, "fork printed {:?}", out.stdout);
    for (k, f) in forks.iter().enumerate() {
        assert_eq!(task_status(&c, f), "RUNNING", "fork {f}");
        cgroup_of(&c, f);
        let fork = Sandbox::attach(&c, f);
        assert_same_tree(&format!("fork {f}"), &at_checkpoint, &fork.tree());
        assert_processes_intact(&fork);
        let wrote = fork.exec(&format!("echo {k} > /work/fork-{k}"), None);
        assert_eq!(wrote.code, 0, "{wrote:?}");
    }
    for (k, f) in forks.iter().enumerate() {
        let other = 1 - k;
        let seen = Sandbox::attach(&c, f).exec(&format!("test -e /work/fork-{other}"), None);
        assert_ne!(seen.code, 0, "fork {f} sees fork {other}'s write");
    }

    for id in forks.iter().map(String::as_str).chain(["v2"]) {
        remove(&c, id);
    }
    let left: Vec<_> = std::fs::read_dir(root.join(&c.ns))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
    let mounts = c.mounts_under_dir();
    assert!(
        mounts.is_empty(),
        "mounts left in containerd's namespace: {mounts:?}"
    );
}
