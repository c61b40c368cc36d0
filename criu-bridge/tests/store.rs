//! The checkpoint format and store: atomic writes, verification errors that name the file,
//! version and truncation checks, the per-container lock, a full disk, chains and deletion.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{MountGuard, require_root, sh};
use criu_bridge::layer::capture_layer;
use criu_bridge::store::{
    CompactCheckpointError, FORMAT_VERSION, FormatError, Manifest, StoreError, VerifyError,
    VerifyLevel, verify_checkpoint,
};
use criu_bridge::{Checkpoint, Store};

fn manifest(
    container: &str,
    seq: u64,
    parent: Option<&Checkpoint>,
    lowers: &[PathBuf],
) -> Manifest {
    let mut chain = vec![seq];
    if let Some(p) = parent {
        chain.extend(&p.manifest.fs_chain);
    }
    Manifest {
        format_version: FORMAT_VERSION,
        namespace: "default".into(),
        container: container.into(),
        seq,
        parent: parent.map(|p| p.manifest.seq),
        created_unix_ms: 0,
        spec_digest: "sha256:test".into(),
        image_lowers: lowers.to_vec(),
        rootfs_shared: false,
        fs_chain: chain,
        criu_dir: "criu".into(),
        fs_dir: "fs".into(),
        leave_running: true,
        uncaptured_execs: Vec::new(),
        criu_options: Default::default(),
        sizes: Default::default(),
        timings: Default::default(),
        criu_stats: None,
        capture: Default::default(),
        files: Vec::new(),
    }
}

/// A checkpoint without processes: fake CRIU images plus a real layer capture of `upper`.
fn fake_checkpoint(
    store: &Store,
    upper: &Path,
    lower: &Path,
    parent: Option<&Checkpoint>,
) -> Result<Checkpoint, StoreError> {
    fake_checkpoint_of(store, "c1", upper, &[lower.to_path_buf()], parent)
}

fn fake_checkpoint_of(
    store: &Store,
    container: &str,
    upper: &Path,
    lowers: &[PathBuf],
    parent: Option<&Checkpoint>,
) -> Result<Checkpoint, StoreError> {
    let lock = store.lock("default", container)?;
    let pending = store.begin(&lock)?;
    fs::write(pending.criu_dir().join("pages-1.img"), vec![7u8; 100_000]).unwrap();
    fs::write(pending.criu_dir().join("core-1.img"), b"core").unwrap();
    let parent_index = parent.map(|p| p.read_index().unwrap());
    let (index, capture) =
        capture_layer(upper, parent_index.as_ref(), &pending.fs_dir()).map_err(|e| match e {
            criu_bridge::layer::CaptureError::DiskFull(c) => StoreError::DiskFull { path: c.path },
            e => panic!("{e}"),
        })?;
    pending.write_index(&index)?;
    let mut m = manifest(container, pending.seq(), parent, lowers);
    m.capture = capture;
    pending.commit(m)
}

struct Env {
    _tmp: tempfile::TempDir,
    store: Store,
    lower: PathBuf,
    upper: PathBuf,
    merged: PathBuf,
    _mount: MountGuard,
}

fn env() -> Env {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let lower = tmp.path().join("lower");
    fs::create_dir_all(lower.join("etc")).unwrap();
    fs::write(lower.join("etc/os"), "img").unwrap();
    let (mount, upper, merged) =
        common::mount_fresh(tmp.path(), "live", std::slice::from_ref(&lower));
    let store = Store::new(tmp.path().join("store"));
    Env {
        store,
        lower,
        upper,
        merged,
        _mount: mount,
        _tmp: tmp,
    }
}

#[test]
fn written_checkpoints_verify_and_are_private() {
    let e = env();
    sh(&e.merged, "echo one > a; mkdir d; echo two > d/b");
    let cp = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    assert_eq!(e.store.list("default", "c1").unwrap(), [1]);
    verify_checkpoint(&e.store, &cp, VerifyLevel::Full).unwrap();
    assert!(
        cp.dir.with_file_name(".verified-1").is_file(),
        "no verification stamp written"
    );
    verify_checkpoint(&e.store, &cp, VerifyLevel::Stamped).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for d in [
        e.store.root().join("checkpoints"),
        cp.dir.clone(),
        cp.criu_dir(),
    ] {
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o777,
            0o700,
            "{}",
            d.display()
        );
    }
    let loaded = e.store.load("default", "c1", 1).unwrap();
    assert_eq!(loaded, cp);
    assert!(cp.manifest.sizes.criu_bytes >= 100_000 && cp.manifest.sizes.files > 4);
}

#[test]
fn a_corrupt_byte_names_the_file() {
    let e = env();
    sh(&e.merged, "echo data > a");
    let cp = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    let victim = cp.criu_dir().join("pages-1.img");
    let mut bytes = fs::read(&victim).unwrap();
    bytes[5000] ^= 1;
    fs::write(&victim, bytes).unwrap();
    verify_checkpoint(&e.store, &cp, VerifyLevel::Sizes).unwrap();
    let err = verify_checkpoint(&e.store, &cp, VerifyLevel::Stamped).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Corrupt { file, .. } if *file == victim),
        "stamped: {err}"
    );
    let err = verify_checkpoint(&e.store, &cp, VerifyLevel::Full).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Corrupt { file, .. } if *file == victim),
        "{err}"
    );
    assert!(err.to_string().contains("pages-1.img"), "{err}");

    fs::write(cp.fs_dir().join("a"), "data\nmore").unwrap();
    fs::write(cp.criu_dir().join("pages-1.img"), vec![7u8; 100_000]).unwrap();
    let err = verify_checkpoint(&e.store, &cp, VerifyLevel::Sizes).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Changed { file, .. } if file.ends_with("fs/a")),
        "{err}"
    );
    fs::write(cp.fs_dir().join("a"), "data\n").unwrap();
    fs::write(cp.fs_dir().join("planted"), "x").unwrap();
    let err = verify_checkpoint(&e.store, &cp, VerifyLevel::Full).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Extra { file } if file.ends_with("fs/planted")),
        "{err}"
    );
    fs::remove_file(cp.fs_dir().join("planted")).unwrap();
    fs::remove_file(cp.criu_dir().join("core-1.img")).unwrap();
    let err = verify_checkpoint(&e.store, &cp, VerifyLevel::Full).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Missing { file } if file.ends_with("criu/core-1.img")),
        "{err}"
    );
}

#[test]
fn truncated_manifest_and_unknown_version_are_clear_errors() {
    let e = env();
    sh(&e.merged, "echo data > a");
    let cp = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    let path = cp.dir.join("manifest.json");
    let good = fs::read(&path).unwrap();
    fs::write(&path, &good[..good.len() - 40]).unwrap();
    let err = e.store.load("default", "c1", 1).unwrap_err();
    assert!(
        matches!(err, StoreError::Format(FormatError::Truncated { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("truncated"), "{err}");

    let text = String::from_utf8(good).unwrap().replacen(
        "\"format_version\": 1",
        "\"format_version\": 99",
        1,
    );
    fs::write(&path, text).unwrap();
    let err = e.store.load("default", "c1", 1).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Format(FormatError::UnknownVersion { found: 99, .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("format_version 99"), "{err}");

    let err = e.store.load("default", "c1", 42).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { seq: 42, .. }), "{err}");
}

#[test]
fn concurrent_checkpoints_of_one_container_are_refused() {
    let e = env();
    let _held = e.store.lock("default", "c1").unwrap();
    let err = e.store.lock("default", "c1").unwrap_err();
    assert!(matches!(err, StoreError::InProgress { .. }), "{err}");
    assert!(err.to_string().contains("already in progress"), "{err}");
    // Another container is not blocked.
    e.store.lock("default", "c2").unwrap();
}

#[test]
fn partial_checkpoints_are_never_listed_and_are_cleaned() {
    let e = env();
    sh(&e.merged, "echo data > a");
    fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    {
        let lock = e.store.lock("default", "c1").unwrap();
        let pending = e.store.begin(&lock).unwrap();
        fs::write(pending.criu_dir().join("x.img"), b"half").unwrap();
        assert_eq!(e.store.list("default", "c1").unwrap(), [1]);
        std::mem::forget(pending); // a crash: the temp dir stays
    }
    let dir = e.store.container_dir("default", "c1").unwrap();
    let tmp_count = || {
        fs::read_dir(&dir)
            .unwrap()
            .filter(|d| {
                d.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(".tmp-")
            })
            .count()
    };
    assert_eq!(tmp_count(), 1);
    assert_eq!(e.store.list("default", "c1").unwrap(), [1]);
    assert_eq!(tmp_count(), 0, "left-over temp dir not cleaned");
}

#[test]
fn a_full_disk_leaves_no_partial_checkpoint() {
    let e = env();
    let small = e._tmp.path().join("small");
    fs::create_dir_all(&small).unwrap();
    sh(
        e._tmp.path(),
        &format!("mount -t tmpfs -o size=2m tmpfs {}", small.display()),
    );
    let _g = MountGuard(small.clone());
    let store = Store::new(&small);
    sh(&e.merged, "head -c 4000000 /dev/urandom > big");
    let err = fake_checkpoint(&store, &e.upper, &e.lower, None).unwrap_err();
    assert!(matches!(err, StoreError::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("disk full"), "{err}");
    assert!(store.list("default", "c1").unwrap().is_empty());
    let leftovers: Vec<_> = fs::read_dir(store.container_dir("default", "c1").unwrap())
        .unwrap()
        .map(|d| d.unwrap().file_name())
        .collect();
    assert_eq!(
        leftovers,
        [std::ffi::OsString::from(".lock")],
        "partial files left: {leftovers:?}"
    );
    // After freeing space, the next checkpoint works.
    fs::remove_file(e.merged.join("big")).unwrap();
    fake_checkpoint(&store, &e.upper, &e.lower, None).unwrap();
}

#[test]
fn chains_keep_their_members_until_compacted() {
    let e = env();
    sh(&e.merged, "echo 1 > a; mkdir d; echo x > d/x");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    sh(&e.merged, "echo 2 > b; rm d/x; rm etc/os");
    let c2 = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    sh(&e.merged, "echo 3 > c; rm -rf d");
    let c3 = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c2)).unwrap();
    assert_eq!(c3.manifest.fs_chain, [3, 2, 1]);
    let expected = criu_bridge::tree::snapshot_tree(&e.merged).unwrap();

    let err = e.store.delete("default", "c1", 1).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::InChain {
                seq: 1,
                needed_by: 2
            }
        ),
        "{err}"
    );

    for seq in [3, 2] {
        e.store.compact("default", "c1", seq).unwrap();
    }
    e.store.delete("default", "c1", 1).unwrap();
    e.store.delete("default", "c1", 2).unwrap();
    assert_eq!(e.store.list("default", "c1").unwrap(), [3]);
    let c3 = e.store.load("default", "c1", 3).unwrap();
    assert_eq!(c3.manifest.fs_chain, [3]);
    verify_checkpoint(&e.store, &c3, VerifyLevel::Full).unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("u");
    let target = tmp.path().join("m");
    criu_bridge::mount_rootfs(&e.store, &c3, &upper, &tmp.path().join("w"), &target).unwrap();
    let _g = MountGuard(target.clone());
    let got = criu_bridge::tree::snapshot_tree(&target).unwrap();
    let diff = criu_bridge::tree::diff_trees(&expected, &got);
    assert!(diff.is_empty(), "{diff:#?}");
}

/// The tree a rootfs mounted from `cp` shows.
fn mounted_tree(store: &Store, cp: &Checkpoint) -> criu_bridge::tree::TreeSnapshot {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("m");
    criu_bridge::mount_rootfs(
        store,
        cp,
        &tmp.path().join("u"),
        &tmp.path().join("w"),
        &target,
    )
    .unwrap();
    let _g = MountGuard(target.clone());
    criu_bridge::tree::snapshot_tree(&target).unwrap()
}

/// A compacted layer keeps only the whiteouts that hide something in the image: compacting a
/// checkpoint while a later one stacks on its layer would let that one's older layers show
/// files the chain had deleted. Compaction is refused then, and newest-first it works, every
/// checkpoint still showing its own instant.
#[test]
fn compaction_waits_for_the_checkpoints_stacked_on_it() {
    let e = env();
    sh(&e.merged, "mkdir work; echo x > work/x; echo y > work/y");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    sh(&e.merged, "rm work/x; echo 2 > work/y");
    let c2 = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    let at2 = criu_bridge::tree::snapshot_tree(&e.merged).unwrap();
    sh(&e.merged, "echo 3 > work/z");
    let c3 = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c2)).unwrap();
    let at3 = criu_bridge::tree::snapshot_tree(&e.merged).unwrap();

    let err = e.store.compact("default", "c1", 2).unwrap_err();
    assert!(
        matches!(
            err,
            CompactCheckpointError::Store(StoreError::InChain {
                seq: 2,
                needed_by: 3
            })
        ),
        "{err}"
    );
    let diff = criu_bridge::tree::diff_trees(&at3, &mounted_tree(&e.store, &c3));
    assert!(diff.is_empty(), "checkpoint 3 after the refusal: {diff:#?}");

    let c3 = e.store.compact("default", "c1", 3).unwrap();
    let c2 = e.store.compact("default", "c1", 2).unwrap();
    e.store.delete("default", "c1", 1).unwrap();
    for (cp, want) in [(&c2, &at2), (&c3, &at3)] {
        verify_checkpoint(&e.store, cp, VerifyLevel::Full).unwrap();
        let diff = criu_bridge::tree::diff_trees(want, &mounted_tree(&e.store, cp));
        assert!(diff.is_empty(), "checkpoint {}: {diff:#?}", cp.manifest.seq);
    }
}

#[test]
fn bad_names_are_refused() {
    let store = Store::new("/nonexistent");
    for bad in ["", "..", ".hidden", "a/b", "x y"] {
        assert!(
            matches!(
                store.container_dir("default", bad),
                Err(StoreError::BadName { .. })
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn a_fork_keeps_its_source_layers_until_compacted() {
    let e = env();
    sh(&e.merged, "echo 1 > a; mkdir d; echo x > d/x");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    // Fork: a fresh upper over c1's rootfs; its first checkpoint stacks on c1's chain.
    let lowers = criu_bridge::rootfs_lowers(&e.store, &c1).unwrap();
    let (g, fork_upper, fork_merged) = common::mount_fresh(e._tmp.path(), "fork", &lowers);
    sh(&fork_merged, "echo f > fork-only; rm d/x; echo 2 >> a");
    let expected = criu_bridge::tree::snapshot_tree(&fork_merged).unwrap();
    let f1 = fake_checkpoint_of(&e.store, "f1", &fork_upper, &lowers, None).unwrap();
    drop(g);
    assert_eq!(f1.manifest.image_lowers, lowers);

    // The source's layer is part of what restores the fork: a byte changed there is found.
    let victim = c1.fs_dir().join("d/x");
    let good = fs::read(&victim).unwrap();
    fs::write(&victim, b"y\n").unwrap();
    let err = verify_checkpoint(&e.store, &f1, VerifyLevel::Full).unwrap_err();
    assert!(
        matches!(&err, VerifyError::Corrupt { file, .. } if *file == victim),
        "{err}"
    );
    fs::write(&victim, good).unwrap();
    verify_checkpoint(&e.store, &f1, VerifyLevel::Full).unwrap();

    let err = e.store.delete("default", "c1", 1).unwrap_err();
    assert!(
        matches!(&err, StoreError::UsedAsLower { seq: 1, by } if *by == f1.dir),
        "{err}"
    );
    let f1 = e.store.compact("default", "f1", 1).unwrap();
    assert_eq!(f1.manifest.image_lowers, std::slice::from_ref(&e.lower));
    e.store.delete("default", "c1", 1).unwrap();
    assert!(
        !c1.dir.with_file_name(".verified-1").exists(),
        "stamp left behind"
    );

    verify_checkpoint(&e.store, &f1, VerifyLevel::Stamped).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("m");
    criu_bridge::mount_rootfs(
        &e.store,
        &f1,
        &tmp.path().join("u"),
        &tmp.path().join("w"),
        &target,
    )
    .unwrap();
    let _g = MountGuard(target.clone());
    let diff = criu_bridge::tree::diff_trees(
        &expected,
        &criu_bridge::tree::snapshot_tree(&target).unwrap(),
    );
    assert!(diff.is_empty(), "{diff:#?}");
}

/// A lease (a mounted rootfs stacking on checkpoints' layers) keeps every checkpoint it covers
/// from deletion and compaction, naming its holder; a lease whose holder is gone (its file
/// unlocked) does not, and is cleared; a checkpoint that is gone cannot be leased.
#[test]
fn a_lease_keeps_its_checkpoints_until_released() {
    let e = env();
    sh(&e.merged, "echo 1 > a");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    sh(&e.merged, "echo 2 > b");
    let c2 = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    let in_use = |err: &StoreError, seq: u64, holders: &[&str]| {
        matches!(err, StoreError::InUse { seq: s, container, holders: h }
            if *s == seq && container == "default/c1" && h == holders)
    };

    let lease = e.store.lease(&c2, ("default", "runner")).unwrap();
    let other = e.store.lease(&c2, ("k8s.io", "other")).unwrap();
    let err = e.store.delete("default", "c1", 2).unwrap_err();
    assert!(
        in_use(&err, 2, &["default/runner", "k8s.io/other"]),
        "{err}"
    );
    assert!(
        err.to_string().contains("default/runner, k8s.io/other"),
        "{err}"
    );
    let err = e.store.compact("default", "c1", 2).unwrap_err();
    assert!(
        matches!(&err, CompactCheckpointError::Store(s) if in_use(s, 2, &["default/runner", "k8s.io/other"])),
        "{err}"
    );
    assert_eq!(
        e.store.load("default", "c1", 2).unwrap(),
        c2,
        "a refused compaction changed it"
    );
    let names = |dir: &Path| -> Vec<String> {
        fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    };
    let container_dir = c2.dir.parent().unwrap().to_path_buf();
    assert!(
        !names(&container_dir).iter().any(|n| n.starts_with(".tmp-")),
        "a refused compaction left its work: {:?}",
        names(&container_dir)
    );
    drop(other);

    // A fork's checkpoint stacks on c1's layers: leasing it leases them.
    let lowers = criu_bridge::rootfs_lowers(&e.store, &c2).unwrap();
    let (g, fork_upper, fork_merged) = common::mount_fresh(e._tmp.path(), "fork", &lowers);
    sh(&fork_merged, "echo f > fork-only");
    let f1 = fake_checkpoint_of(&e.store, "f1", &fork_upper, &lowers, None).unwrap();
    drop(g);
    drop(lease);
    let forked = e.store.lease(&f1, ("default", "forked")).unwrap();
    let err = e.store.compact("default", "c1", 2).unwrap_err();
    assert!(
        matches!(&err, CompactCheckpointError::Store(s) if in_use(s, 2, &["default/forked"])),
        "{err}"
    );
    drop(forked);

    // A holder that died leaves its file unlocked: it does not count, and goes.
    let leases = container_dir.join(".leases");
    fs::write(leases.join("2+default+ghost+4194304.0"), "").unwrap();
    // The fork's checkpoint stacks on checkpoint 2's layer until it is compacted itself.
    let err = e.store.compact("default", "c1", 2).unwrap_err();
    assert!(
        matches!(&err, CompactCheckpointError::Store(StoreError::UsedAsLower { seq: 2, by }) if *by == f1.dir),
        "{err}"
    );
    e.store.compact("default", "f1", 1).unwrap();
    e.store.compact("default", "c1", 2).unwrap();
    assert!(
        !names(&leases).iter().any(|n| n.starts_with("2+")),
        "leases left: {:?}",
        names(&leases)
    );
    e.store.delete("default", "c1", 1).unwrap();
    let err = e.store.lease(&c1, ("default", "late")).unwrap_err();
    assert!(matches!(err, StoreError::NotFound { seq: 1, .. }), "{err}");
    assert!(
        names(&leases).iter().all(|n| n == ".lock"),
        "{:?}",
        names(&leases)
    );
}

/// Adopting another store's checkpoints of a container (an export unpacked beside the store):
/// the missing ones move in whole, and another checkpoint of a number this store has (taken at
/// another time) is refused before anything moves.
#[test]
fn adoption_moves_in_what_is_missing_and_refuses_a_clash() {
    let e = env();
    let c1 = chain_of_two(&e);
    let copy = |name: &str| {
        let root = e._tmp.path().join(name);
        copy_tree(e.store.root(), &root);
        Store::new(root)
    };
    let theirs = copy("theirs");
    let clash = copy("clash");
    let again = copy("again");
    e.store.delete("default", "c1", 2).unwrap();

    let a = e
        .store
        .adoption(&theirs, "default", "c1")
        .unwrap()
        .expect("checkpoints to adopt");
    let seqs = |a: &criu_bridge::store::Adoption| -> Vec<u64> {
        a.missing.iter().map(|c| c.manifest.seq).collect()
    };
    assert_eq!((a.newest, seqs(&a)), (2, vec![2]));
    e.store.adopt(&a).unwrap();
    assert_eq!(e.store.list("default", "c1").unwrap(), [1, 2]);
    let c2 = e.store.load("default", "c1", 2).unwrap();
    verify_checkpoint(&e.store, &c2, VerifyLevel::Full).unwrap();
    assert!(
        e.store
            .adoption(&again, "default", "c1")
            .unwrap()
            .is_some_and(|a| a.missing.is_empty()),
        "the same chain again has something to move"
    );
    assert!(
        e.store
            .adoption(&theirs, "default", "other")
            .unwrap()
            .is_none()
    );

    // Checkpoint 1 of `clash` was taken at another time: not this store's checkpoint 1.
    let path = clash
        .load("default", "c1", 1)
        .unwrap()
        .dir
        .join("manifest.json");
    let mut m = Manifest::read(&path).unwrap();
    m.created_unix_ms += 5;
    fs::write(&path, m.to_bytes()).unwrap();
    e.store.delete("default", "c1", 2).unwrap();
    let err = e.store.adoption(&clash, "default", "c1").unwrap_err();
    assert!(matches!(err, StoreError::Clash { seq: 1, .. }), "{err}");
    assert!(
        err.to_string()
            .contains("is not the one in this node's store"),
        "{err}"
    );
    assert_eq!(e.store.list("default", "c1").unwrap(), [1]);
    assert_eq!(clash.list("default", "c1").unwrap(), [1, 2]);

    // This store takes checkpoint 2 of its own between the look and the move: a clash too, and
    // neither checkpoint 2 goes anywhere.
    let late = e
        .store
        .adoption(&again, "default", "c1")
        .unwrap()
        .expect("checkpoints to adopt");
    assert_eq!(seqs(&late), vec![2]);
    sh(&e.merged, "echo 3 > c");
    let own = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    let path = own.dir.join("manifest.json");
    let mut m = Manifest::read(&path).unwrap();
    m.created_unix_ms += 7;
    fs::write(&path, m.to_bytes()).unwrap();
    let err = e.store.adopt(&late).unwrap_err();
    assert!(matches!(err, StoreError::Clash { seq: 2, .. }), "{err}");
    let kept = e.store.load("default", "c1", 2).unwrap();
    assert_eq!(kept.manifest.created_unix_ms, m.created_unix_ms);
    assert_eq!(again.list("default", "c1").unwrap(), [1, 2]);
}

/// An export is a self-contained copy: its chain merged into one layer, verifying on its own and
/// mounting the exported instant after the store's checkpoints are gone. It leases what it reads
/// only while it reads it: the checkpoints can be removed afterwards.
#[test]
fn an_export_stands_alone_and_leaves_no_lease() {
    let e = env();
    sh(&e.merged, "mkdir work; echo x > work/x; echo y > work/y");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    sh(&e.merged, "rm work/x; echo 2 > work/y; ln work/y work/y2");
    fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    let at2 = criu_bridge::tree::snapshot_tree(&e.merged).unwrap();

    let dest = e.store.root().with_file_name("exported");
    let out = e.store.export("default", "c1", 2, &dest).unwrap();
    assert_eq!(out.manifest.fs_chain, vec![2]);
    let err = e.store.export("default", "c1", 2, &dest).unwrap_err();
    assert!(err.to_string().contains("exported"), "{err}");

    e.store.delete("default", "c1", 2).unwrap();
    e.store.delete("default", "c1", 1).unwrap();
    let out = Checkpoint::open(&dest).unwrap();
    criu_bridge::store::verify_dir(&out, VerifyLevel::Full).unwrap();
    let diff = criu_bridge::tree::diff_trees(&at2, &mounted_tree(&e.store, &out));
    assert!(diff.is_empty(), "the export of checkpoint 2: {diff:#?}");
}

/// A compaction or an export of a damaged checkpoint is refused, and the checkpoint stays as it
/// is: the copy's manifest is hashed from the copy, so the damage would otherwise become the
/// truth and a restore of it verify (found by the chaos soak: corrupt-newest, then retention's
/// compaction, then the restore succeeded). Damage in an image and in a chain member's layer.
#[test]
fn a_damaged_checkpoint_is_neither_compacted_nor_exported() {
    let e = env();
    chain_of_two(&e);
    let c2 = e.store.load("default", "c1", 2).unwrap();
    let flip = |file: &Path| {
        let mut bytes = fs::read(file).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        fs::write(file, bytes).unwrap();
    };
    let image = c2.criu_dir().join("pages-1.img");
    flip(&image);
    let manifest = fs::read(c2.dir.join("manifest.json")).unwrap();
    for err in [
        e.store.compact("default", "c1", 2).unwrap_err(),
        e.store
            .export("default", "c1", 2, &e.store.root().with_file_name("out"))
            .unwrap_err(),
    ] {
        assert!(
            matches!(
                &err,
                CompactCheckpointError::Corrupt { seq: 2, source: VerifyError::Corrupt { file, .. } }
                    if *file == image
            ),
            "{err:?}"
        );
    }
    assert_eq!(fs::read(c2.dir.join("manifest.json")).unwrap(), manifest);
    assert!(!e.store.root().with_file_name("out").exists());
    let c2 = e.store.load("default", "c1", 2).unwrap();
    let err = verify_checkpoint(&e.store, &c2, VerifyLevel::Full).unwrap_err();
    assert!(matches!(&err, VerifyError::Corrupt { .. }), "{err}");
    flip(&image);

    // Checkpoint 1's layer, which 2's chain merges.
    let c1 = e.store.load("default", "c1", 1).unwrap();
    fs::write(c1.fs_dir().join("a"), "9\n").unwrap();
    let err = e.store.compact("default", "c1", 2).unwrap_err();
    assert!(
        matches!(&err, CompactCheckpointError::Corrupt { seq: 2, source: VerifyError::Corrupt { file, .. } }
            if file.ends_with("fs/a")),
        "{err:?}"
    );
    assert_eq!(
        e.store.load("default", "c1", 2).unwrap().manifest.fs_chain,
        [2, 1]
    );
    fs::write(c1.fs_dir().join("a"), "1\n").unwrap();
    e.store.compact("default", "c1", 2).unwrap();
}

/// `cp -a from to`.
fn copy_tree(from: &Path, to: &Path) {
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(copied.success());
}

/// Checkpoints 1 and 2 of container c1, 2 stacked on 1; returns 1.
fn chain_of_two(e: &Env) -> Checkpoint {
    sh(&e.merged, "echo 1 > a");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    sh(&e.merged, "echo 2 > b");
    fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    c1
}

/// The checkpoint in `dir`, its manifest read as it is (no confinement checks).
fn raw_checkpoint(dir: &Path) -> Checkpoint {
    Checkpoint {
        dir: dir.into(),
        manifest: serde_json::from_slice(&fs::read(dir.join("manifest.json")).unwrap()).unwrap(),
    }
}

/// Rewrites checkpoint `cp`'s manifest as `edit` says (an archive's author can write anything).
fn forge(cp: &Checkpoint, edit: impl FnOnce(&mut Manifest)) {
    let path = cp.dir.join("manifest.json");
    // As it is: no checks, for a forged one is what the test reads back.
    let mut m: Manifest = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(&mut m);
    fs::write(&path, m.to_bytes()).unwrap();
}

/// A `criu_dir` or `fs_dir` outside the checkpoint (absolute, `..`) or through a symlink (to a
/// host dir) is refused when the checkpoint is loaded: nothing is created, moved or mounted by
/// its name. The symlinked `fs` is recorded in the manifest as a symlink, so verification alone
/// passes it.
#[test]
fn paths_a_manifest_names_stay_inside_its_checkpoint() {
    let e = env();
    sh(&e.merged, "echo 1 > a");
    let cp = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    let cron = e._tmp.path().join("cron.d");
    for criu_dir in [cron.display().to_string(), "../../../../cron.d".into()] {
        forge(&cp, |m| m.criu_dir = criu_dir.clone());
        let err = e.store.load("default", "c1", 1).unwrap_err();
        assert!(
            matches!(
                &err,
                StoreError::Format(FormatError::Invalid {
                    field: "criu_dir",
                    ..
                })
            ),
            "{criu_dir}: {err}"
        );
        let err = Checkpoint::open(&cp.dir).unwrap_err();
        assert!(err.to_string().contains("criu_dir"), "{err}");
    }
    forge(&cp, |m| m.criu_dir = "criu".into());

    // `fs` swapped for a symlink to a host dir, the manifest made to match.
    let host = e._tmp.path().join("host-etc");
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("shadow"), "root:secret").unwrap();
    fs::remove_dir_all(cp.fs_dir()).unwrap();
    std::os::unix::fs::symlink(&host, cp.fs_dir()).unwrap();
    forge(&cp, |m| {
        m.files.retain(|f| !f.path.starts_with("fs/"));
        let target = host.display().to_string();
        let fs_entry = m.files.iter_mut().find(|f| f.path == "fs").unwrap();
        fs_entry.kind = 'l';
        fs_entry.size = 0;
        fs_entry.sha256 = Some(criu_bridge::tree::hex(
            &<sha2::Sha256 as sha2::Digest>::digest(target.as_bytes()),
        ));
    });
    criu_bridge::store::verify_dir(&raw_checkpoint(&cp.dir), VerifyLevel::Full)
        .expect("the forged manifest matches the dir");
    let err = e.store.load("default", "c1", 1).unwrap_err();
    assert!(
        matches!(&err, StoreError::Unconfined { what: "fs_dir", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("symlink"), "{err}");
    assert!(
        !cron.exists() && fs::read_dir(&host).unwrap().count() == 1,
        "something was written outside the checkpoint"
    );
}

/// `checkpoints/<ns>/<c>` as a symlink to another container's dir (what an archive can unpack)
/// is refused: the other container's checkpoints are neither listed, locked nor moved as this
/// one's.
#[test]
fn a_symlinked_container_dir_is_refused() {
    let e = env();
    sh(&e.merged, "echo 1 > a");
    fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    let victim = e.store.container_dir("default", "c1").unwrap();
    let evil = e.store.container_dir("default", "evil").unwrap();
    std::os::unix::fs::symlink(&victim, &evil).unwrap();
    for err in [
        e.store.list("default", "evil").unwrap_err(),
        e.store.lock("default", "evil").unwrap_err(),
        e.store.load("default", "evil", 1).unwrap_err(),
    ] {
        assert!(
            matches!(
                &err,
                StoreError::Unconfined {
                    what: "container dir" | "manifest",
                    ..
                }
            ),
            "{err}"
        );
    }
    assert_eq!(e.store.list("default", "c1").unwrap(), [1]);
}

/// A checkpoint id past 2^32 (an archive's `18446744073709551615`) is not a checkpoint: it is
/// never listed nor newest, and the next id is the next of the real ones, never a wrapped 0.
#[test]
fn checkpoint_ids_are_bounded_and_never_wrap() {
    let e = env();
    sh(&e.merged, "echo 1 > a");
    let c1 = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    let huge = c1.dir.with_file_name(u64::MAX.to_string());
    copy_tree(&c1.dir, &huge);
    forge(&raw_checkpoint(&huge), |m| {
        m.seq = u64::MAX;
        m.fs_chain = vec![u64::MAX];
    });
    assert_eq!(e.store.list("default", "c1").unwrap(), [1]);
    let latest = e.store.latest("default", "c1").unwrap().unwrap();
    assert_eq!(latest.manifest.seq, 1);
    assert!(e.store.load("default", "c1", u64::MAX).is_err());
    sh(&e.merged, "echo 2 > b");
    let c2 = fake_checkpoint(&e.store, &e.upper, &e.lower, Some(&c1)).unwrap();
    assert_eq!(c2.manifest.seq, 2);
}

/// An imported chain becomes the importer's: claimed under its namespace and id, on its image
/// lower dirs, whatever the archive's manifests name; an archive with more than one chain, a
/// checkpoint id out of range, another number of image layers, or a chain member it lacks is
/// refused before anything moves.
#[test]
fn an_import_is_claimed_by_the_importer_and_stacks_only_on_itself() {
    let e = env();
    chain_of_two(&e);
    let n = std::sync::atomic::AtomicU32::new(0);
    let staging = || {
        // What an export's archive holds: the one container's dir.
        let root = e._tmp.path().join(format!(
            "staging-{}",
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        fs::create_dir_all(root.join("checkpoints/default")).unwrap();
        copy_tree(
            &e.store.container_dir("default", "c1").unwrap(),
            &root.join("checkpoints/default"),
        );
        Store::new(root)
    };
    let image = vec![e._tmp.path().join("snapshot-of-the-importer")];
    fs::create_dir_all(&image[0]).unwrap();

    // The archive names default/c1 and a host dir as image lower: claimed as ns2/importer, on
    // the importer's snapshot.
    let s = staging();
    forge(&s.load("default", "c1", 2).unwrap(), |m| {
        m.image_lowers.push("/etc".into())
    });
    let err = s.claim("ns2", "importer", &image).unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::ImageLowers {
                seq: 2,
                found: 2,
                expected: 1
            }
        ),
        "{err}"
    );
    forge(&s.load("default", "c1", 2).unwrap(), |m| {
        m.image_lowers = vec!["/etc".into()]
    });
    assert_eq!(s.claim("ns2", "importer", &image).unwrap(), [1, 2]);
    for seq in [1, 2] {
        let m = s.load("ns2", "importer", seq).unwrap().manifest;
        assert_eq!(
            (m.namespace.as_str(), m.container.as_str(), &m.image_lowers),
            ("ns2", "importer", &image)
        );
    }
    let a = e.store.adoption(&s, "ns2", "importer").unwrap().unwrap();
    e.store.adopt(&a).unwrap();
    assert_eq!(e.store.list("ns2", "importer").unwrap(), [1, 2]);
    assert_eq!(e.store.list("default", "c1").unwrap(), [1, 2]);

    // A chain that stacks on a checkpoint the archive lacks would stack on this store's.
    let s = staging();
    fs::remove_dir_all(s.load("default", "c1", 1).unwrap().dir).unwrap();
    let err = s
        .claim("default", "c1", std::slice::from_ref(&e.lower))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::ChainOutside { seq: 2, member: 1 }),
        "{err}"
    );

    // A CRIU image that is a symlink to a host file.
    let s = staging();
    let criu = s.load("default", "c1", 1).unwrap().criu_dir();
    fs::remove_file(criu.join("pages-1.img")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", criu.join("pages-1.img")).unwrap();
    let err = s.claim("default", "importer", &image).unwrap_err();
    assert!(
        matches!(
            &err,
            StoreError::Unconfined {
                what: "CRIU image",
                ..
            }
        ),
        "{err}"
    );

    // An id past 2^32 beside the chain.
    let s = staging();
    let huge = s.container_dir("default", "c1").unwrap().join("4294967296");
    fs::create_dir_all(&huge).unwrap();
    let err = s.claim("default", "importer", &image).unwrap_err();
    assert!(
        matches!(&err, StoreError::BadCheckpointName { .. }),
        "{err}"
    );

    // Two chains.
    let s = staging();
    fs::create_dir_all(s.container_dir("default", "other").unwrap()).unwrap();
    let err = s.claim("default", "importer", &image).unwrap_err();
    assert!(
        matches!(&err, StoreError::NotOneChain { found: 2, .. }),
        "{err}"
    );
    assert_eq!(e.store.list("default", "c1").unwrap(), [1, 2]);
}

/// Everything under the store is root-only at rest, whatever the umask (0 here) and whatever
/// modes a deployment gave the root and the dirs under it (0755, a setuid binary a container
/// wrote into its upper, a journal of secrets): a user (nobody, 65534) can read, list or run
/// nothing under it.
#[test]
fn the_store_is_root_only_at_rest() {
    let e = env();
    let parent = e._tmp.path().join("deployed");
    let root = parent.join("belayer");
    sh(
        e._tmp.path(),
        &format!(
            "chmod 755 .; mkdir -p -m 755 {root}/uppers/default/c1/g1/upper/bin {root}/journal/default
             printf '#!/bin/sh\\necho pwned\\n' > {root}/uppers/default/c1/g1/upper/bin/su
             chmod 4755 {root}/uppers/default/c1/g1/upper/bin/su
             echo 'API_KEY=secret' > {root}/journal/default/c1.jsonl; chmod 644 {root}/journal/default/c1.jsonl
             chmod -R go+rx {parent}",
            root = root.display(),
            parent = parent.display()
        ),
    );
    // SAFETY: umask has no preconditions; it is restored below.
    let old = unsafe { libc::umask(0) };
    let store = Store::new(&root);
    store.secure().unwrap();
    sh(&e.merged, "echo 1 > a; mkdir d; echo 2 > d/b");
    let c1 = fake_checkpoint(&store, &e.upper, &e.lower, None);
    let c2 = c1
        .as_ref()
        .ok()
        .map(|c1| fake_checkpoint(&store, &e.upper, &e.lower, Some(c1)));
    let lease = c2
        .as_ref()
        .and_then(|c| c.as_ref().ok())
        .map(|c2| store.lease(c2, ("default", "user")));
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let _lease = lease.unwrap().unwrap();
    let mut paths = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(p) = stack.pop() {
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            stack.extend(fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        paths.push(p);
    }
    assert!(paths.len() > 20, "{paths:?}");
    let open = common::reachable_by_nobody(&paths);
    assert!(open.is_empty(), "a user reaches under the store: {open:#?}");
}

/// An image lower dir inside the store that is not a checkpoint's fs layer (another container's
/// upper, a checkpoint's CRIU images), named directly or through a symlink, is refused when the
/// checkpoint is verified; a symlink to an image layer (docker's overlay2 `l/…`) is not.
#[test]
fn image_lowers_in_the_store_are_only_checkpoint_layers() {
    let e = env();
    sh(&e.merged, "echo 1 > a");
    let cp = fake_checkpoint(&e.store, &e.upper, &e.lower, None).unwrap();
    let upper = e.store.root().join("uppers/default/other/g1/upper");
    fs::create_dir_all(&upper).unwrap();
    let link = e._tmp.path().join("link-to-upper");
    std::os::unix::fs::symlink(&upper, &link).unwrap();
    for bad in [upper, cp.criu_dir(), link] {
        forge(&cp, |m| m.image_lowers = vec![bad.clone()]);
        let cp = e.store.load("default", "c1", 1).unwrap();
        let err = verify_checkpoint(&e.store, &cp, VerifyLevel::Sizes).unwrap_err();
        assert!(
            matches!(&err, VerifyError::ForeignImageLower(l) if *l == bad),
            "{}: {err}",
            bad.display()
        );
    }
    let layer = e._tmp.path().join("l-ABCD");
    std::os::unix::fs::symlink(&e.lower, &layer).unwrap();
    forge(&cp, |m| m.image_lowers = vec![layer.clone()]);
    let cp = e.store.load("default", "c1", 1).unwrap();
    verify_checkpoint(&e.store, &cp, VerifyLevel::Sizes).unwrap();
}
