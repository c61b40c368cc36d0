//! Bad input to checkpoint and restore: each gives one clear line on stderr and a non-zero exit,
//! the container keeps running untouched, existing checkpoints still restore, no partial
//! checkpoint is listed and no mount is leaked.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use belayer_integration::chaos::fault;
use belayer_integration::episode::{self, Sandbox};
use belayer_integration::{Containerd, Flavor, Out};
use common::*;

/// Asserts a CLI failure: non-zero, one line on stderr starting `belayer: `, containing `needle`.
#[track_caller]
fn assert_clear_error(out: &Out, needle: &str) {
    assert_ne!(out.code, 0, "expected a failure: {out:?}");
    assert_eq!(
        out.stderr.lines().count(),
        1,
        "error is not one line: {:?}",
        out.stderr
    );
    assert!(out.stderr.starts_with("belayer: "), "{:?}", out.stderr);
    assert!(
        out.stderr.to_lowercase().contains(&needle.to_lowercase()),
        "error {:?} does not say {needle:?}",
        out.stderr
    );
}

/// The container runs the same processes as before and they make progress.
#[track_caller]
fn assert_untouched(c: &Containerd, id: &str, pid: &str) {
    assert_eq!(task_status(c, id), "RUNNING");
    assert_eq!(task_pid(c, id), pid, "the container's init changed");
    let count = || {
        c.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            &format!("n{}", rand()),
            id,
            "sh",
            "-c",
            "wc -l < /counter",
        ])
        .stdout
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
    };
    let before = count();
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        count() > before,
        "the container's processes do not progress"
    );
}

fn rand() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn cp_dir(c: &Containerd, id: &str, cp: &str) -> PathBuf {
    c.checkpoints_dir(id).join(cp)
}

/// Overlay mounts that stack checkpoint layers of this store.
fn store_mounts(c: &Containerd) -> usize {
    let store = c.store.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" - overlay ") && l.contains(&store))
        .count()
}

#[test]
fn corrupt_truncated_unknown_and_missing() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "bad", &["sh", "-c", COUNTER]);
    let good = checkpoint(&c, "bad");
    let corrupt = checkpoint(&c, "bad");
    let truncated = checkpoint(&c, "bad");
    let future = checkpoint(&c, "bad");
    let pid = task_pid(&c, "bad");

    // One byte of a CRIU image flipped.
    let victim =
        fault::largest_file(&cp_dir(&c, "bad", &corrupt).join("criu")).expect("a CRIU image");
    let mut bytes = std::fs::read(&victim).expect("read image");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&victim, bytes).expect("write image");
    let name = victim.file_name().unwrap().to_string_lossy().into_owned();
    assert_clear_error(
        &c.belayer(&["restore", "bad", "--checkpoint", &corrupt]),
        &name,
    );
    assert_untouched(&c, "bad", &pid);

    // A manifest cut in half.
    let manifest = cp_dir(&c, "bad", &truncated).join("manifest.json");
    let text = std::fs::read(&manifest).expect("manifest");
    std::fs::write(&manifest, &text[..text.len() / 2]).expect("truncate");
    assert_clear_error(
        &c.belayer(&["restore", "bad", "--checkpoint", &truncated]),
        "manifest",
    );
    assert_clear_error(&c.belayer(&["inspect", "bad", &truncated]), "manifest");
    assert_untouched(&c, "bad", &pid);

    // A format from the future.
    let manifest = cp_dir(&c, "bad", &future).join("manifest.json");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let text = text
        .replacen("\"format_version\":1", "\"format_version\":999", 1)
        .replacen("\"format_version\": 1", "\"format_version\": 999", 1);
    assert!(
        text.contains("999"),
        "format_version not found in {manifest:?}"
    );
    std::fs::write(&manifest, text).expect("write manifest");
    assert_clear_error(
        &c.belayer(&["restore", "bad", "--checkpoint", &future]),
        "999",
    );
    assert_untouched(&c, "bad", &pid);

    // Missing things.
    assert_clear_error(&c.belayer(&["restore", "bad", "--checkpoint", "42"]), "42");
    assert_clear_error(&c.belayer(&["checkpoint", "nosuch"]), "nosuch not found");
    assert_clear_error(&c.belayer(&["restore", "nosuch"]), "nosuch not found");
    assert_clear_error(&c.belayer(&["checkpoints", "nosuch"]), "nosuch not found");
    assert_clear_error(
        &c.belayer(&["fork", "nosuch", "--checkpoint", "1"]),
        "nosuch not found",
    );
    assert_clear_error(
        &c.belayer(&["restore", "bad", "--checkpoint", "x1"]),
        "invalid checkpoint id",
    );
    assert_untouched(&c, "bad", &pid);

    // The good checkpoint still restores; one rootfs mount, none leaked by the failures.
    let out = c.belayer(&["restore", "bad", "--checkpoint", &good]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(task_status(&c, "bad"), "RUNNING");
    assert_eq!(store_mounts(&c), 1, "overlay mounts of the store");
    remove(&c, "bad");
    assert_eq!(
        store_mounts(&c),
        0,
        "a checkpoint mount outlived its container"
    );
}

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn new(path: PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&path).expect("mkdir");
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&path)
            .status()
            .expect("mount");
        assert!(ok.success(), "mount tmpfs at {}", path.display());
        Self(path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn full_disk_keeps_nothing_partial() {
    let disk = Tmpfs::new(
        std::env::temp_dir().join(format!("belayer-full-{}", std::process::id())),
        "2m",
    );
    let c = Containerd::start_with_store(Flavor::V2, Some(disk.0.join("store")));
    // 8 MB of shell variable: the CRIU images cannot fit in 2 MB.
    let script = format!("x=$(head -c 8000000 /dev/zero | tr '\\0' a); {COUNTER}");
    run_detached(&c, BELAYER, "full", &["sh", "-c", &script]);
    std::thread::sleep(Duration::from_millis(500));
    let pid = task_pid(&c, "full");
    assert_clear_error(&c.belayer(&["checkpoint", "full"]), "disk full");
    assert_untouched(&c, "full", &pid);
    assert_eq!(
        c.belayer(&["checkpoints", "full"]).stdout,
        "",
        "a partial checkpoint is listed"
    );
    let dir = c.checkpoints_dir("full");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|n| !n.to_string_lossy().starts_with('.'))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the store: {left:?}");
    let used = std::process::Command::new("df")
        .arg("--output=used")
        .arg(&disk.0)
        .output()
        .expect("df");
    let used: u64 = String::from_utf8_lossy(&used.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX);
    assert!(used < 64, "{used} KiB still used on the full disk");
    remove(&c, "full");
}

/// A store whose disk has filled up since a checkpoint: the next checkpoint is refused (disk
/// full), the container runs on, and the earlier checkpoint still restores from the full disk.
#[test]
fn an_existing_checkpoint_restores_from_a_full_disk() {
    let disk = Tmpfs::new(
        std::env::temp_dir().join(format!("belayer-filled-{}", std::process::id())),
        "64m",
    );
    let c = Containerd::start_with_store(Flavor::V2, Some(disk.0.join("store")));
    run_detached(&c, BELAYER, "filled", &["sh", "-c", COUNTER]);
    let s = Sandbox::attach(&c, "filled");
    assert_eq!(s.exec("echo kept > /kept", None).code, 0);
    let cp = checkpoint(&c, "filled");
    let fill = disk.0.join("fill");
    // dd stops at ENOSPC: the disk is full.
    let _ = std::process::Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", fill.display()))
        .arg("bs=64k")
        .stderr(std::process::Stdio::null())
        .status();
    let pid = task_pid(&c, "filled");
    assert_clear_error(&c.belayer(&["checkpoint", "filled"]), "disk full");
    assert_untouched(&c, "filled", &pid);
    assert_eq!(c.belayer(&["checkpoints", "filled"]).stdout.trim(), cp);

    assert_eq!(s.exec("rm /kept", None).code, 0);
    c.belayer(&["restore", "filled", "--checkpoint", &cp]).ok();
    assert_eq!(task_status(&c, "filled"), "RUNNING");
    assert_eq!(s.exec("cat /kept", None).stdout, "kept\n");
    std::fs::remove_file(&fill).expect("free the disk");
    remove(&c, "filled");
}

#[test]
fn concurrent_checkpoints_one_wins() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "twice");
    s.run(&episode::actions(200));
    let before = c.ctr(&["tasks", "ls"]).stdout;
    let outs: Vec<Out> = std::thread::scope(|scope| {
        let first = scope.spawn(|| c.belayer(&["checkpoint", "twice"]));
        std::thread::sleep(Duration::from_millis(150));
        let second = scope.spawn(|| c.belayer(&["checkpoint", "twice"]));
        vec![first.join().unwrap(), second.join().unwrap()]
    });
    let ok: Vec<&Out> = outs.iter().filter(|o| o.code == 0).collect();
    let failed: Vec<&Out> = outs.iter().filter(|o| o.code != 0).collect();
    assert_eq!((ok.len(), failed.len()), (1, 1), "{outs:?}");
    assert_clear_error(failed[0], "in progress");
    assert_eq!(
        c.belayer(&["checkpoints", "twice"]).stdout,
        ok[0].stdout,
        "exactly the winner is listed"
    );
    assert_eq!(
        c.ctr(&["tasks", "ls"]).stdout,
        before,
        "the container changed"
    );
    let (now, start) = s.holder_digests();
    assert_eq!(now, start);
    remove(&c, "twice");
}

/// A task caught in vfork, its child not yet exec'd, cannot be stopped by CRIU: CRIU stops the
/// child, the parent waits for the child's exec, and CRIU waits for the parent until its
/// timeout (10 s, twice with the retry) — with the container frozen throughout. dash runs every
/// command through vfork, so an agent's shell loop meets this now and then. A checkpoint now
/// waits for the vfork with the container running, and says so if it does not end.
#[test]
fn a_task_held_in_vfork_is_waited_for_with_the_container_running() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "vfork");
    let started = s.exec(
        &format!("(nohup sh -c '{COUNTER}' > /dev/null 2>&1 &)"),
        None,
    );
    assert_eq!(started.code, 0, "{started:?}");
    hold_in_vfork(&s);
    let exec = |script: &str| s.exec(script, None);
    let pid = task_pid(&c, "vfork");
    let counted = |o: Out| o.stdout.trim().parse::<u64>().unwrap_or(0);
    let before = counted(exec("wc -l < /counter"));

    let out = c.belayer(&["checkpoint", "vfork"]);
    assert_clear_error(&out, "is in vfork, waiting for its child to exec");
    // The counter went on while the checkpoint waited: the container was not kept frozen.
    let after = counted(exec("wc -l < /counter"));
    assert!(
        after >= before + 100,
        "the counter went from {before} to {after} while the checkpoint waited"
    );
    assert_untouched(&c, "vfork", &pid);
    assert_eq!(c.belayer(&["checkpoints", "vfork"]).stdout, "");

    // The child gets its FIFO, execs, and the vfork ends: the checkpoint goes through.
    release_vfork(&s);
    let cp = checkpoint(&c, "vfork");
    assert_eq!(c.belayer(&["checkpoints", "vfork"]).stdout.trim(), cp);
    assert_untouched(&c, "vfork", &pid);
    remove(&c, "vfork");
}

/// containerd's checkpoint image of container `twin` comes back to a store without its
/// checkpoints (as on another node): the import brings the whole checkpoint along, and the
/// restored container is at its instant. An import lands under the container being created,
/// whatever the image names: into a store that holds another checkpoint of that name and number
/// (after this node's were removed and a new `twin` checkpointed), it restores its own checkpoint
/// and leaves the new `twin`'s alone. Into a container whose own checkpoint of that number is
/// another one, the restore is refused, naming the clash, rather than running the store's
/// checkpoint in its place.
#[test]
fn a_containerd_checkpoint_imports_where_missing_and_is_refused_where_it_clashes() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "twin", &["sh", "-c", COUNTER]);
    let twin = || Sandbox::attach(&c, "twin");
    assert_eq!(twin().exec("echo first > /which", None).code, 0);
    c.ctr(&[
        "containers",
        "checkpoint",
        "--task",
        "twin",
        "belayer.local/twin:1",
    ])
    .ok();
    remove(&c, "twin");
    let chain = c.checkpoints_dir("twin");
    std::fs::remove_dir_all(&chain).expect("remove twin's checkpoints");

    let restore = |id: &str, image: &str| c.ctr(&["containers", "restore", "--live", id, image]);
    restore("twin-copy", "belayer.local/twin:1").ok();
    assert_eq!(task_status(&c, "twin-copy"), "RUNNING");
    let copy = Sandbox::attach(&c, "twin-copy");
    assert_eq!(copy.exec("cat /which", None).stdout, "first\n");
    let counter = copy.exec("cat /counter", None).stdout;
    let numbers: Vec<u64> = counter.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(
        episode::is_contiguous(&numbers),
        "the imported checkpoint's counter is not 1..N"
    );
    assert!(
        !chain.exists(),
        "the import landed under the name it carries"
    );
    remove(&c, "twin-copy");
    std::fs::remove_dir_all(c.checkpoints_dir("twin-copy"))
        .expect("remove the imported checkpoints");

    run_detached(&c, BELAYER, "twin", &["sh", "-c", COUNTER]);
    assert_eq!(twin().exec("echo second > /which", None).code, 0);
    let cp = checkpoint(&c, "twin");
    let pid = task_pid(&c, "twin");
    restore("twin-copy2", "belayer.local/twin:1").ok();
    assert_eq!(
        Sandbox::attach(&c, "twin-copy2")
            .exec("cat /which", None)
            .stdout,
        "first\n",
        "the import did not restore its own checkpoint"
    );
    assert_untouched(&c, "twin", &pid);
    assert_eq!(c.belayer(&["checkpoints", "twin"]).stdout.trim(), cp);
    remove(&c, "twin-copy2");

    // twin-copy2's checkpoint 1 (the first twin's) stays in the store; an image of the new twin
    // holds another checkpoint 1.
    c.ctr(&[
        "containers",
        "checkpoint",
        "--task",
        "twin",
        "belayer.local/twin:2",
    ])
    .ok();
    let out = restore("twin-copy2", "belayer.local/twin:2");
    assert_ne!(out.code, 0, "a clashing checkpoint was restored: {out:?}");
    assert!(
        out.stderr
            .contains(&format!("checkpoint {cp} of {}/twin-copy2", c.ns))
            && out.stderr.contains("is not the one in this node's store"),
        "the error does not name the clash: {:?}",
        out.stderr
    );
    assert_ne!(task_status(&c, "twin-copy2"), "RUNNING");
    let _ = c.ctr(&["tasks", "rm", "twin-copy2"]);
    let _ = c.ctr(&["containers", "rm", "twin-copy2"]);
    // The store's own checkpoint still restores, with its own filesystem.
    c.belayer(&["restore", "twin", "--checkpoint", &cp]).ok();
    assert_eq!(task_status(&c, "twin"), "RUNNING");
    assert_eq!(twin().exec("cat /which", None).stdout, "second\n");
    remove(&c, "twin");
}

/// A checkpoint whose layers running forks stack on cannot be removed (nor its layers swept
/// away) while they run, even with its own container's task and record gone: the refusal names a fork, and
/// the forks still read the checkpoint's files. Once they are gone, it can be removed.
#[test]
fn a_checkpoint_that_running_forks_stack_on_stays_until_they_go() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "base", &["sh", "-c", COUNTER]);
    let base = Sandbox::attach(&c, "base");
    assert_eq!(base.exec("echo kept > /kept", None).code, 0);
    let cp = checkpoint(&c, "base");
    let out = c.belayer(&["fork", "base", "--checkpoint", &cp, "--count", "2"]);
    assert_eq!(out.code, 0, "fork: {out:?}");
    let forks: Vec<String> = out.stdout.lines().map(str::to_string).collect();
    assert_eq!(forks.len(), 2, "{out:?}");
    // The source's task goes (a crash, then containerd's delete); its record stays.
    crash(&c, "base");
    c.ctr(&["tasks", "rm", "base"]).ok();

    let out = c.belayer(&["rm", "base", &cp]);
    assert_clear_error(&out, "in use");
    assert!(
        forks.iter().any(|f| out.stderr.contains(f.as_str())),
        "the refusal names no fork: {:?}",
        out.stderr
    );
    assert_eq!(c.belayer(&["checkpoints", "base"]).stdout.trim(), cp);
    // Its record gone too, the refusal is still the store's (it said "container base not found
    // in namespace …", hiding which fork holds the checkpoint).
    c.ctr(&["containers", "rm", "base"]).ok();
    let out = c.belayer(&["rm", "base", &cp]);
    assert_clear_error(&out, "in use");
    assert!(
        forks.iter().any(|f| out.stderr.contains(f.as_str())),
        "the refusal without the container's record names no fork: {:?}",
        out.stderr
    );
    for f in &forks {
        let s = Sandbox::attach(&c, f);
        assert_eq!(
            s.exec("cat /kept", None).stdout,
            "kept\n",
            "{f} lost a file"
        );
        assert_eq!(task_status(&c, f), "RUNNING");
    }

    for f in &forks {
        remove(&c, f);
    }
    c.belayer(&["rm", "base", &cp]).ok();
    assert_eq!(c.belayer(&["checkpoints", "base"]).stdout, "");
}

/// CRIU killed in the middle of a dump (the OOM killer, say), with its parasite inside the
/// container's processes: the checkpoint fails with a clear error, the processes run on with
/// their memory intact, nothing partial is listed or left mounted, the earlier checkpoint still
/// restores, and the next checkpoint goes through.
#[test]
fn criu_killed_during_a_dump_leaves_the_container_running() {
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&c, BELAYER, "oom");
    s.run(&episode::actions(300));
    let earlier = checkpoint(&c, "oom");
    let pid = task_pid(&c, "oom");
    let mounts = store_mounts(&c);

    let (out, killed) = std::thread::scope(|scope| {
        let cp = scope.spawn(|| c.belayer(&["checkpoint", "oom"]));
        let mut killed = None;
        wait_until(Duration::from_secs(60), || {
            killed = fault::dumping_criu(&c, "oom", &pid).map(|p| p as i32);
            killed.is_some() || cp.is_finished()
        });
        if let Some(criu) = killed {
            // SAFETY: kill(2) on a pid just read from /proc; at worst it names no process.
            unsafe { libc::kill(criu, libc::SIGKILL) };
        }
        (cp.join().unwrap(), killed)
    });
    assert!(killed.is_some(), "no CRIU dump was caught: {out:?}");
    assert_clear_error(&out, "criu dump of container");
    assert_eq!(task_status(&c, "oom"), "RUNNING");
    assert_eq!(task_pid(&c, "oom"), pid, "the container's init changed");
    let (now, start) = s.holder_digests();
    assert!(
        !now.is_empty() && now == start,
        "the background process's memory changed: {now:?} vs {start:?}"
    );
    let before = s.counter().len();
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.counter().len() > before, "the counter stopped");
    assert_eq!(
        c.belayer(&["checkpoints", "oom"]).stdout.trim(),
        earlier,
        "a partial checkpoint is listed"
    );
    assert_eq!(store_mounts(&c), mounts, "a mount was leaked");

    // The next checkpoint goes through, and the earlier one still restores.
    let next = checkpoint(&c, "oom");
    assert_ne!(next, earlier);
    restore(&c, "oom", Some(&earlier));
    assert_processes_intact(&s);
    remove(&c, "oom");
}
