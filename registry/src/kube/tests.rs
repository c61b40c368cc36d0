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

/// CRI's status of the `sandbox` container as the CLI reads it (CRI `ContainerStatus`, the CRI
/// proto's field names), nulls where the proto has no value.
fn cri_status() -> serde_json::Value {
    serde_json::json!({
        "id": "c0ffee",
        "metadata": {"name": "sandbox", "attempt": 0},
        "state": 1,
        "created_at": 1_796_605_200_000_000_000_i64,
        "image": {"image": "reg:5000/busybox:latest", "annotations": {}, "user_specified_image": "", "runtime_handler": ""},
        "image_ref": "reg:5000/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111",
        "labels": {"io.kubernetes.pod.name": "agent-pod"},
        "annotations": {},
        "resources": null,
        "user": {"linux": null},
        "log_path": "",
    })
}

fn records() -> ContainerRecords {
    ContainerRecords {
        id: "c0ffee".into(),
        runtime: "io.containerd.belayer.v1".into(),
        created_unix_ns: 1_796_605_200_000_000_000,
        spec: SPEC.into(),
        cri_metadata: Some(
            r#"{"Version":"v1","Metadata":{"ID":"c0ffee","Name":"sandbox_agent-pod_default_uid_0","SandboxID":"p"}}"#
                .into(),
        ),
        status: cri_status(),
    }
}

#[test]
fn rfc3339_writes_times_as_go_does() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(1_796_608_800_500_000_000), "2026-12-07T02:00:00.5Z");
    assert_eq!(
        rfc3339(1_709_251_199_000_000_001),
        "2024-02-29T23:59:59.000000001Z"
    );
    assert_eq!(rfc3339(-1_000_000_000), "1969-12-31T23:59:59Z");
    assert_eq!(rfc3339(-62_135_596_800_000_000_000), "0001-01-01T00:00:00Z");
}

#[test]
fn containerd_records_make_the_dumps_cri_writes() {
    let dumps = records().dumps(1_796_608_800_500);
    let config: serde_json::Value = serde_json::from_str(&dumps.config).unwrap();
    assert_eq!(
        config,
        serde_json::json!({
            "id": "c0ffee",
            "name": "sandbox_agent-pod_default_uid_0",
            "rootfsImage": "reg:5000/busybox:latest",
            "rootfsImageRef": "reg:5000/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111",
            "rootfsImageName": "reg:5000/busybox:latest",
            "runtime": "io.containerd.belayer.v1",
            "createdTime": "2026-12-07T01:00:00Z",
            "checkpointedTime": "2026-12-07T02:00:00.5Z",
            "restoredTime": "0001-01-01T00:00:00Z",
            "restored": false,
        })
    );
    assert_eq!(dumps.spec, SPEC, "spec.dump is containerd's spec as it is");
    let status: serde_json::Value = serde_json::from_str(&dumps.status).unwrap();
    let mut want = cri_status();
    want.as_object_mut().unwrap().remove("resources");
    want["user"] = serde_json::json!({});
    assert_eq!(status, want, "status.dump is CRI's status without nulls");

    // Without the CRI plugin's metadata (or with one of another version): the status's name.
    let mut r = records();
    r.cri_metadata = Some(r#"{"Version":"v2","Metadata":{"Name":"x"}}"#.into());
    let config: serde_json::Value = serde_json::from_str(&r.dumps(0).config).unwrap();
    assert_eq!(config["name"], "sandbox");
    assert_eq!(config["checkpointedTime"], "1970-01-01T00:00:00Z");

    // The annotations the image will carry, checked before any export.
    let a = records()
        .dumps(0)
        .annotations(&CriArchiveLimits::default())
        .unwrap();
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "sandbox");
    assert_eq!(a[ANNOTATION_RUNTIME_NAME], "io.containerd.belayer.v1");
    let mut r = records();
    r.status["image_ref"] = serde_json::Value::Null;
    let e = r.dumps(0).annotations(&CriArchiveLimits::default());
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("config.dump names no rootfsImageRef")
    );
}

/// An export as the shim writes one, in `dir`.
fn plant_export(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("inventory.img"), b"inv").unwrap();
    std::fs::write(dir.join("pages-1.img"), vec![7u8; 5000]).unwrap();
    std::fs::write(dir.join("belayer-chain.tar"), vec![0u8; 2048]).unwrap();
}

#[test]
fn an_export_becomes_the_image_of_the_cri_archive_holding_it() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    plant_export(&export);
    let dumps = records().dumps(1_796_608_800_500);
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let image = export_image(&export, &dumps, &work, &CriArchiveLimits::default()).unwrap();

    // The archive CRI would have written: the export as checkpoint/, the dumps beside it.
    let root = tmp.path().join("cri");
    std::fs::create_dir(&root).unwrap();
    std::fs::rename(&export, root.join("checkpoint")).unwrap();
    for (name, text) in [
        ("config.dump", &dumps.config),
        ("spec.dump", &dumps.spec),
        ("status.dump", &dumps.status),
    ] {
        std::fs::write(root.join(name), text).unwrap();
    }
    let archive = tmp.path().join("cri.tar");
    let members = ["checkpoint", "config.dump", "spec.dump", "status.dump"];
    gnu_tar(&root, &archive, &["--sort=name"], &members);
    let from_archive = image_of(&archive, &CriArchiveLimits::default()).unwrap();
    assert_eq!(image.layer_digest, from_archive.layer_digest);
    assert_eq!(image.annotations, from_archive.annotations);
    assert_eq!(image.annotations[ANNOTATION_POD], "agent-pod");
    assert_eq!(
        image.annotations[ANNOTATION_ROOTFS_IMAGE_ID],
        "reg:5000/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111"
    );
    let config: serde_json::Value = serde_json::from_slice(&image.config_bytes).unwrap();
    assert_eq!(config["created"], "2026-12-07T02:00:00.5Z");
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([image.layer_digest.as_str()])
    );
}

#[test]
fn an_export_or_dumps_that_make_no_image_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let export = tmp.path().join("export");
    plant_export(&export);
    let refusal = |dumps: &CriDumps, limits: &CriArchiveLimits| {
        let work = tmp.path().join("work");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir(&work).unwrap();
        export_image(&export, dumps, &work, limits)
            .unwrap_err()
            .to_string()
    };
    let good = records().dumps(0);
    let limits = CriArchiveLimits::default();
    let mut d = good.clone();
    d.status = "not json".into();
    let e = refusal(&d, &limits);
    assert!(
        e.contains("as a Kubernetes checkpoint image: its status.dump does not parse"),
        "{e}"
    );
    let mut d = good.clone();
    d.spec = "{}".into();
    let e = refusal(&d, &limits);
    assert!(e.contains("spec.dump names no annotation"), "{e}");
    let small = CriArchiveLimits {
        max_dump_bytes: 64,
        ..Default::default()
    };
    assert!(refusal(&good, &small).contains("config.dump is over 64 bytes"));
    let few = CriArchiveLimits {
        max_members: 4,
        ..Default::default()
    };
    assert!(refusal(&good, &few).contains("more than 4 members"));
    std::fs::create_dir(export.join("sub")).unwrap();
    let e = refusal(&good, &limits);
    assert!(e.contains("sub"), "{e}");
}

/// The base image a pod names by digest, as CRI hands it to the runtime.
const BY_DIGEST: &str =
    "reg:5000/busybox@sha256:1111111111111111111111111111111111111111111111111111111111111111";

/// A pod's container's spec with the annotations containerd's CRI plugin writes into it.
fn cri_spec() -> serde_json::Value {
    serde_json::json!({"ociVersion": "1.2.1", "process": {"args": ["sh"]}, "annotations": {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.container-name": "sandbox",
        "io.kubernetes.cri.sandbox-id": "p0d",
        "io.kubernetes.cri.sandbox-name": "agent-pod",
        "io.kubernetes.cri.sandbox-namespace": "default",
        "io.kubernetes.cri.image-name": BY_DIGEST,
        "org.criu.config": "/run/belayer/criu.conf",
    }})
}

#[test]
fn a_cri_containers_own_spec_makes_the_dumps() {
    let spec = cri_spec().to_string();
    let created = 1_796_605_200_000_000_000;
    let records =
        ContainerRecords::of_cri_spec("c0ffee", "io.containerd.belayer.v1", created, &spec)
            .unwrap();
    let dumps = records.dumps(1_796_608_800_500);
    let config: serde_json::Value = serde_json::from_str(&dumps.config).unwrap();
    assert_eq!(
        config,
        serde_json::json!({
            "id": "c0ffee",
            "name": "sandbox",
            "rootfsImage": BY_DIGEST,
            "rootfsImageRef": BY_DIGEST,
            "rootfsImageName": BY_DIGEST,
            "runtime": "io.containerd.belayer.v1",
            "createdTime": "2026-12-07T01:00:00Z",
            "checkpointedTime": "2026-12-07T02:00:00.5Z",
            "restoredTime": "0001-01-01T00:00:00Z",
            "restored": false,
        })
    );
    assert_eq!(
        dumps.spec, spec,
        "spec.dump is the spec as the shim holds it"
    );
    let status: serde_json::Value = serde_json::from_str(&dumps.status).unwrap();
    assert_eq!(
        status,
        serde_json::json!({
            "id": "c0ffee",
            "metadata": {"name": "sandbox"},
            "state": 1,
            "created_at": created as i64,
            "image": {"image": BY_DIGEST},
            "image_ref": BY_DIGEST,
            "annotations": {
                "io.kubernetes.container.hash": "",
                "io.kubernetes.container.restartCount": "",
            },
        })
    );
    let a = dumps.annotations(&CriArchiveLimits::default()).unwrap();
    assert_eq!(a[ANNOTATION_ENGINE], "containerd");
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "sandbox");
    assert_eq!(a[ANNOTATION_POD], "agent-pod");
    assert_eq!(a[ANNOTATION_NAMESPACE], "default");
    assert_eq!(a[ANNOTATION_ROOTFS_IMAGE_ID], BY_DIGEST);
    assert_eq!(a[ANNOTATION_ROOTFS_IMAGE_NAME], BY_DIGEST);
    assert_eq!(a[ANNOTATION_RUNTIME_NAME], "io.containerd.belayer.v1");
}

#[test]
fn a_spec_that_makes_no_kubernetes_image_is_refused_naming_why() {
    let refusal = |spec: &str| {
        ContainerRecords::of_cri_spec("c", "io.containerd.belayer.v1", 0, spec)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(refusal("{not json"), "its spec does not parse");
    // A container ctr or docker made: no CRI annotations at all.
    let not_cri = "its spec has no annotation io.kubernetes.cri.container-type: \
                   not a Kubernetes (CRI) container";
    assert_eq!(refusal(r#"{"ociVersion":"1.2.1"}"#), not_cri);
    assert_eq!(
        refusal(r#"{"annotations":{"io.belayer.checkpoint":"auto"}}"#),
        not_cri
    );
    let edited = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut spec = cri_spec();
        edit(&mut spec["annotations"]);
        refusal(&spec.to_string())
    };
    assert_eq!(
        edited(&|a| a["io.kubernetes.cri.container-type"] = "sandbox".into()),
        "it is a pod's sandbox (annotation io.kubernetes.cri.container-type), \
         not a container a pod restores from an image"
    );
    assert_eq!(
        edited(&|a| drop(
            a.as_object_mut()
                .unwrap()
                .remove("io.kubernetes.cri.container-name")
        )),
        "its spec has no annotation io.kubernetes.cri.container-name \
         (the container's name in its pod)"
    );
    assert_eq!(
        edited(&|a| a["io.kubernetes.cri.image-name"] = "".into()),
        "its spec has no annotation io.kubernetes.cri.image-name \
         (the base image, which a restore pulls)"
    );
}

#[test]
fn a_pods_container_is_tagged_by_namespace_pod_and_name() {
    let records = |spec: serde_json::Value| {
        ContainerRecords::of_cri_spec("c0ffee", "io.containerd.belayer.v1", 0, &spec.to_string())
            .unwrap()
    };
    assert_eq!(
        records(cri_spec()).pod_tag("-kube").as_deref(),
        Some("default_agent-pod_sandbox-kube")
    );
    let mut spec = cri_spec();
    spec["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("io.kubernetes.cri.sandbox-namespace");
    assert_eq!(records(spec).pod_tag("-kube"), None, "no namespace");
    // A pod name of 253 characters (Kubernetes allows it) makes no tag.
    let mut spec = cri_spec();
    spec["annotations"]["io.kubernetes.cri.sandbox-name"] = "p".repeat(253).into();
    assert_eq!(records(spec).pod_tag("-kube"), None, "too long");
}
