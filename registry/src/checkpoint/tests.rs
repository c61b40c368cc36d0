use std::process::Command;

use super::*;

/// Writes a store tree's checkpoint `seq` of `ns/c` under `root`.
fn plant(root: &Path, seq: u64) {
    let dir = root.join(format!("checkpoints/ns/c/{seq}"));
    std::fs::create_dir_all(dir.join("fs")).unwrap();
    std::fs::create_dir_all(dir.join("criu")).unwrap();
    std::fs::write(dir.join("fs/file"), format!("{seq}")).unwrap();
    std::fs::write(dir.join("criu/inventory.img"), format!("inv {seq}")).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        format!(r#"{{"seq": {seq}, "criu_dir": "criu"}}"#),
    )
    .unwrap();
}

/// An export of `seq` with `members` (in the archive's order) from the tree `root`, with the
/// archive's own extra `args`.
fn export(root: &Path, seq: u64, members: &[&str], dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    let criu = root.join(format!("checkpoints/ns/c/{seq}/criu"));
    if criu.exists() {
        for e in std::fs::read_dir(&criu).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dest.join(e.file_name())).unwrap();
        }
    }
    let ok = Command::new("tar")
        .args(["--create", "--format=posix", "--numeric-owner", "--file"])
        .arg(dest.join(CHAIN_ARCHIVE))
        .arg("--directory")
        .arg(root)
        .arg("--anchored")
        .arg(format!("--exclude=checkpoints/ns/c/{seq}/criu"))
        .args(members)
        .status()
        .unwrap();
    assert!(ok.success());
}

fn refusal(export: &Path) -> String {
    let work = tempfile::tempdir().unwrap();
    archive_parts(export, work.path())
        .expect_err("split")
        .to_string()
}

#[test]
fn an_export_splits_into_a_layer_and_images_per_member() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    plant(&root, 1);
    plant(&root, 2);
    let e = tmp.path().join("e");
    export(&root, 2, &["checkpoints/ns/c/2", "checkpoints/ns/c/1"], &e);
    let parts = archive_parts(&e, &tmp.path().join("work")).unwrap();
    assert_eq!(parts.config.members, [2, 1]);
    assert_eq!(parts.config.newest, 2);
    assert_eq!(parts.config.manifest["seq"], 2);
    let layout: Vec<_> = parts.parts.iter().map(|p| (p.seq, p.part)).collect();
    assert_eq!(
        layout,
        [
            (2, Part::Layer),
            (2, Part::Criu),
            (1, Part::Layer),
            (1, Part::Criu)
        ]
    );
    let m = parts.manifest();
    assert_eq!(check_layout(&m, &parts.config).unwrap(), layout);
    assert_eq!(m.artifact_type.as_deref(), Some(ARTIFACT_TYPE));
    assert_eq!(m.config.media_type, CONFIG_TYPE);
    // Each blob is a tar of its own checkpoint's members only.
    for p in &parts.parts {
        let listed = Command::new("tar")
            .arg("-tf")
            .arg(&p.path)
            .output()
            .unwrap();
        assert!(listed.status.success());
        let listed = String::from_utf8(listed.stdout).unwrap();
        let prefix = format!("checkpoints/ns/c/{}/", p.seq);
        assert!(listed.lines().all(|l| l.starts_with(&prefix)), "{listed}");
        assert_eq!(
            listed.contains("/criu/"),
            p.part == Part::Criu,
            "{:?}: {listed}",
            p.part
        );
    }
}

#[test]
fn exports_not_as_the_shim_writes_them_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("store");
    plant(&root, 1);
    plant(&root, 2);
    std::fs::create_dir_all(root.join("checkpoints/ns/other/3")).unwrap();
    std::fs::create_dir_all(root.join("elsewhere")).unwrap();
    let cases: [(&[&str], u64, &str); 4] = [
        (&["elsewhere"], 1, "is not under checkpoints/"),
        (
            &["checkpoints/ns/c/1", "checkpoints/ns/other/3"],
            1,
            "and of ns/other",
        ),
        // The newest's images inside the archive: it excluded another checkpoint's.
        (
            &["checkpoints/ns/c/2", "checkpoints/ns/c/1"],
            1,
            "the newest",
        ),
        (&["checkpoints/ns/c/1/fs"], 1, "no manifest.json"),
    ];
    for (i, (members, seq, why)) in cases.into_iter().enumerate() {
        let e = tmp.path().join(format!("e{i}"));
        export(&root, seq, members, &e);
        let got = refusal(&e);
        assert!(got.contains(why), "{members:?}: {got}");
    }
    // Something but files beside the archive.
    let e = tmp.path().join("dir-beside");
    export(&root, 1, &["checkpoints/ns/c/1"], &e);
    std::fs::create_dir(e.join("sub")).unwrap();
    assert!(refusal(&e).contains("regular file"));
}

fn descriptor(seq: u64, part: Part) -> Descriptor {
    PartFile {
        seq,
        part,
        path: PathBuf::new(),
        digest: Digest::of(b""),
        size: 0,
    }
    .descriptor()
}

#[test]
fn a_manifest_lists_per_member_its_layer_then_its_images() {
    let config = CheckpointConfig {
        format: CONFIG_FORMAT,
        namespace: "ns".into(),
        container: "c".into(),
        newest: 2,
        members: vec![2, 1],
        manifest: serde_json::Value::Null,
        journal_position: Some(4),
    };
    // The position round-trips; a config without one (an older pusher's) still reads.
    let bytes = serde_json::to_vec(&config).unwrap();
    assert_eq!(
        serde_json::from_slice::<CheckpointConfig>(&bytes).unwrap(),
        config
    );
    let older: CheckpointConfig = serde_json::from_str(
        r#"{"format":1,"namespace":"ns","container":"c","newest":2,"members":[2,1],"manifest":null}"#,
    )
    .unwrap();
    assert_eq!(older.journal_position, None);
    let manifest =
        |layers: Vec<Descriptor>| Manifest::new(ARTIFACT_TYPE, descriptor(0, Part::Layer), layers);
    let ok = manifest(vec![
        descriptor(2, Part::Layer),
        descriptor(2, Part::Criu),
        descriptor(1, Part::Layer),
    ]);
    assert_eq!(
        check_layout(&ok, &config).unwrap(),
        [(2, Part::Layer), (2, Part::Criu), (1, Part::Layer)]
    );
    for (layers, why) in [
        (
            vec![descriptor(2, Part::Layer), descriptor(1, Part::Layer)],
            "the newest, has no CRIU images",
        ),
        (
            vec![
                descriptor(1, Part::Layer),
                descriptor(2, Part::Layer),
                descriptor(2, Part::Criu),
            ],
            "layer is not where it belongs",
        ),
        (
            vec![
                descriptor(2, Part::Layer),
                descriptor(2, Part::Criu),
                descriptor(1, Part::Layer),
                descriptor(3, Part::Layer),
            ],
            "layers of no member",
        ),
    ] {
        let e = check_layout(&manifest(layers), &config)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{e}");
    }
    let mut d = descriptor(2, Part::Criu);
    d.media_type = LAYER_TYPE.into();
    let e = check_layout(
        &manifest(vec![
            descriptor(2, Part::Layer),
            d,
            descriptor(1, Part::Layer),
        ]),
        &config,
    )
    .unwrap_err();
    assert!(matches!(e, LayoutError::NoNewestImages { seq: 2 }), "{e}");
    for bad in [
        CheckpointConfig {
            container: "..".into(),
            ..config.clone()
        },
        CheckpointConfig {
            members: vec![2, 2],
            ..config.clone()
        },
        CheckpointConfig {
            newest: 1,
            ..config.clone()
        },
        CheckpointConfig {
            format: 9,
            ..config.clone()
        },
    ] {
        assert!(check_layout(&ok, &bad).is_err(), "{bad:?}");
    }
}

/// A blob of `members` (path, data), then `trailer` after its end-of-archive blocks.
fn blob(members: &[(&str, &[u8])], trailer: &[u8]) -> tempfile::NamedTempFile {
    let mut out = Vec::new();
    for (path, data) in members {
        if let Some(dir) = path.strip_suffix('/') {
            tar::write_dir(&mut out, dir).unwrap();
        } else {
            tar::write_file(&mut out, path, data.len() as u64, &mut &data[..]).unwrap();
        }
    }
    tar::write_end(&mut out).unwrap();
    out.extend_from_slice(trailer);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), out).unwrap();
    f
}

fn end_of(f: &tempfile::NamedTempFile, prefix: &str) -> Result<u64, ArchiveError> {
    let mut file = File::open(f.path()).unwrap();
    let len = file.metadata().unwrap().len();
    fragment_end(&mut file, 0, len, prefix)
}

#[test]
fn a_pulled_blob_s_members_stay_in_its_checkpoint_and_nothing_follows_its_end() {
    let p = "checkpoints/ns/c/1";
    let ok = blob(
        &[("checkpoints/ns/c/1/", b""), ("checkpoints/ns/c/1/f", b"x")],
        &[0; 512],
    );
    assert_eq!(end_of(&ok, p).unwrap(), 3 * 512);
    for (f, why) in [
        (blob(&[("checkpoints/ns/c/2/f", b"x")], b""), "lies outside"),
        (
            blob(&[("checkpoints/ns/c/10/f", b"x")], b""),
            "lies outside",
        ),
        (
            blob(&[("checkpoints/ns/c/1/../2/f", b"x")], b""),
            "lies outside",
        ),
        (
            blob(&[("checkpoints/ns/c/1/f", b"x")], b"more"),
            "after its end",
        ),
    ] {
        let e = end_of(&f, p).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
    // Cut before its end-of-archive blocks.
    let bytes = std::fs::read(ok.path()).unwrap();
    std::fs::write(ok.path(), &bytes[..1536]).unwrap();
    let e = end_of(&ok, p).unwrap_err();
    assert!(
        matches!(e, ArchiveError::Tar(tar::ReadError::Truncated)),
        "{e}"
    );
}

#[test]
fn the_newest_images_are_written_flat_only_as_plain_files_of_one_dir() {
    let p = "checkpoints/ns/c/1";
    let flat = |f: &tempfile::NamedTempFile| {
        let dest = tempfile::tempdir().unwrap();
        let mut file = File::open(f.path()).unwrap();
        write_flat_images(&mut file, p, dest.path()).map(|()| dest)
    };
    let ok = blob(
        &[
            ("checkpoints/ns/c/1/criu/", b""),
            ("checkpoints/ns/c/1/criu/inventory.img", b"inv"),
            ("checkpoints/ns/c/1/criu/pages-1.img", b"pages"),
        ],
        b"",
    );
    let dest = flat(&ok).unwrap();
    assert_eq!(
        std::fs::read(dest.path().join("pages-1.img")).unwrap(),
        b"pages"
    );
    assert_eq!(std::fs::read_dir(dest.path()).unwrap().count(), 2);
    for (members, why) in [
        (
            vec![("checkpoints/ns/c/1/criu/x", &b"x"[..])],
            "is not a dir",
        ),
        (
            vec![
                ("checkpoints/ns/c/1/criu/", b""),
                ("checkpoints/ns/c/1/criu/sub/x", b"x"),
            ],
            "is not an image",
        ),
        (
            vec![
                ("checkpoints/ns/c/1/criu/", b""),
                ("checkpoints/ns/c/1/criu/belayer-chain.tar", b"x"),
            ],
            "is not an image",
        ),
        (
            vec![
                ("checkpoints/ns/c/1/criu/", b""),
                ("checkpoints/ns/c/1/criu/sub/", b""),
            ],
            "not a plain file",
        ),
        (
            vec![
                ("checkpoints/ns/c/1/criu/", b""),
                ("checkpoints/ns/c/1/criu/a", b"x"),
                ("checkpoints/ns/c/1/criu/a", b"y"),
            ],
            "twice",
        ),
    ] {
        let e = flat(&blob(&members, b""))
            .map(drop)
            .unwrap_err()
            .to_string();
        assert!(e.contains(why), "{members:?}: {e}");
    }
}
