//! Real runc + CRIU on a busybox bundle: one-instant checkpoints (a counter written to a file
//! reads exactly 1..N after restore), restore in place, forks, paused containers, exit mode,
//! typed CRIU failures, a concurrent checkpoint, a corrupt checkpoint refused before restore.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::Container;
use criu_bridge::runc::{CriuOptions, RestoreStdio};
use criu_bridge::store::VerifyLevel;
use criu_bridge::{
    Checkpoint, CheckpointError, CheckpointRequest, RestoreRequest, Store, checkpoint_container,
};

/// Appends 1, 2, 3, ... to /data/counter; the shell variable is the process state.
const COUNTER: &str = "i=0; while :; do i=$((i+1)); echo $i >> /data/counter; sleep 0.02; done";

fn request<'a>(
    c: &'a Container,
    store: &'a Store,
    parent: Option<&'a Checkpoint>,
    leave_running: bool,
) -> CheckpointRequest<'a> {
    CheckpointRequest {
        runc: &c.runc,
        store,
        namespace: "default",
        id: &c.id,
        bundle: &c.bundle,
        upper_dir: &c.upper,
        image_lowers: std::slice::from_ref(&c.lower),
        rootfs_shared: false,
        parent,
        leave_running,
        uncaptured_execs: &[],
        criu: CriuOptions::default(),
        yield_to_blocked: false,
        frozen_limit: criu_bridge::DEFAULT_FROZEN_LIMIT,
    }
}

/// Asserts the counter file reads exactly 1..=n (n ≥ `at_least`) and returns n.
fn counter_is_consecutive(rootfs: &Path, at_least: usize) -> usize {
    let text = std::fs::read_to_string(rootfs.join("data/counter")).unwrap();
    let nums: Vec<usize> = text.lines().map(|l| l.parse().unwrap()).collect();
    let expected: Vec<usize> = (1..=nums.len()).collect();
    assert!(
        nums == expected,
        "counter is not 1..N (an fs/process mismatch): {:?}",
        &nums[nums.len().saturating_sub(10)..]
    );
    assert!(
        nums.len() >= at_least,
        "counter did not advance: {} < {at_least}",
        nums.len()
    );
    nums.len()
}

fn lines_in(fs_layer: &Path) -> usize {
    std::fs::read_to_string(fs_layer.join("data/counter"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Mounts `cp`'s rootfs into a bundle (copying `c`'s config.json) and restores it as `id`.
fn restore_as(c: &Container, store: &Store, cp: &Checkpoint, id: &str, base: &Path) -> PathBuf {
    restore_with(c, store, cp, id, base, false).0
}

/// [`restore_as`], lazily or not; returns the rootfs and the report.
fn restore_with(
    c: &Container,
    store: &Store,
    cp: &Checkpoint,
    id: &str,
    base: &Path,
    lazy_pages: bool,
) -> (PathBuf, criu_bridge::RestoreReport) {
    let bundle = if id == c.id {
        c.bundle.clone()
    } else {
        base.join(format!("bundle-{id}"))
    };
    if id != c.id {
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::copy(c.bundle.join("config.json"), bundle.join("config.json")).unwrap();
        c.extra_ids.borrow_mut().push(id.into());
    }
    let rootfs = bundle.join("rootfs");
    let tag = format!("{id}-{}", cp.manifest.seq);
    criu_bridge::verify(store, cp, VerifyLevel::Full).unwrap();
    let took = criu_bridge::mount_rootfs(
        store,
        cp,
        &base.join(format!("{tag}-up")),
        &base.join(format!("{tag}-wk")),
        &rootfs,
    )
    .unwrap();
    c.extra_mounts.borrow_mut().push(rootfs.clone());
    let work = base.join(format!("{tag}-restore-work"));
    let req = RestoreRequest {
        runc: &c.runc,
        image_dir: &cp.criu_dir(),
        criu: &cp.manifest.criu_options,
        id,
        bundle: &bundle,
        work_dir: &work,
        detach: true,
        pid_file: Some(&work.join("pid")),
        console_socket: None,
        lazy_pages,
    };
    let report = criu_bridge::restore_processes(&req, RestoreStdio::default()).unwrap();
    eprintln!(
        "restored {id} (lazy: {lazy_pages}): mount {took:?}, runc restore {:?}, stats {:?}",
        report.duration, report.stats
    );
    assert_eq!(c.status(id).as_deref(), Some("running"));
    (rootfs, report)
}

#[test]
fn checkpoint_restore_in_place_and_fork_keep_fs_and_processes_at_one_instant() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let c = Container::start(base, "bl-inplace", COUNTER);
    let store = Store::new(base.join("store"));
    std::thread::sleep(Duration::from_millis(300));

    let cp1 = checkpoint_container(&request(&c, &store, None, true)).unwrap();
    eprintln!(
        "cp1 timings {:?} sizes {:?} criu {:?}",
        cp1.manifest.timings, cp1.manifest.sizes, cp1.manifest.criu_stats
    );
    assert_eq!(
        c.status(&c.id).as_deref(),
        Some("running"),
        "leave-running checkpoint must thaw"
    );
    let n1 = lines_in(&cp1.fs_dir());
    assert!(n1 > 0);
    std::thread::sleep(Duration::from_millis(200));
    let cp2 = checkpoint_container(&request(&c, &store, Some(&cp1), true)).unwrap();
    let n2 = lines_in(&cp2.fs_dir());
    assert!(n2 > n1 && cp2.manifest.fs_chain == [2, 1]);
    assert_eq!(store.list("default", &c.id).unwrap(), [1, 2]);

    // Crash: the processes die. Restore checkpoint 1 in place.
    c.kill(&c.id);
    criu_bridge::layer::unmount(&c.rootfs).unwrap();
    let rootfs = restore_as(&c, &store, &cp1, &c.id, base);
    std::thread::sleep(Duration::from_millis(300));
    let n = counter_is_consecutive(&rootfs, n1 + 3);
    eprintln!("in place: checkpoint had {n1} lines, now {n} consecutive");

    // A checkpoint after the restore has the restored checkpoint as parent (fresh upper).
    let up = base.join(format!("{}-1-up", c.id));
    let mut req = request(&c, &store, Some(&cp1), true);
    req.upper_dir = &up;
    let cp3 = checkpoint_container(&req).unwrap();
    assert_eq!(cp3.manifest.fs_chain, [3, 1]);

    // Fork 2 containers from checkpoint 2: each continues from n2, without seeing the other.
    let f1 = restore_as(&c, &store, &cp2, "bl-fork1", base);
    let f2 = restore_as(&c, &store, &cp2, "bl-fork2", base);
    std::fs::write(f1.join("data/only-fork1"), "x").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    counter_is_consecutive(&f1, n2 + 3);
    counter_is_consecutive(&f2, n2 + 3);
    assert!(
        !f2.join("data/only-fork1").exists(),
        "forks share a writable layer"
    );
    counter_is_consecutive(&rootfs, n + 3);
}

#[test]
fn paused_container_stays_frozen_and_exit_mode_ends_it() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let c = Container::start(base, "bl-paused", COUNTER);
    let store = Store::new(base.join("store"));
    std::thread::sleep(Duration::from_millis(200));
    c.runc.pause(&c.id).unwrap();
    let cp = checkpoint_container(&request(&c, &store, None, true)).unwrap();
    assert_eq!(
        c.status(&c.id).as_deref(),
        Some("paused"),
        "a paused container must stay paused"
    );
    assert_eq!(cp.manifest.timings.freeze_us, 0);
    let frozen = std::fs::read_to_string(c.rootfs.join("data/counter")).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        std::fs::read_to_string(c.rootfs.join("data/counter")).unwrap(),
        frozen,
        "ran while paused"
    );
    c.runc.resume(&c.id).unwrap();

    let cp2 = checkpoint_container(&request(&c, &store, Some(&cp), false)).unwrap();
    assert_eq!(
        c.status(&c.id),
        None,
        "exit mode: runc deletes the container"
    );
    assert!(!cp2.manifest.leave_running);
    criu_bridge::layer::unmount(&c.rootfs).unwrap();
    let rootfs = restore_as(&c, &store, &cp2, &c.id, base);
    std::thread::sleep(Duration::from_millis(200));
    counter_is_consecutive(&rootfs, lines_in(&cp2.fs_dir()) + 3);
}

#[test]
fn criu_failures_concurrency_and_corruption_are_typed_and_harmless() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    // An established TCP connection inside the container.
    let c = Container::start(
        base,
        "bl-errors",
        &format!(
            "sleep 1000 | nc -l -p 7000 >/dev/null & sleep 0.3; (while :; do echo x; sleep 0.05; done) | nc 127.0.0.1 7000 & {COUNTER}"
        ),
    );
    let store = Store::new(base.join("store"));
    std::thread::sleep(Duration::from_millis(600));

    let mut req = request(&c, &store, None, true);
    req.criu.tcp_established = false;
    let err = checkpoint_container(&req).unwrap_err();
    let CheckpointError::Dump { log, .. } = &err else {
        panic!("expected a dump error, got {err}")
    };
    assert!(
        log.lines.iter().any(|l| l.contains("tcp-established")),
        "{err}"
    );
    assert_eq!(
        c.status(&c.id).as_deref(),
        Some("running"),
        "a failed checkpoint must thaw"
    );
    assert!(
        store.list("default", &c.id).unwrap().is_empty(),
        "failed checkpoint listed"
    );

    // With the option on, sockets dump fine (CRIU >= 4.2 on this kernel).
    let cp = checkpoint_container(&request(&c, &store, None, true)).unwrap();

    // A concurrent checkpoint is refused while one holds the lock.
    let held = store.lock("default", &c.id).unwrap();
    let err = checkpoint_container(&request(&c, &store, None, true)).unwrap_err();
    assert!(matches!(err, CheckpointError::InProgress(_)), "{err}");
    assert!(err.to_string().contains("already in progress"));
    drop(held);
    assert_eq!(c.status(&c.id).as_deref(), Some("running"));

    // A CRIU restore failure carries the lines of restore.log.
    let broken = base.join("broken");
    common::sh(
        base,
        &format!("cp -a {} {}", cp.dir.display(), broken.display()),
    );
    std::fs::remove_file(broken.join("criu/pstree.img")).unwrap();
    let broken = criu_bridge::Checkpoint::open(&broken).unwrap();
    let bundle = base.join("bundle-bl-broken");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::copy(c.bundle.join("config.json"), bundle.join("config.json")).unwrap();
    let rootfs = bundle.join("rootfs");
    criu_bridge::mount_rootfs(
        &store,
        &cp,
        &base.join("broken-up"),
        &base.join("broken-wk"),
        &rootfs,
    )
    .unwrap();
    c.extra_mounts.borrow_mut().push(rootfs);
    c.extra_ids.borrow_mut().push("bl-broken".into());
    let work = base.join("broken-work");
    let req = RestoreRequest {
        runc: &c.runc,
        image_dir: &broken.criu_dir(),
        criu: &broken.manifest.criu_options,
        id: "bl-broken",
        bundle: &bundle,
        work_dir: &work,
        detach: true,
        pid_file: None,
        console_socket: None,
        lazy_pages: false,
    };
    let err = criu_bridge::restore_processes(&req, RestoreStdio::default()).unwrap_err();
    // The privilege check reads pstree.img before CRIU runs: a missing one is refused there.
    let criu_bridge::RestoreError::Privilege { source, .. } = &err else {
        panic!("expected a refusal before CRIU, got {err}")
    };
    assert!(
        format!("{source:?}").contains("pstree.img"),
        "{err}: {source:?}"
    );
    assert!(!work.exists(), "nothing is written");

    // A corrupt image byte is caught before anything is touched.
    let img = std::fs::read_dir(cp.criu_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains("pages-"))
        .unwrap();
    let mut bytes = std::fs::read(&img).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&img, bytes).unwrap();
    let err = criu_bridge::verify(&store, &cp, VerifyLevel::Full).unwrap_err();
    let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        text.contains(&*img.file_name().unwrap().to_string_lossy()),
        "{text}"
    );
    assert_eq!(c.status(&c.id).as_deref(), Some("running"));
}

#[test]
fn a_full_store_disk_fails_cleanly_and_the_container_keeps_running() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let c = Container::start(base, "bl-full", COUNTER);
    let small = base.join("small-store");
    std::fs::create_dir_all(&small).unwrap();
    common::sh(
        base,
        &format!("mount -t tmpfs -o size=128k tmpfs {}", small.display()),
    );
    c.extra_mounts.borrow_mut().push(small.clone());
    let store = Store::new(&small);
    std::thread::sleep(Duration::from_millis(200));
    // Exit mode too: the container ends only once its checkpoint is stored.
    for leave_running in [true, false] {
        let err = checkpoint_container(&request(&c, &store, None, leave_running)).unwrap_err();
        assert!(matches!(err, CheckpointError::DiskFull { .. }), "{err}");
        assert!(err.to_string().contains("disk full"), "{err}");
        assert_eq!(
            c.status(&c.id).as_deref(),
            Some("running"),
            "the container must keep running (leave_running {leave_running})"
        );
    }
    assert!(
        store.list("default", &c.id).unwrap().is_empty(),
        "partial checkpoint listed"
    );
    let left: Vec<_> = std::fs::read_dir(store.container_dir("default", &c.id).unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        left,
        [std::ffi::OsString::from(".lock")],
        "partial files left"
    );
    let before = std::fs::read_to_string(c.rootfs.join("data/counter"))
        .unwrap()
        .lines()
        .count();
    std::thread::sleep(Duration::from_millis(200));
    assert!(counter_is_consecutive(&c.rootfs, before + 2) > before);

    // A disk that holds CRIU's images but not the layer: the failure comes after the dump, and
    // an exit-mode checkpoint must still leave the container running (CRIU's own exit mode
    // would have killed it at the dump).
    let big = Store::new(base.join("big-store"));
    let sized = checkpoint_container(&request(&c, &big, None, true)).unwrap();
    let images: u64 = std::fs::read_dir(sized.criu_dir())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    std::fs::write(c.rootfs.join("data/big"), vec![7u8; 8 << 20]).unwrap();
    let medium = base.join("medium-store");
    std::fs::create_dir_all(&medium).unwrap();
    common::sh(
        base,
        &format!(
            "mount -t tmpfs -o size={}k tmpfs {}",
            images / 1024 + 1024,
            medium.display()
        ),
    );
    c.extra_mounts.borrow_mut().push(medium.clone());
    let store = Store::new(&medium);
    let err = checkpoint_container(&request(&c, &store, None, false)).unwrap_err();
    let CheckpointError::DiskFull { path } = &err else {
        panic!("{err}");
    };
    assert!(
        path.components()
            .any(|p| p.as_os_str() == criu_bridge::store::FS_DIR),
        "the disk should fill in the layer's capture, after the dump: {err}"
    );
    assert_eq!(
        c.status(&c.id).as_deref(),
        Some("running"),
        "exit mode, failing after the dump: the container must keep running"
    );
    assert!(store.list("default", &c.id).unwrap().is_empty());
    let before = counter_is_consecutive(&c.rootfs, 1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(counter_is_consecutive(&c.rootfs, before + 2) > before);
}

#[test]
fn an_old_criu_is_refused_by_name_before_anything_is_touched() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("criu");
    std::fs::write(&fake, "#!/bin/sh\necho 'Version: 4.1.1'\n").unwrap();
    common::sh(tmp.path(), "chmod 755 criu");
    let mut runc = criu_bridge::runc::Runc::new(tmp.path().join("runc-root"));
    runc.criu = fake;
    let store = Store::new(tmp.path().join("store"));
    let lowers: Vec<PathBuf> = Vec::new();
    let req = CheckpointRequest {
        runc: &runc,
        store: &store,
        namespace: "default",
        id: "nothing",
        bundle: tmp.path(),
        upper_dir: tmp.path(),
        image_lowers: &lowers,
        rootfs_shared: false,
        parent: None,
        leave_running: true,
        uncaptured_execs: &[],
        criu: CriuOptions::default(),
        yield_to_blocked: false,
        frozen_limit: criu_bridge::DEFAULT_FROZEN_LIMIT,
    };
    let err = checkpoint_container(&req).unwrap_err();
    assert!(matches!(err, CheckpointError::Criu(_)), "{err}");
    assert!(
        err.to_string().contains("4.1.1") && err.to_string().contains(">= 4.2"),
        "{err}"
    );
    assert!(!store.root().exists(), "the gate must come first");
    // The installed one passes.
    let v = criu_bridge::criu::check_criu(&common::which("criu"))
        .expect("installed CRIU must be >= 4.2");
    eprintln!("installed CRIU {v}");
}

/// Waits up to 30 s for `path` to exist.
fn wait_for(path: &Path) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A lazy restore runs the processes before their memory is filled: the memory they read
/// afterwards is the checkpointed memory, the lazy-pages daemon exits once every page is in
/// place, and a lazily restored container killed at once takes its daemon with it.
#[test]
fn lazy_restore_gives_back_the_same_memory_and_its_daemon_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let c = Container::start(
        base,
        "bl-lazy",
        "x=$(head -c 30000000 /dev/urandom | base64); echo \"$x\" | md5sum > /data/sum; \
         while :; do if [ -f /data/check ]; then echo \"$x\" | md5sum > /data/tmp; \
         mv /data/tmp /data/sum2; rm /data/check; fi; sleep 0.02; done",
    );
    assert!(
        criu_bridge::lazy::lazy_pages_supported(&c.runc),
        "this kernel or CRIU cannot restore lazily (criu check --feature uffd-noncoop)"
    );
    wait_for(&c.rootfs.join("data/sum"));
    let store = Store::new(base.join("store"));
    let cp = checkpoint_container(&request(&c, &store, None, false)).unwrap();
    c.runc.delete(&c.id, true).unwrap();
    criu_bridge::layer::unmount(&c.rootfs).unwrap();

    let (rootfs, report) = restore_with(&c, &store, &cp, &c.id, base, true);
    let lazy = report.lazy.expect("a lazy-pages daemon");
    std::fs::write(rootfs.join("data/check"), "").unwrap();
    wait_for(&rootfs.join("data/sum2"));
    assert_eq!(
        std::fs::read_to_string(rootfs.join("data/sum")).unwrap(),
        std::fs::read_to_string(rootfs.join("data/sum2")).unwrap(),
        "the restored process reads other memory than it had"
    );
    assert!(
        lazy.wait(Duration::from_secs(30)),
        "lazy-pages daemon {} still running 30 s after the restore",
        lazy.pid()
    );

    // A fork killed at once: its daemon must not wait forever for pages nobody will touch.
    let (_, report) = restore_with(&c, &store, &cp, "bl-lazy-fork", base, true);
    let lazy = report.lazy.expect("a lazy-pages daemon");
    c.kill("bl-lazy-fork");
    assert!(
        lazy.wait(Duration::from_secs(30)),
        "lazy-pages daemon {} outlived its killed container",
        lazy.pid()
    );
}

/// Not a check: prints checkpoint / verify / restore figures for a process holding ~100 MB.
/// `cargo test --release -p criu-bridge --test runc_criu measure -- --ignored --nocapture`
#[test]
#[ignore]
fn measure_a_checkpoint_of_a_100_mb_process() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let c = Container::start(
        base,
        "bl-measure",
        "x=$(head -c 75000000 /dev/urandom | base64); echo ready > /data/ready; while :; do sleep 1; done",
    );
    for _ in 0..300 {
        if c.rootfs.join("data/ready").exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        c.rootfs.join("data/ready").exists(),
        "the process did not fill its memory"
    );
    common::sh(&c.rootfs, "head -c 50000000 /dev/urandom > data/blob");
    let store = Store::new(base.join("store"));
    let cp = checkpoint_container(&request(&c, &store, None, true)).unwrap();
    eprintln!(
        "checkpoint: {:?}\nsizes: {:?}\ncriu: {:?}",
        cp.manifest.timings, cp.manifest.sizes, cp.manifest.criu_stats
    );
    for level in [VerifyLevel::Full, VerifyLevel::Stamped, VerifyLevel::Sizes] {
        let t = std::time::Instant::now();
        criu_bridge::verify(&store, &cp, level).unwrap();
        eprintln!("verify {level:?}: {:?}", t.elapsed());
    }
    c.kill(&c.id);
    criu_bridge::layer::unmount(&c.rootfs).unwrap();
    let t = std::time::Instant::now();
    restore_as(&c, &store, &cp, &c.id, base);
    eprintln!("verify(Full) + mount + restore: {:?}", t.elapsed());
}
