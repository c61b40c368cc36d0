//! Full checkpoint and restore on the reference episode (real containerd, runc, CRIU, overlayfs):
//! the filesystem tree and the processes come back as they were at the checkpoint instant, in
//! place and as forks; chains of checkpoints each restore to their own state, a long chain too,
//! compacted in the background while checkpoints go on.

mod common;

use std::time::Duration;

use belayer_integration::episode::{self, Sandbox, is_contiguous};
use belayer_integration::{Containerd, Flavor, signal};
use common::*;

#[test]
fn episode_restores_whole_in_place() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "episode");
    s.run(&episode::actions(300));
    let at_checkpoint = s.tree();
    let cp = checkpoint(&c, "episode");
    assert_eq!(
        c.belayer(&["checkpoints", "episode"]).stdout,
        format!("{cp}\n")
    );
    let info: serde_json::Value =
        serde_json::from_str(&c.belayer(&["inspect", "episode", &cp]).ok().stdout)
            .expect("inspect JSON");
    for key in ["path", "parent", "sizes", "timings"] {
        assert!(info.get(key).is_some(), "inspect lacks {key}: {info}");
    }
    assert!(
        info["sizes"]["criu_bytes"].as_u64().unwrap_or(0) > 300 << 20,
        "CRIU images smaller than the 300 MB held: {info}"
    );

    s.run(&episode::more_changes());
    assert_ne!(s.tree(), at_checkpoint, "the later changes changed nothing");

    // Dead: the sandbox crashed.
    crash(&c, "episode");
    restore(&c, "episode", None);
    assert_same_tree("restore of a dead container", &at_checkpoint, &s.tree());
    assert_processes_intact(&s);
    assert_eq!(
        s.exec(
            "python3 -c 'import belayer_demo; print(belayer_demo.answer())'",
            None
        )
        .stdout,
        "42\n"
    );

    // Alive: roll a running container back.
    s.run(&episode::more_changes());
    restore(&c, "episode", Some(&cp));
    assert_same_tree("restore of a live container", &at_checkpoint, &s.tree());
    assert_processes_intact(&s);
    // The restores ran lazily (the machine recipe supports it): a lazy-pages daemon served them.
    let work = c.task_work_dir("episode");
    assert!(
        work.join(format!("restore-{cp}/lazy-pages.log")).is_file(),
        "no lazy-pages daemon ran for the restore (see {})",
        work.display()
    );
    // And CRIU locked the network through nftables (the `network_lock = "auto"` default on a
    // machine that supports it), read from the configuration file the shim put in the bundle.
    let log =
        std::fs::read_to_string(work.join(format!("restore-{cp}/restore.log"))).unwrap_or_default();
    let conf = log
        .lines()
        .find_map(|l| l.split_once("Parsing config file ").map(|(_, p)| p.trim()))
        .filter(|p| p.ends_with("belayer-criu.conf"))
        .unwrap_or_else(|| {
            panic!(
                "CRIU read no Belayer configuration (see {})",
                work.display()
            )
        });
    let text = std::fs::read_to_string(conf).unwrap_or_default();
    assert!(
        text.lines().any(|l| l == "network-lock nftables"),
        "{conf} does not choose nftables:\n{text}"
    );

    // A checkpoint at once after a lazy restore waits for the memory fill: restored from it,
    // the 300 MB holder's memory is still whole.
    restore(&c, "episode", Some(&cp));
    let again = checkpoint(&c, "episode");
    crash(&c, "episode");
    restore(&c, "episode", Some(&again));
    assert_same_tree(
        "restore of a checkpoint taken during a lazy fill",
        &at_checkpoint,
        &s.tree(),
    );
    assert_processes_intact(&s);
    remove(&c, "episode");
}

#[test]
fn chain_of_three_and_four_forks() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "chain");
    s.run(&episode::actions(16));
    let mut states = Vec::new();
    for k in 1..=3 {
        s.run(&[]);
        let script = format!(
            "echo {k} > /work/state && rm -rf /work/gen{} && mkdir /work/gen{k} && echo {k} > /work/gen{k}/f",
            k - 1
        );
        assert_eq!(s.exec(&script, None).code, 0);
        let tree = s.tree();
        let id = checkpoint(&c, "chain");
        states.push((id, tree));
    }
    let ids: Vec<&str> = states.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        c.belayer(&["checkpoints", "chain"]).stdout,
        format!("{}\n", ids.join("\n")),
        "checkpoints not listed oldest first"
    );
    let parents: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| {
            serde_json::from_str::<serde_json::Value>(
                &c.belayer(&["inspect", "chain", id]).ok().stdout,
            )
            .unwrap()["parent"]
                .clone()
        })
        .collect();
    assert_eq!(
        parents,
        vec![serde_json::Value::Null, ids[0].into(), ids[1].into()],
        "chain parents"
    );
    // Each checkpoint of the chain restores to its own state, in any order.
    for k in [0usize, 2, 1] {
        let (id, tree) = &states[k];
        restore(&c, "chain", Some(id));
        assert_same_tree(&format!("checkpoint {id}"), tree, &s.tree());
        assert_processes_intact(&s);
    }

    // Four forks of the newest checkpoint: each its own writable layer.
    let (newest, tree) = &states[2];
    let out = c.belayer(&["fork", "chain", "--checkpoint", newest, "--count", "4"]);
    assert_eq!(out.code, 0, "fork: {out:?}");
    let forks: Vec<String> = out.stdout.lines().map(str::to_string).collect();
    assert_eq!(forks.len(), 4, "{out:?}");
    for f in &forks {
        assert_eq!(task_status(&c, f), "RUNNING", "fork {f}");
        assert_in_own_cgroup(&c, f);
        let fork = Sandbox::attach(&c, f);
        assert_same_tree(&format!("fork {f}"), tree, &fork.tree());
        assert_processes_intact(&fork);
        assert_eq!(fork.exec(&format!("echo {f} > /work/mine"), None).code, 0);
    }
    for f in &forks {
        let fork = Sandbox::attach(&c, f);
        assert_eq!(
            fork.exec("cat /work/mine", None).stdout.trim(),
            f,
            "fork {f} sees another fork's write"
        );
    }
    assert_ne!(
        s.exec("cat /work/mine", None).code,
        0,
        "the source container sees a fork's write"
    );
    // A fork is a container like any other: its own checkpoint (taken while its stdio is the
    // shim's, as containerd gave it none) restores in place to the fork's state.
    let fork = Sandbox::attach(&c, &forks[0]);
    let fork_tree = fork.tree();
    let fork_cp = checkpoint(&c, &forks[0]);
    assert_eq!(fork.exec("echo later > /work/mine", None).code, 0);
    restore(&c, &forks[0], Some(&fork_cp));
    assert_same_tree(
        &format!("fork {}'s checkpoint", forks[0]),
        &fork_tree,
        &fork.tree(),
    );
    assert_processes_intact(&fork);
    for f in &forks {
        remove(&c, f);
    }
    remove(&c, "chain");
}

#[test]
fn containerd_checkpoint_carries_processes_and_filesystem() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "viactr", &["sh", "-c", COUNTER_LOOP]);
    let s = Sandbox::attach(&c, "viactr");
    assert_eq!(
        s.exec("echo kept > /marker && mkdir -p /d && echo x > /d/f", None)
            .code,
        0
    );
    // `ctr task checkpoint` makes a containerd checkpoint image from the shim's export.
    let out = c.ctr(&["tasks", "checkpoint", "viactr"]).ok();
    assert!(out.stdout.contains("checkpoint/viactr"), "{out:?}");
    // Into a directory of the user's: flat (CRIU images and the chain's archive), and copies, so
    // that writing there cannot reach the store's checkpoint. ctr names the image it records
    // after the second it started in: a second checkpoint in the same second fails ("already
    // exists"), so this one waits for the next second.
    let second = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default()
    };
    let first = second();
    while second() == first {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dir = c.dir.join("user-export");
    c.ctr(&[
        "tasks",
        "checkpoint",
        "--image-path",
        &dir.display().to_string(),
        "viactr",
    ])
    .ok();
    for name in ["inventory.img", "belayer-chain.tar"] {
        let meta = std::fs::metadata(dir.join(name))
            .unwrap_or_else(|e| panic!("{name} is not in the user's export: {e}"));
        assert_eq!(
            std::os::unix::fs::MetadataExt::nlink(&meta),
            1,
            "{name} of the user's export is linked to the store"
        );
    }
    std::fs::write(dir.join("inventory.img"), b"edited").expect("edit the user's export");
    let newest = c
        .belayer(&["checkpoints", "viactr"])
        .ok()
        .stdout
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        c.belayer(&["restore", "viactr", "--checkpoint", &newest])
            .code,
        0,
        "the store's checkpoint does not restore after an edit of the user's export"
    );
    c.ctr(&[
        "containers",
        "checkpoint",
        "--task",
        "viactr",
        "belayer.local/cp:1",
    ])
    .ok();
    // Later changes must not leak into the restored container.
    assert_eq!(
        s.exec("rm -rf /marker /d && echo later > /later", None)
            .code,
        0
    );
    c.ctr(&[
        "containers",
        "restore",
        "--live",
        "fromctr",
        "belayer.local/cp:1",
    ])
    .ok();
    assert_eq!(task_status(&c, "fromctr"), "RUNNING");
    // containerd unpacked the image into its TMPDIR; the shim took the chain and removed the rest.
    let unpacked: Vec<_> = std::fs::read_dir(c.tmp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("ctrd-checkpoint"))
        .collect();
    assert!(
        unpacked.is_empty(),
        "left in containerd's TMPDIR: {unpacked:?}"
    );
    let r = Sandbox::attach(&c, "fromctr");
    assert_eq!(
        r.exec("cat /marker /d/f; test -e /later || echo no-later", None)
            .stdout,
        "kept\nx\nno-later\n"
    );
    let first = r.counter();
    assert!(
        is_contiguous(&first),
        "counter file and process disagree after a containerd restore: {:?}",
        &first[first.len().saturating_sub(8)..]
    );
    remove(&c, "fromctr");
    remove(&c, "viactr");
}

#[test]
fn journal_rewind_and_replay() {
    let c = Containerd::start(Flavor::V2);
    let ann = ["--annotation", "io.belayer.policy=replay"];
    let mut args = vec!["run", "-d", "--runtime", BELAYER];
    args.extend(ann);
    args.extend([BUSYBOX, "replay", "sleep", "1000"]);
    c.ctr(&args).ok();
    let s = Sandbox::attach(&c, "replay");
    assert_eq!(s.exec("echo one >> /log", None).code, 0);
    let cp = checkpoint(&c, "replay");
    assert_eq!(s.exec("test ! -e /flag && echo two >> /log", None).code, 0);
    assert_eq!(s.exec("touch /flag && echo three >> /log", None).code, 0);
    let journal = c.belayer(&["journal", "replay"]).ok().stdout;
    assert_eq!(journal.lines().count(), 3, "{journal}");
    let out = c
        .belayer(&["restore", "replay", "--checkpoint", &cp, "--json"])
        .ok();
    // --json prints the shim's answer: what it restored and where the time went.
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(
        (info["container"].as_str(), info["checkpoint"].as_str()),
        (Some("replay"), Some(cp.as_str())),
        "{info}"
    );
    let ms = |k: &str| info[k].as_u64().unwrap_or_else(|| panic!("no {k}: {info}"));
    assert!(
        ms("verify_ms") + ms("mount_ms") + ms("restore_ms") <= ms("total_ms") + 2,
        "{info}"
    );
    assert!(info["pid"].as_u64().is_some_and(|p| p > 0), "{info}");
    let status = status(&c, "replay");
    let p = &status["position"];
    assert_eq!(
        p["reflects"],
        format!("checkpoint {cp}, taken after action 1"),
        "{status}"
    );
    assert_eq!(
        (
            p["policy"].as_str(),
            p["replayed"].as_u64(),
            p["action"].as_u64()
        ),
        (Some("replay"), Some(2), Some(3)),
        "{status}"
    );
    assert_eq!(p["mismatches"], serde_json::json!([]), "{status}");
    // The replayed actions ran again, in order, on the restored state.
    assert_eq!(s.exec("cat /log", None).stdout, "one\ntwo\nthree\n");
    assert_root_only(&c, "replay", &cp);
    remove(&c, "replay");
}

/// The store is root-only at rest, as the shim made it: a user (nobody) reaches neither the
/// store, the journal of `id`'s execs (their environments), its restored upper (where a setuid
/// binary could be) nor its checkpoint `cp`, even with every dir above the store open.
fn assert_root_only(c: &Containerd, id: &str, cp: &str) {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let above = c.store.parent().expect("the store's parent");
    std::fs::set_permissions(above, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mode = std::fs::metadata(&c.store).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the store root is {mode:o}");
    let journal = c.store.join("journal").join(&c.ns);
    let uppers = c.store.join("uppers").join(&c.ns).join(id);
    let paths = [
        c.store.clone(),
        journal.clone(),
        journal.join(format!("{id}.jsonl")),
        uppers.clone(),
        c.checkpoints_dir(id).join(cp).join("manifest.json"),
    ];
    for p in paths {
        let out = std::process::Command::new("ls")
            .arg(&p)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("Permission denied"),
            "nobody reaches {}: {err}",
            p.display()
        );
    }
}

/// Starts the episode's 256 MB holder in `s`, checkpoints it, and restores it lazily until the
/// lazy-pages daemon is caught still filling: stopped (SIGSTOP), its pid returned.
fn stopped_lazy_fill(s: &Sandbox) -> i64 {
    let holder: Vec<_> = episode::actions(256)
        .into_iter()
        .filter(|a| matches!(a.name, "upload-holder" | "start-holder"))
        .collect();
    s.run(&holder);
    let cp = checkpoint(s.c, &s.id);
    let work = s.c.task_work_dir(&s.id).join(format!("restore-{cp}"));
    (0..10)
        .find_map(|_| {
            restore(s.c, &s.id, Some(&cp));
            let pid: i64 = std::fs::read_to_string(work.join("lazy-pages.pid"))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            signal(pid, libc::SIGSTOP).ok().map(|()| pid)
        })
        .expect("no lazy-pages daemon was still filling after any of 10 restores")
}

/// After a lazy restore a checkpoint waits for the memory fill (pages not yet filled would look
/// absent to a dump) — here for a lazy-pages daemon the test has stopped — without holding the
/// container: the agent's execs go on meanwhile. Then the fill goes on and the checkpoint
/// completes.
#[test]
fn a_checkpoint_waits_for_a_lazy_fill_without_holding_the_container() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "filling");
    let daemon = stopped_lazy_fill(&s);
    /// Lets the daemon go on, also when an assertion below fails.
    struct Resume(i64);
    impl Drop for Resume {
        fn drop(&mut self) {
            let _ = signal(self.0, libc::SIGCONT);
        }
    }
    let resume = Resume(daemon);
    let before = task_row(&c, "filling");
    std::thread::scope(|scope| {
        let taking = scope.spawn(|| c.belayer(&["checkpoint", "filling"]));
        std::thread::sleep(Duration::from_millis(500));
        for n in 0..3 {
            let out = s.exec(&format!("echo {n} > /tmp/during-fill"), None);
            assert_eq!(out.code, 0, "exec while the checkpoint waits: {out:?}");
            if taking.is_finished() {
                let out = taking.join().expect("checkpoint thread");
                panic!("the checkpoint did not wait for the fill (daemon {daemon}): {out:?}");
            }
            assert_eq!(task_row(&c, "filling"), before);
        }
        drop(resume);
        let out = taking.join().expect("checkpoint thread");
        assert_eq!(out.code, 0, "checkpoint after the fill: {out:?}");
    });
    remove(&c, "filling");
}

/// A checkpoint that holds its container for long — here it waits for a vfork in the container
/// to end, looking again and again — does not hold up containerd's State (which gets 2 s):
/// `ctr tasks ls` keeps showing the task running with its pid, never UNKNOWN with pid 0.
#[test]
fn state_answers_while_a_checkpoint_holds_the_container() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "held");
    hold_in_vfork(&s);
    let before = task_row(&c, "held");
    assert_eq!(
        before.get(1).map(String::as_str),
        Some("RUNNING"),
        "{before:?}"
    );
    std::thread::scope(|scope| {
        let taking = scope.spawn(|| c.belayer(&["checkpoint", "held"]));
        std::thread::sleep(Duration::from_millis(500));
        for _ in 0..3 {
            assert!(
                !taking.is_finished(),
                "the checkpoint did not wait for the vfork"
            );
            assert_eq!(
                task_row(&c, "held"),
                before,
                "State while a checkpoint holds the container"
            );
        }
        let out = taking.join().expect("checkpoint thread");
        assert_ne!(out.code, 0, "checkpoint of a task held in vfork: {out:?}");
        assert!(out.stderr.contains("vfork"), "{out:?}");
    });
    assert_eq!(task_row(&c, "held"), before);
    release_vfork(&s);
    remove(&c, "held");
}

/// A process containerd exec'd is the shim's child, outside the container's process tree that
/// CRIU dumps: one still running at the checkpoint instant is not in the checkpoint. The
/// checkpoint says so (`inspect`'s `uncaptured_execs`), and after a restore that process is
/// gone and its exec has exited, while what init runs came back.
#[test]
fn a_running_exec_is_named_as_not_captured() {
    let c = Containerd::start(Flavor::V2);
    let id = "uncaptured";
    run_detached(&c, BELAYER, id, &["sh", "-c", COUNTER]);
    let inspect = |cp: &str| -> serde_json::Value {
        serde_json::from_str(&c.belayer(&["inspect", id, cp]).ok().stdout).expect("inspect JSON")
    };
    let info = inspect(&checkpoint(&c, id));
    assert!(
        info.get("uncaptured_execs").is_none(),
        "nothing exec'd ran, yet: {info}"
    );
    c.ctr(&[
        "tasks",
        "exec",
        "-d",
        "--exec-id",
        "bg",
        id,
        "sleep",
        "1000",
    ])
    .ok();
    let exec_pid = |c: &Containerd| {
        c.ctr(&["tasks", "ps", id])
            .stdout
            .lines()
            .find(|l| l.contains("bg"))
            .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok())
    };
    let pid = exec_pid(&c).expect("the exec's pid in ctr tasks ps");
    let cp = checkpoint(&c, id);
    let info = inspect(&cp);
    assert_eq!(
        info["uncaptured_execs"],
        serde_json::json!([{ "exec_id": "bg", "pid": pid }]),
        "{info}"
    );
    c.belayer(&["restore", id, "--checkpoint", &cp]).ok();
    assert_eq!(task_status(&c, id), "RUNNING");
    assert_eq!(
        exec_pid(&c),
        None,
        "the exec'd process survived the restore"
    );
    let ps = c.ctr(&["tasks", "ps", id]).ok().stdout;
    assert!(
        ps.lines().count() >= 2,
        "init's tree did not come back: {ps}"
    );
    remove(&c, id);
}

/// A chain longer than the shim's bound is compacted in the background after the checkpoint
/// that crosses it, while checkpoints go on being asked for back to back: each of them succeeds
/// (the compaction holds the store's lock for its whole merge; a checkpoint waits for it rather
/// than fail as "in progress"), and both the compacted checkpoint and the newest, stacked on
/// it, restore to their own state.
#[test]
fn a_long_chain_is_compacted_while_checkpoints_go_on() {
    const BOUND: usize = 16; // the shim's COMPACT_CHAIN_AT
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "long-chain");
    s.run(&episode::actions(16)[..1]); // the tree tool only
    let mut taken = Vec::new();
    for k in 1..=BOUND + 4 {
        // Each layer adds 16 MiB, so the merge takes a while, and deletes a file an older layer
        // made (which must stay gone in the merge).
        let script = format!(
            "mkdir -p /work && head -c 16777216 /dev/urandom > /work/layer{k} \
             && rm -f /work/layer{} && echo {k} > /work/k",
            k.saturating_sub(3)
        );
        assert_eq!(s.exec(&script, None).code, 0);
        // The trees of the two compared below (a tree reads the whole rootfs).
        let tree = if k == BOUND + 1 || k == BOUND + 4 {
            s.tree()
        } else {
            Vec::new()
        };
        let out = c.belayer(&["checkpoint", "long-chain"]);
        assert_eq!(
            out.code, 0,
            "checkpoint {k} (during a compaction?): {out:?}"
        );
        taken.push((out.stdout.trim().to_string(), tree));
    }
    let chain_len = |id: &str| {
        let out = c.belayer(&["inspect", "long-chain", id]).ok().stdout;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["fs_chain"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(
        chain_len(&taken[BOUND - 1].0),
        BOUND,
        "a chain at the bound is left as it is"
    );
    // The one that crossed the bound, or (had a later one come first and stacked on it) a
    // later one.
    assert!(
        wait_until(Duration::from_secs(60), || taken[BOUND..]
            .iter()
            .any(|(id, _)| chain_len(id) == 1)),
        "no checkpoint past the bound was compacted: {:?}",
        taken
            .iter()
            .map(|(id, _)| chain_len(id))
            .collect::<Vec<_>>()
    );
    let newest = &taken.last().unwrap().0;
    assert!(
        chain_len(newest) <= 4,
        "{newest}: chain of {}",
        chain_len(newest)
    );
    for (id, tree) in [&taken[BOUND], taken.last().unwrap()] {
        restore(&c, "long-chain", Some(id));
        assert_same_tree(&format!("checkpoint {id}"), tree, &s.tree());
    }
    remove(&c, "long-chain");
}

/// The lazy-pages daemon killed (the OOM killer, say) before it filled the memory of a lazy
/// restore: the pages it had not delivered would read as zeros, so the container must not run
/// on with that memory. The shim kills it — a crash the automatic recovery restores from — and
/// says why in the container's status.
#[test]
fn a_lazy_fill_killed_midway_ends_the_container_rather_than_run_on_holes() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "holes");
    let daemon = stopped_lazy_fill(&s);
    signal(daemon, libc::SIGKILL).expect("kill the lazy-pages daemon");
    let ended = wait_until(Duration::from_secs(10), || {
        task_status(&c, "holes") == "STOPPED"
    });
    let (now, start) = s.holder_digests();
    assert!(
        ended,
        "the container runs on after its memory fill died (holder digest {now:?}, at start \
         {start:?})"
    );
    let status = status(&c, "holes").to_string();
    assert!(
        status.contains("lazy-pages"),
        "the status does not say why the container ended: {status}"
    );
    remove(&c, "holes");
}

/// The lines of `path` in container `id`, as numbers.
#[track_caller]
fn numbers_in(c: &Containerd, id: &str, exec_id: &str, path: &str) -> Vec<u64> {
    let out = c.ctr(&["tasks", "exec", "--exec-id", exec_id, id, "cat", path]);
    assert_eq!(out.code, 0, "cat {path} in {id}: {out:?}");
    out.stdout.lines().map(|l| l.parse().unwrap()).collect()
}

/// An open file whose name was removed while another hard link of it remains (`ln a b; rm a`,
/// `a` open). CRIU dumps it only with `--link-remap` (set here in the container's CRIU
/// configuration file, as CRIU's ZDTM `unlink_fstat03` does), restoring it through a hard link
/// it makes in the dump. That link reached no checkpoint (CRIU removes it before a dump that
/// leaves the tasks running returns, and Belayer captures the filesystem after), so the
/// checkpoint was stored and every restore of it failed ("Can't link … link_remap.<id>"). And
/// even made again for the capture, the link would be a lower file of the restore's overlay,
/// copied up apart from `b` once CRIU opened it: the restored shell would write where no name
/// shows. So the checkpoint is refused, naming the file, nothing is stored, and the container
/// writes on.
#[test]
fn a_checkpoint_of_an_open_file_removed_beside_its_hard_link_is_refused_naming_it() {
    let c = Containerd::start(Flavor::V2);
    let conf = c.tmp_dir().join("link-remap.conf");
    std::fs::write(&conf, "link-remap\n").unwrap();
    let annotation = format!("org.criu.config={}", conf.display());
    let script = "mkdir /data; exec 3>>/data/a; ln /data/a /data/b; rm /data/a; i=0; \
                  while :; do i=$((i+1)); echo $i >&3; sleep 0.01; done";
    run_detached_with(
        &c,
        BELAYER,
        &["--annotation", &annotation],
        "lr",
        &["sh", "-c", script],
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            c.ctr(&[
                "tasks",
                "exec",
                "--exec-id",
                "w",
                "lr",
                "test",
                "-s",
                "/data/b",
            ])
            .code
                == 0
        }),
        "lr did not start writing"
    );
    let out = c.belayer(&["checkpoint", "lr"]);
    assert_ne!(
        out.code, 0,
        "a checkpoint CRIU would restore through a link remap: {out:?}"
    );
    assert!(
        out.stderr.contains("/data/a") && out.stderr.contains("another hard link"),
        "the refusal does not name the file: {:?}",
        out.stderr
    );
    assert_eq!(c.belayer(&["checkpoints", "lr"]).stdout.trim(), "");
    assert_eq!(task_status(&c, "lr"), "RUNNING");
    let first = numbers_in(&c, "lr", "n1", "/data/b");
    std::thread::sleep(Duration::from_millis(300));
    let lines = numbers_in(&c, "lr", "n2", "/data/b");
    assert!(
        lines.len() > first.len(),
        "lr stopped writing after the refusal"
    );
    let expected: Vec<u64> = (1..=lines.len() as u64).collect();
    assert_eq!(lines, expected, "lr: /data/b is not 1..N");
    let out = c.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        "ls",
        "lr",
        "ls",
        "-a",
        "/data",
    ]);
    assert_eq!(
        out.stdout, ".\n..\nb\n",
        "CRIU's link remap is left in sight: {out:?}"
    );
}

/// A process watching files of its container with inotify (a file watcher, a dev server's
/// reload): CRIU dumps a watch by its file's handle, which an overlay without `nfs_export` never
/// opens, so it looks for the file's path by scanning — and found nothing, as CRIU 4.2 scans
/// nothing from `/` ("fsnotify: Can't dump that handle"): no checkpoint of such a container was
/// possible. With `irmap-scan-path /` in every container's CRIU configuration and Belayer's CRIU
/// patch, the watches (a file the container made, one of its image, one through a symlink) are
/// dumped by path; restored in place and forked, the watcher still sees a write to its file.
#[test]
fn a_process_watching_its_files_with_inotify_checkpoints_and_restores() {
    let c = Containerd::start(Flavor::V2);
    c.import(&belayer_integration::prereq::image("sandbox.tar"));
    let watcher = r#"
import ctypes, os, select
os.makedirs("/w", exist_ok=True)
open("/w/f", "w").close()
libc = ctypes.CDLL(None)
fd = libc.inotify_init()
for p in (b"/w/f", b"/usr/lib/os-release", b"/usr/bin/python3"):
    assert libc.inotify_add_watch(fd, p, 2) > 0, p  # IN_MODIFY
open("/w/ready", "w").close()
while True:
    select.select([fd], [], [])
    os.read(fd, 4096)
    with open("/w/events", "a") as e:
        e.write("modified\n")
"#;
    c.ctr(&[
        "run",
        "-d",
        "--runtime",
        BELAYER,
        "belayer.local/sandbox:latest",
        "ino",
        "python3",
        "-c",
        watcher,
    ])
    .ok();
    let sees_a_write = |id: &str, n: usize| {
        let out = c.sh(id, &format!("w{n}"), "echo x >> /w/f");
        assert_eq!(out.code, 0, "write in {id}: {out:?}");
        assert!(
            wait_until(Duration::from_secs(10), || {
                let out = c.sh(id, &format!("r{n}"), "cat /w/events 2>/dev/null | wc -l");
                out.stdout.trim().parse::<usize>().is_ok_and(|l| l >= n)
            }),
            "{id}: the watcher saw no write ({n} expected)"
        );
    };
    assert!(
        wait_until(Duration::from_secs(20), || c
            .sh("ino", "ready", "test -e /w/ready")
            .code
            == 0),
        "the watcher did not start"
    );
    sees_a_write("ino", 1);
    let cp = checkpoint(&c, "ino");
    sees_a_write("ino", 2);
    crash(&c, "ino");
    restore(&c, "ino", Some(&cp));
    // The checkpoint's instant: one event seen; the write after it is the second.
    sees_a_write("ino", 2);
    let out = c.belayer(&["fork", "ino", "--checkpoint", &cp, "--count", "1"]);
    assert_eq!(out.code, 0, "fork: {out:?}");
    sees_a_write(out.stdout.trim(), 2);
}
