//! Filesystem layers on real overlayfs: capture every kind of change, mount the chain fresh and
//! compare the merged trees; a chain of 3, compaction equivalence, capture after a restore.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{MountGuard, mount_fresh, require_root, require_tool, sh};
use criu_bridge::layer::{LayerIndex, capture_layer, compact_layers};
use criu_bridge::tree::{TreeSnapshot, diff_trees, snapshot_tree};

fn assert_same(what: &str, expected: &TreeSnapshot, actual: &TreeSnapshot) {
    let d = diff_trees(expected, actual);
    assert!(
        d.is_empty(),
        "{what}: {} differences:\n{}",
        d.len(),
        d.join("\n")
    );
}

fn build_lower(lower: &Path) {
    std::fs::create_dir_all(lower).unwrap();
    sh(
        lower,
        r#"
        mkdir -p etc bin replace_me/sub deldir/a/b keep/inner chmod_dir
        echo hello > etc/hostname; echo cfg > etc/app.conf; echo data > keep/inner/file
        echo old > replace_me/sub/x; echo old2 > replace_me/y
        echo gone > delete_me; echo gone2 > deldir/a/b/c
        echo lowerx > xattr_file; setfattr -n user.origin -v lower xattr_file
        echo suid > suid_me; echo own > chown_me
        ln -s etc/hostname lower_link
        touch -d '2020-01-02 03:04:05' etc/hostname
        "#,
    );
}

/// Round 1: every kind of change through the merged view.
fn changes_round1(m: &Path) {
    sh(
        m,
        r#"
        echo new > newfile; mkdir -p newdir/deep; echo deep > newdir/deep/f
        echo changed >> etc/app.conf
        chmod 4755 suid_me; chown 1234:5678 chown_me
        setfattr -n user.added -v v1 xattr_file; setfattr -n trusted.belayer_test -v t newfile
        echo linked > hl_a; ln hl_a hl_b; ln hl_a newdir/hl_c
        ln -s ../etc/hostname newdir/rel_link; ln -s /nonexistent dangling
        mkfifo fifo1; chmod 0640 fifo1
        truncate -s 64M sparse; printf 'head' | dd of=sparse conv=notrunc status=none
        printf 'tail' | dd of=sparse bs=1 seek=40000000 conv=notrunc status=none
        rm delete_me; rm -rf deldir
        rm -rf replace_me; mkdir replace_me; echo fresh > replace_me/only
        mv keep/inner/file keep/inner/renamed
        echo mt > mtime_file; touch -d '2001-02-03 04:05:06.789' mtime_file
        touch -h -d '2002-02-02 02:02:02' dangling
        mkdir -p upper_only_dir/x; echo u > upper_only_dir/x/f
        chmod 0700 chmod_dir
        "#,
    );
}

/// Round 2: changes on top of round 1, incl. deleting upper-only nodes (no whiteout in the upper).
fn changes_round2(m: &Path) {
    sh(
        m,
        r#"
        rm newfile; rm -rf newdir/deep
        echo more >> hl_a; ln hl_a hl_d; rm hl_b
        rm -rf upper_only_dir; mkdir upper_only_dir; echo replaced > upper_only_dir/g
        setfattr -x user.added xattr_file
        echo back > delete_me
        chmod 0755 chmod_dir; chown 7:8 chmod_dir
        rm fifo1; mkfifo fifo1
        printf 'mid' | dd of=sparse bs=1 seek=20000000 conv=notrunc status=none
        rm lower_link; echo notalink > lower_link
        mkdir deldir; echo again > deldir/z
        "#,
    );
}

/// Round 3: more changes, incl. deleting a directory from the image again.
fn changes_round3(m: &Path) {
    sh(
        m,
        r#"
        rm -rf replace_me keep; echo f > keep
        rm deldir/z; rmdir deldir
        echo r3 > r3file; chmod 2750 r3file
        rm hl_d; echo x > newdir/after
        "#,
    );
}

struct Capture {
    layer: PathBuf,
    index: LayerIndex,
    tree: TreeSnapshot,
}

fn capture(
    base: &Path,
    name: &str,
    upper: &Path,
    merged: &Path,
    parent: Option<&LayerIndex>,
) -> Capture {
    let tree = snapshot_tree(merged).unwrap();
    let layer = base.join(name);
    let (index, stats) = capture_layer(upper, parent, &layer).unwrap();
    eprintln!("{name}: {stats:?}");
    Capture { layer, index, tree }
}

fn check_chain(
    base: &Path,
    name: &str,
    chain_newest_first: &[&PathBuf],
    lower: &Path,
    expected: &TreeSnapshot,
) {
    let mut lowers: Vec<PathBuf> = chain_newest_first.iter().map(|p| p.to_path_buf()).collect();
    lowers.push(lower.to_path_buf());
    let (_g, _upper, merged) = mount_fresh(base, name, &lowers);
    let got = snapshot_tree(&merged).unwrap();
    assert_same(name, expected, &got);
}

#[test]
fn capture_chain_of_three_and_compaction_match_the_merged_view() {
    require_root();
    require_tool("setfattr");
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let lower = base.join("lower");
    build_lower(&lower);
    let (guard, upper, merged) = mount_fresh(base, "live", std::slice::from_ref(&lower));

    changes_round1(&merged);
    let c1 = capture(base, "L1", &upper, &merged, None);
    changes_round2(&merged);
    let c2 = capture(base, "L2", &upper, &merged, Some(&c1.index));
    changes_round3(&merged);
    let c3 = capture(base, "L3", &upper, &merged, Some(&c2.index));
    drop(guard);

    // The second layer is incremental: it does not carry round-1 files that did not change.
    assert!(
        !c2.layer.join("etc/app.conf").exists(),
        "unchanged file copied again"
    );
    assert!(
        c2.layer.join("newfile").exists(),
        "deleted upper-only file needs a whiteout"
    );

    let sparse = std::fs::metadata(c1.layer.join("sparse")).unwrap();
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "sparse file lost its holes: {} blocks",
        sparse.blocks()
    );
    let hl = std::fs::metadata(c2.layer.join("hl_a")).unwrap();
    assert_eq!(
        hl.nlink(),
        3,
        "hardlinks must stay hardlinks inside the layer"
    );

    check_chain(base, "r1", &[&c1.layer], &lower, &c1.tree);
    check_chain(base, "r2", &[&c2.layer, &c1.layer], &lower, &c2.tree);
    check_chain(
        base,
        "r3",
        &[&c3.layer, &c2.layer, &c1.layer],
        &lower,
        &c3.tree,
    );

    let compacted = base.join("C123");
    compact_layers(
        &[c1.layer.clone(), c2.layer.clone(), c3.layer.clone()],
        std::slice::from_ref(&lower),
        &compacted,
    )
    .unwrap();
    check_chain(base, "rc", &[&compacted], &lower, &c3.tree);

    // Compacting a prefix and stacking the rest on top is equivalent too.
    let c12 = base.join("C12");
    compact_layers(
        &[c1.layer.clone(), c2.layer.clone()],
        std::slice::from_ref(&lower),
        &c12,
    )
    .unwrap();
    check_chain(base, "rc12", &[&c3.layer, &c12], &lower, &c3.tree);
}

#[test]
fn capture_after_restore_covers_the_fresh_upper() {
    require_root();
    require_tool("setfattr");
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let lower = base.join("lower");
    build_lower(&lower);
    let (guard, upper, merged) = mount_fresh(base, "live", std::slice::from_ref(&lower));
    changes_round1(&merged);
    let c1 = capture(base, "L1", &upper, &merged, None);
    drop(guard);

    // Restore onto a fresh upper, keep working, capture with the old index as parent.
    let (guard, upper2, merged2) =
        mount_fresh(base, "restored", &[c1.layer.clone(), lower.clone()]);
    changes_round2(&merged2);
    changes_round3(&merged2);
    let c2 = capture(base, "L2", &upper2, &merged2, Some(&c1.index));
    drop(guard);
    check_chain(base, "r2", &[&c2.layer, &c1.layer], &lower, &c2.tree);
}

#[test]
fn unchanged_upper_gives_an_empty_layer() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let lower = base.join("lower");
    std::fs::create_dir_all(lower.join("d")).unwrap();
    let (_g, upper, merged) = mount_fresh(base, "live", std::slice::from_ref(&lower));
    sh(&merged, "echo a > d/a; rm -rf d; mkdir d; echo b > d/b");
    let c1 = capture(base, "L1", &upper, &merged, None);
    let (_, stats) = capture_layer(&upper, Some(&c1.index), &base.join("L2")).unwrap();
    assert_eq!(stats.nodes_written, 1, "only the layer root: {stats:?}");
    let _keep: Option<MountGuard> = None;
}

#[test]
fn chains_past_the_page_limit_mount_through_the_new_mount_api() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let deep = tmp
        .path()
        .join("a-rather-long-directory-name-like-containerd-snapshot-paths");
    let mut lowers = Vec::new();
    for i in (0..120).rev() {
        let l = deep.join(format!("checkpoints/default/some-container-id/{i:04}/fs"));
        std::fs::create_dir_all(&l).unwrap();
        std::fs::write(l.join(format!("layer-{i}")), format!("{i}")).unwrap();
        std::fs::write(l.join("top"), format!("{i}")).unwrap();
        lowers.push(l);
    }
    let err =
        criu_bridge::layer::overlay_options(&lowers, Path::new("/u"), Path::new("/w")).unwrap_err();
    assert!(
        matches!(err, criu_bridge::layer::MountError::OptionsTooLong { .. }),
        "{err}"
    );
    let (_g, _upper, merged) = mount_fresh(tmp.path(), "long", &lowers);
    assert_eq!(
        std::fs::read_to_string(merged.join("top")).unwrap(),
        "119",
        "newest layer must win"
    );
    assert_eq!(std::fs::read_dir(&merged).unwrap().count(), 121);
}

/// A whiteout in a directory that is not merged at mount time shows up in readdir as a name that
/// cannot be looked up. Compaction keeps whiteouts only where they hide something: the image has
/// the path and no opaque directory above it in the result hides it already. (Capture writes such
/// a whiteout when `rm -rf d; mkdir d` reuses the inode of an upper-only `d`.)
#[test]
fn compaction_drops_whiteouts_that_hide_nothing() {
    require_root();
    require_tool("setfattr");
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let lower = base.join("lower");
    std::fs::create_dir_all(&lower).unwrap();
    sh(
        &lower,
        "mkdir -p img/sub; echo i > img/sub/x; echo i > img/y",
    );
    // L1: a new dir `new` with a file; `img` replaced by an opaque dir that has `y` again.
    let l1 = base.join("L1");
    std::fs::create_dir_all(&l1).unwrap();
    sh(
        &l1,
        "mkdir -p new img; echo a > new/x; echo b > img/y; setfattr -n trusted.overlay.opaque -v y img",
    );
    // L2: whiteouts for new/x (nothing below has it) and img/y (hidden by the opaque dir).
    let l2 = base.join("L2");
    std::fs::create_dir_all(&l2).unwrap();
    sh(
        &l2,
        "mkdir -p new img; mknod new/x c 0 0; mknod img/y c 0 0",
    );

    let (g, _u, merged) = mount_fresh(base, "chain", &[l2.clone(), l1.clone(), lower.clone()]);
    let expected = snapshot_tree(&merged).unwrap();
    drop(g);
    assert!(!expected.contains_key("new/x") && !expected.contains_key("img/y"));

    let c = base.join("C");
    compact_layers(&[l1, l2], std::slice::from_ref(&lower), &c).unwrap();
    assert!(
        std::fs::symlink_metadata(c.join("new/x")).is_err(),
        "whiteout kept in a directory the image does not have"
    );
    assert!(
        std::fs::symlink_metadata(c.join("img/y")).is_err(),
        "whiteout kept below an opaque directory"
    );
    check_chain(base, "compacted", &[&c], &lower, &expected);
}
