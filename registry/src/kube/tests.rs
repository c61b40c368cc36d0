use std::process::Command;

use super::*;

const CONFIG: &str = r#"{"id":"c0ffee","name":"sandbox","rootfsImage":"reg:5000/busybox:latest",
  "rootfsImageRef":"reg:5000/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111",
  "rootfsImageName":"reg:5000/busybox:latest","runtime":"io.containerd.belayer.v1",
  "createdTime":"2026-12-07T01:00:00Z","checkpointedTime":"2026-12-07T02:00:00.5Z"}"#;
const SPEC: &str = r#"{"ociVersion":"1.2.0","annotations":{
  "io.kubernetes.cri.container-name":"sandbox","io.kubernetes.cri.sandbox-name":"agent-pod",
  "io.kubernetes.cri.sandbox-namespace":"default","io.kubernetes.cri.container-type":"container"}}"#;

/// The tree of a CRI checkpoint archive as containerd writes it, under `root`.
fn plant(root: &Path) {
    std::fs::create_dir_all(root.join("checkpoint")).unwrap();
    std::fs::write(root.join("checkpoint/inventory.img"), b"inv").unwrap();
    std::fs::write(root.join("checkpoint/pages-1.img"), vec![7u8; 5000]).unwrap();
    std::fs::write(root.join("config.dump"), CONFIG).unwrap();
    std::fs::write(root.join("spec.dump"), SPEC).unwrap();
    std::fs::write(root.join("status.dump"), "{}").unwrap();
    std::fs::write(root.join("rootfs-diff.tar"), vec![0u8; 1024]).unwrap();
}

/// GNU tar of `root`'s `members` into `archive`, with tar's extra `args`.
fn gnu_tar(root: &Path, archive: &Path, args: &[&str], members: &[&str]) {
    let ok = Command::new("tar")
        .args(["--create", "--format=posix", "--file"])
        .arg(archive)
        .args(args)
        .arg("--directory")
        .arg(root)
        .args(members)
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A member to write: (path, Some(data)) a file, (path, None) a dir.
type Member<'a> = (&'a str, Option<&'a [u8]>);

/// An archive written member by member.
fn written(archive: &Path, members: &[Member]) {
    let mut out = File::create(archive).unwrap();
    for (path, data) in members {
        match data {
            Some(d) => tar::write_file(&mut out, path, d.len() as u64, &mut &d[..]).unwrap(),
            None => tar::write_dir(&mut out, path).unwrap(),
        }
    }
    tar::write_end(&mut out).unwrap();
}

fn good_members<'a>() -> Vec<Member<'a>> {
    vec![
        ("checkpoint", None),
        ("checkpoint/inventory.img", Some(b"inv")),
        ("config.dump", Some(CONFIG.as_bytes())),
        ("spec.dump", Some(SPEC.as_bytes())),
        ("status.dump", Some(b"{}")),
    ]
}

fn image_of(archive: &Path, limits: &CriArchiveLimits) -> Result<CheckpointImage, Error> {
    let work = archive.with_extension("work");
    std::fs::create_dir_all(&work).unwrap();
    let _ = std::fs::remove_file(work.join("layer.tar"));
    checkpoint_image(archive, &work, limits)
}

fn refusal(members: &[Member]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("a.tar");
    written(&archive, members);
    image_of(&archive, &CriArchiveLimits::default())
        .expect_err("made an image of a bad archive")
        .to_string()
}

#[test]
fn a_cri_archive_becomes_an_image_with_checkpointctl_annotations() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("cp");
    plant(&root);
    let archive = tmp.path().join("cri.tar");
    let members = [
        "./checkpoint",
        "./config.dump",
        "./spec.dump",
        "./status.dump",
        "./rootfs-diff.tar",
    ];
    gnu_tar(&root, &archive, &[], &members);
    let image = image_of(&archive, &CriArchiveLimits::default()).unwrap();

    let a = &image.annotations;
    let expect = [
        (ANNOTATION_ENGINE, "containerd"),
        (ANNOTATION_CONTAINER_NAME, "sandbox"),
        (ANNOTATION_POD, "agent-pod"),
        (ANNOTATION_NAMESPACE, "default"),
        (
            ANNOTATION_ROOTFS_IMAGE_USER_REQUESTED,
            "reg:5000/busybox:latest",
        ),
        (ANNOTATION_ROOTFS_IMAGE_NAME, "reg:5000/busybox:latest"),
        (
            ANNOTATION_ROOTFS_IMAGE_ID,
            "reg:5000/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111",
        ),
        (ANNOTATION_RUNTIME_NAME, "io.containerd.belayer.v1"),
    ];
    assert_eq!(a.len(), expect.len(), "{a:?}");
    for (k, v) in expect {
        assert_eq!(a.get(k).map(String::as_str), Some(v), "{k}");
    }

    // The layer is a tar of the archive's members, canonical, its digest the config's diff id.
    let (digest, size) = Digest::of_file(&image.layer).unwrap();
    assert_eq!((&digest, size), (&image.layer_digest, image.layer_size));
    let config: serde_json::Value = serde_json::from_slice(&image.config_bytes).unwrap();
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], oci_architecture());
    assert_eq!(config["rootfs"]["type"], "layers");
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([digest.as_str()])
    );
    assert_eq!(config["created"], "2026-12-07T02:00:00.5Z");
    let unpacked = tmp.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let ok = Command::new("tar")
        .arg("--extract")
        .arg("--file")
        .arg(&image.layer)
        .arg("--directory")
        .arg(&unpacked)
        .status()
        .unwrap();
    assert!(ok.success());
    for f in [
        "checkpoint/inventory.img",
        "checkpoint/pages-1.img",
        "config.dump",
        "spec.dump",
        "status.dump",
        "rootfs-diff.tar",
    ] {
        assert_eq!(
            std::fs::read(unpacked.join(f)).unwrap(),
            std::fs::read(root.join(f)).unwrap(),
            "{f}"
        );
    }

    let m = image.manifest();
    assert_eq!(m.artifact_type, None);
    assert_eq!(
        m.config.media_type,
        "application/vnd.oci.image.config.v1+json"
    );
    assert_eq!(m.layers.len(), 1);
    assert_eq!(
        m.layers[0].media_type,
        "application/vnd.oci.image.layer.v1.tar"
    );
    assert_eq!(m.layers[0].digest, digest);
    assert_eq!(&m.annotations, a);

    // The same contents archived again, with other times and owners, give the same layer.
    let again = tmp.path().join("again.tar");
    gnu_tar(
        &root,
        &again,
        &["--mtime=2000-01-01", "--owner=1000", "--mode=a+r"],
        &members.map(|m| m.trim_start_matches("./")),
    );
    assert_eq!(
        image_of(&again, &CriArchiveLimits::default())
            .unwrap()
            .layer_digest,
        digest
    );
}

#[test]
fn a_cri_o_archive_names_its_container_as_cri_o_does() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = r#"{"annotations":{"io.container.manager":"cri-o",
      "io.kubernetes.cri-o.Metadata":"{\"name\":\"worker\"}",
      "io.kubernetes.pod.name":"p","io.kubernetes.pod.namespace":"ns"}}"#;
    let mut members = good_members();
    members[3] = ("spec.dump", Some(spec.as_bytes()));
    let archive = tmp.path().join("a.tar");
    written(&archive, &members);
    let image = image_of(&archive, &CriArchiveLimits::default()).unwrap();
    assert_eq!(image.annotations[ANNOTATION_ENGINE], "CRI-O");
    assert_eq!(image.annotations[ANNOTATION_CONTAINER_NAME], "worker");
    assert_eq!(image.annotations[ANNOTATION_POD], "p");
    assert_eq!(image.annotations[ANNOTATION_NAMESPACE], "ns");
}

#[test]
fn hostile_or_broken_archives_are_refused_naming_the_problem() {
    // ('static: `with`'s edits take members of any lifetime.)
    let nul: &'static str = format!("checkpoint/{}\0evil", "i".repeat(100)).leak();
    let with = |edit: &dyn Fn(&mut Vec<Member>)| {
        let mut m = good_members();
        edit(&mut m);
        refusal(&m)
    };
    let e = with(&|m| m.push(("../etc/cron.d/x", Some(b"x"))));
    assert!(
        e.contains(r#"member "../etc/cron.d/x" is not a plain relative path"#),
        "{e}"
    );
    let e = with(&|m| m.push(("/etc/passwd", Some(b"x"))));
    assert!(
        e.contains(r#""/etc/passwd" is not a plain relative path"#),
        "{e}"
    );
    // A pax name with a NUL in it: readers that stop at the NUL would see "checkpoint/…".
    let e = with(&|m| m.push((nul, Some(b"x"))));
    assert!(e.contains("evil\" is not a plain relative path"), "{e}");
    let e = with(&|m| m.push(("checkpoint/inventory.img", Some(b"other"))));
    assert!(
        e.contains(r#"member "checkpoint/inventory.img" comes twice"#),
        "{e}"
    );
    let e = with(&|m| m.push(("config.dump/x", Some(b"x"))));
    assert!(e.contains(r#"lies below the file "config.dump""#), "{e}");
    let e = with(&|m| m.retain(|(p, _)| *p != "status.dump"));
    assert!(e.contains("no status.dump"), "{e}");
    let e = with(&|m| m.retain(|(p, _)| !p.starts_with("checkpoint")));
    assert!(e.contains("no checkpoint/"), "{e}");
    let e = with(&|m| m[2] = ("config.dump", Some(b"{\"rootfsImageName\":\"x\"}")));
    assert!(e.contains("its config.dump names no rootfsImageRef"), "{e}");
    let e = with(&|m| m[3] = ("spec.dump", Some(b"{\"annotations\":{}}")));
    assert!(
        e.contains("its spec.dump names no annotation io.kubernetes.cri.container-name"),
        "{e}"
    );
    let e = with(&|m| m[3] = ("spec.dump", Some(b"not json")));
    assert!(e.contains("its spec.dump does not parse"), "{e}");
    let e = with(&|m| {
        m[3] = (
            "spec.dump",
            Some(br#"{"annotations":{"io.container.manager":"libpod"}}"#),
        )
    });
    assert!(e.contains("made by libpod"), "{e}");

    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("a.tar");
    written(&archive, &good_members());
    let limited = |limits: CriArchiveLimits| image_of(&archive, &limits).unwrap_err().to_string();
    let e = limited(CriArchiveLimits {
        max_members: 3,
        ..Default::default()
    });
    assert!(e.contains("more than 3 members"), "{e}");
    let e = limited(CriArchiveLimits {
        max_dump_bytes: 16,
        ..Default::default()
    });
    assert!(e.contains("config.dump is over 16 bytes"), "{e}");
    let e = limited(CriArchiveLimits {
        max_bytes: 100,
        ..Default::default()
    });
    assert!(e.contains("hold more than 100 bytes"), "{e}");

    // Cut short: the walker's error.
    let bytes = std::fs::read(&archive).unwrap();
    std::fs::write(&archive, &bytes[..1536]).unwrap();
    let e = image_of(&archive, &CriArchiveLimits::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("ends inside a member"), "{e}");

    // gzip.
    let gz = tmp.path().join("a.tar.gz");
    written(&archive, &good_members());
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -c {} > {}", archive.display(), gz.display()))
        .status()
        .unwrap();
    assert!(ok.success());
    let e = image_of(&gz, &CriArchiveLimits::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("gzip-compressed"), "{e}");

    // A symlink and a hard link, as GNU tar writes them.
    for (name, make) in [
        ("symlink", "ln -s /etc/shadow checkpoint/evil"),
        ("hardlink", "ln checkpoint/inventory.img checkpoint/evil"),
    ] {
        let root = tmp.path().join(name);
        plant(&root);
        let ok = Command::new("sh")
            .arg("-c")
            .arg(make)
            .current_dir(&root)
            .status()
            .unwrap();
        assert!(ok.success());
        let a = tmp.path().join(format!("{name}.tar"));
        gnu_tar(&root, &a, &[], &["."]);
        let e = image_of(&a, &CriArchiveLimits::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("is of tar type") && e.contains("only regular files and dirs"),
            "{name}: {e}"
        );
    }
}
