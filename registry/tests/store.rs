//! Checkpoints of a real Belayer store (criu-bridge's: written through `Store::begin` and
//! `commit`, every file's sha256 in its manifest) pushed from "node A", pulled on "node B" and
//! imported there as the shim's import does (unpack beside the store, `claim`, `adoption`, the
//! newest images placed, `adopt`); every imported checkpoint then verifies in full against the
//! manifest node A wrote. The second push of the chain uploads only its own blobs.

use std::path::{Path, PathBuf};
use std::process::Command;

use belayer_registry::checkpoint::{self, CHAIN_ARCHIVE, PullLimits};
use belayer_registry::{Client, ClientOptions, Reference};
use criu_bridge::Store;
use criu_bridge::store::{FORMAT_VERSION, Manifest, VerifyLevel, verify_checkpoint, verify_dir};

mod common;
use common::{Registry, export};

/// Writes the next checkpoint of `default/sandbox` in `store`, on `parent`'s chain: `fill`
/// writes its CRIU images and fs layer. Returns its seq.
fn take(
    store: &Store,
    parent: Option<&Manifest>,
    lowers: &[PathBuf],
    fill: impl FnOnce(&Path, &Path),
) -> Manifest {
    let lock = store.lock("default", "sandbox").unwrap();
    let pending = store.begin(&lock).unwrap();
    let seq = pending.seq();
    std::fs::create_dir_all(pending.fs_dir()).unwrap();
    fill(&pending.criu_dir(), &pending.fs_dir());
    let mut fs_chain = vec![seq];
    fs_chain.extend(parent.map(|p| p.fs_chain.clone()).unwrap_or_default());
    let m = Manifest {
        format_version: FORMAT_VERSION,
        namespace: "default".into(),
        container: "sandbox".into(),
        seq,
        parent: parent.map(|p| p.seq),
        created_unix_ms: 1_700_000_000_000 + seq,
        spec_digest: format!("sha256:{}", "0".repeat(64)),
        image_lowers: lowers.to_vec(),
        rootfs_shared: false,
        fs_chain,
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
    };
    pending.commit(m).unwrap().manifest
}

fn sh(cmd: &str) {
    let ok = Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(ok.success(), "{cmd}");
}

/// CRIU images: pages of `n` bytes, an inventory.
fn images(criu: &Path, seq: u64, n: usize) {
    let pages: Vec<u8> = (0..n)
        .map(|i| ((i as u64).wrapping_mul(0x9e37_79b9).wrapping_add(seq) >> 7) as u8)
        .collect();
    std::fs::write(criu.join("pages-1.img"), pages).unwrap();
    std::fs::write(criu.join("inventory.img"), format!("inventory {seq}")).unwrap();
    std::fs::write(criu.join("stats-dump"), b"stats").unwrap();
}

#[test]
fn a_store_s_chain_is_pushed_pulled_imported_and_verifies_on_another_node() {
    let registry = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let tmp = tmp.path();
    let image_a = tmp.join("node-a-image");
    std::fs::create_dir_all(&image_a).unwrap();
    let a = Store::new(tmp.join("node-a"));

    // Checkpoint 1: a layer with what overlay layers hold: a dir, a file, a symlink, a hard
    // link, a sparse file, a whiteout (char device 0/0), an opaque dir's xattr.
    let cp1 = take(&a, None, std::slice::from_ref(&image_a), |criu, fs| {
        images(criu, 1, 200_000);
        let fs = fs.display();
        sh(&format!(
            "mkdir -p {fs}/etc {fs}/opaque && echo one > {fs}/etc/conf && \
             ln -s conf {fs}/etc/link && ln {fs}/etc/conf {fs}/etc/hard && \
             truncate -s 4M {fs}/sparse && printf tail >> {fs}/sparse && \
             mknod {fs}/etc/removed c 0 0 && \
             setfattr -n trusted.overlay.opaque -v y {fs}/opaque"
        ));
    });
    let e1 = tmp.join("export-1");
    export(a.root(), "default/sandbox", 1, &cp1.fs_chain, &e1);
    // Checkpoint 2 on 1: a changed file, a new one; the store is read in between.
    sh(&format!(
        "find {} -exec touch -a -h {{}} +",
        a.root().display()
    ));
    let cp2 = take(
        &a,
        Some(&cp1),
        std::slice::from_ref(&image_a),
        |criu, fs| {
            images(criu, 2, 150_000);
            let fs = fs.display();
            sh(&format!(
                "mkdir -p {fs}/etc && echo two > {fs}/etc/conf && echo new > {fs}/new"
            ));
        },
    );
    assert_eq!(cp2.fs_chain, [2, 1]);
    let e2 = tmp.join("export-2");
    export(a.root(), "default/sandbox", 2, &cp2.fs_chain, &e2);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = Client::new(
        &registry.addr,
        ClientOptions {
            credentials: Some(common::credentials()),
            chunk_size: 100 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let at =
        |tag: &str| Reference::parse(&format!("{}/nodes/sandbox:{tag}", registry.addr)).unwrap();
    let pushed1 = rt
        .block_on(checkpoint::push_export(
            &client,
            &at("cp-1"),
            &e1,
            &tmp.join("work-1"),
        ))
        .unwrap();
    assert_eq!(pushed1.uploaded.len(), 3, "{pushed1:?}");
    let pushed2 = rt
        .block_on(checkpoint::push_export(
            &client,
            &at("cp-2"),
            &e2,
            &tmp.join("work-2"),
        ))
        .unwrap();
    // Checkpoint 1's layer and images are in the registry already.
    assert_eq!(pushed2.skipped.len(), 2, "{pushed2:?}");
    assert_eq!(pushed2.uploaded.len(), 3, "{pushed2:?}");
    assert!(!tmp.join("work-2").exists());
    assert_eq!(registry.finished_uploads(), 6);

    // Node B pulls by digest and imports as the shim does.
    let pulled = tmp.join("pulled");
    rt.block_on(checkpoint::pull_to_archive(
        &client,
        &pushed2.reference,
        &pulled,
        &PullLimits::default(),
    ))
    .unwrap();
    let b = Store::new(tmp.join("node-b"));
    std::fs::create_dir_all(b.root()).unwrap();
    b.secure().unwrap();
    let image_b = vec![tmp.join("node-b-image")];
    std::fs::create_dir_all(&image_b[0]).unwrap();
    let staging = b.root().join(".tmp-import-test");
    common::unpack(&pulled.join(CHAIN_ARCHIVE), &staging);
    let exported = Store::new(&staging);
    exported.claim("default", "importer", &image_b).unwrap();
    let adoption = b
        .adoption(&exported, "default", "importer")
        .unwrap()
        .unwrap();
    assert_eq!(adoption.newest, 2);
    let newest = adoption
        .missing
        .iter()
        .find(|cp| cp.manifest.seq == 2)
        .unwrap();
    std::fs::create_dir_all(newest.criu_dir()).unwrap();
    for e in std::fs::read_dir(&pulled).unwrap() {
        let e = e.unwrap();
        if e.file_name() != CHAIN_ARCHIVE {
            std::fs::copy(e.path(), newest.criu_dir().join(e.file_name())).unwrap();
        }
    }
    b.adopt(&adoption).unwrap();
    for seq in [1, 2] {
        let cp = b.load("default", "importer", seq).unwrap();
        verify_dir(&cp, VerifyLevel::Full)
            .unwrap_or_else(|e| panic!("checkpoint {seq} after the pull: {e}"));
        let theirs = a.load("default", "sandbox", seq).unwrap().manifest;
        assert_eq!(cp.manifest.files, theirs.files, "checkpoint {seq}");
    }
    let cp2 = b.load("default", "importer", 2).unwrap();
    verify_checkpoint(&b, &cp2, VerifyLevel::Full).unwrap();
    assert_eq!(cp2.manifest.image_lowers, image_b);
    let cp1 = b.load("default", "importer", 1).unwrap();
    let sparse = cp1.fs_dir().join("sparse").metadata().unwrap();
    assert_eq!(sparse.len(), (4 << 20) + 4);
    // Still sparse: the holes were not written out.
    use std::os::unix::fs::MetadataExt;
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "{} blocks",
        sparse.blocks()
    );
}
