//! A checkpoint whose CRIU core images were rewritten to hold every capability (and whose
//! manifest was updated to match, so it verifies) is refused by `belayer restore` with an error
//! naming the task and the field, before the running container is touched; the container's
//! real checkpoint still restores.

mod common;

use std::path::Path;

use belayer_integration::{Containerd, Flavor};
use common::*;

fn varint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// The low word of a capability set of `pid` (`CapPrm` and so on in /proc/<pid>/status).
fn cap_word(pid: &str, set: &str) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{set}:")))
        .expect("cap line");
    u64::from_str_radix(line.trim(), 16).expect("hex") as u32
}

/// Replaces, in `img`, CRIU's encoding of `creds_entry` fields cap_prm (10), cap_eff (11) and
/// cap_bnd (12) holding `word` with the same fields holding every capability bit. Same length:
/// both values take five varint bytes. Returns how many fields were raised.
fn raise_caps(img: &mut [u8], word: u32) -> usize {
    let (from, to) = (varint(word.into()), varint(u32::MAX.into()));
    assert_eq!(from.len(), to.len(), "{word:#x} is not a five-byte varint");
    let mut raised = 0;
    for key in [10u8 << 3, 11 << 3, 12 << 3] {
        let mut pat = vec![key];
        pat.extend_from_slice(&from);
        let mut i = 0;
        while i + pat.len() <= img.len() {
            if img[i..i + pat.len()] == pat[..] {
                img[i + 1..i + pat.len()].copy_from_slice(&to);
                raised += 1;
                i += pat.len();
            } else {
                i += 1;
            }
        }
    }
    raised
}

fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_string()
}

#[test]
fn a_capability_raised_core_image_is_refused_before_the_container_is_touched() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "priv", &["sh", "-c", COUNTER]);
    let good = checkpoint(&c, "priv");
    let forged = checkpoint(&c, "priv");
    let pid = task_pid(&c, "priv");
    let word = cap_word(&pid, "CapPrm");
    assert_eq!(word, cap_word(&pid, "CapBnd"), "containerd's default sets");
    assert_eq!(
        word & (1 << 21),
        0,
        "the spec grants CAP_SYS_ADMIN: nothing to raise"
    );

    // The forger rewrites every thread's core image and the manifest's digests of them.
    let dir = c.checkpoints_dir("priv").join(&forged);
    let manifest_path = dir.join("manifest.json");
    // Edited as text: the manifest's field order matters (format_version first).
    let mut manifest = std::fs::read_to_string(&manifest_path).expect("manifest");
    let mut raised = 0;
    for e in std::fs::read_dir(dir.join("criu"))
        .expect("criu dir")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("core-") && name.ends_with(".img")) {
            continue;
        }
        let before = sha256(&e.path());
        let mut img = std::fs::read(e.path()).expect("core image");
        raised += raise_caps(&mut img, word);
        std::fs::write(e.path(), &img).expect("write core image");
        let after = sha256(&e.path());
        assert!(manifest.contains(&before), "{name} is not in the manifest");
        manifest = manifest.replacen(&before, &after, 1);
    }
    assert!(raised >= 3, "no capability field was raised ({raised})");
    std::fs::write(&manifest_path, manifest).expect("manifest");

    let out = c.belayer(&["restore", "priv", "--checkpoint", &forged]);
    assert_ne!(
        out.code, 0,
        "a capability-raised checkpoint restored: {out:?}"
    );
    eprintln!("refused: {}", out.stderr.trim());
    assert!(
        out.stderr.contains("exceeds the container's spec")
            && out.stderr.contains("cap_prm")
            && out.stderr.contains("CAP_SYS_ADMIN")
            && out.stderr.contains("task "),
        "the refusal does not name the task and field: {:?}",
        out.stderr
    );
    assert_eq!(task_status(&c, "priv"), "RUNNING");
    assert_eq!(task_pid(&c, "priv"), pid, "the container was touched");
    assert_eq!(cap_word(&pid, "CapEff"), word);

    // The real checkpoint restores, with the spec's capabilities.
    let out = c.belayer(&["restore", "priv", "--checkpoint", &good]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(task_status(&c, "priv"), "RUNNING");
    assert_eq!(cap_word(&task_pid(&c, "priv"), "CapPrm"), word);
    remove(&c, "priv");
}

/// Raises the capability sets in every `core-*.img` under `dir` (any depth), adding each
/// file's digests before and after to `digests`. Returns how many capability fields were raised.
fn raise_caps_under(dir: &Path, word: u32, digests: &mut Vec<(String, String)>) -> usize {
    let mut raised = 0;
    for p in files_under(dir) {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("core-") && name.ends_with(".img") {
            let before = sha256(&p);
            let mut img = std::fs::read(&p).expect("core image");
            raised += raise_caps(&mut img, word);
            std::fs::write(&p, &img).expect("write core image");
            digests.push((before, sha256(&p)));
        }
    }
    raised
}

/// Every `manifest.json` under `dir` with each digest of `digests` rewritten (before → after).
fn rewrite_manifests(dir: &Path, digests: &[(String, String)]) {
    for m in files_under(dir)
        .into_iter()
        .filter(|p| p.ends_with("manifest.json"))
    {
        let mut text = std::fs::read_to_string(&m).expect("manifest");
        for (before, after) in digests {
            text = text.replace(before.as_str(), after);
        }
        std::fs::write(&m, text).expect("manifest");
    }
}

fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let (mut out, mut stack) = (Vec::new(), vec![dir.to_path_buf()]);
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            if e.file_type().expect("file type").is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// Writes `bytes` as a blob of the OCI layout `oci`; returns its digest (`sha256:<hex>`).
fn put_blob(oci: &Path, bytes: &[u8]) -> String {
    let tmp = oci.join("blob.tmp");
    std::fs::write(&tmp, bytes).expect("write blob");
    let hex = sha256(&tmp);
    std::fs::rename(&tmp, oci.join("blobs/sha256").join(&hex)).expect("place blob");
    format!("sha256:{hex}")
}

/// In the OCI layout `oci`, replaces the blob `old` (a descriptor anywhere under the image
/// index) by `new` bytes, and every index or manifest on the way up by its rewritten self, up
/// to `index.json`. Returns whether `old` was found.
fn replace_blob(oci: &Path, json: &mut serde_json::Value, old: &str, new: &[u8]) -> bool {
    let mut found = false;
    for key in ["manifests", "layers"] {
        // `get_mut`: indexing a missing key would insert it (an index with `layers` reads as a
        // manifest to containerd).
        let Some(list) = json.get_mut(key).and_then(|v| v.as_array_mut()) else {
            continue;
        };
        for d in list {
            let digest = d["digest"].as_str().unwrap_or_default().to_string();
            if digest == old {
                d["digest"] = put_blob(oci, new).into();
                d["size"] = new.len().into();
                found = true;
                continue;
            }
            let media = d["mediaType"].as_str().unwrap_or_default();
            if !(media.contains("manifest") || media.contains("index")) {
                continue;
            }
            let path = oci
                .join("blobs/sha256")
                .join(digest.trim_start_matches("sha256:"));
            let Ok(raw) = std::fs::read(&path) else {
                continue;
            };
            let mut child: serde_json::Value = serde_json::from_slice(&raw).expect("blob JSON");
            if replace_blob(oci, &mut child, old, new) {
                let bytes = serde_json::to_vec(&child).unwrap();
                d["digest"] = put_blob(oci, &bytes).into();
                d["size"] = bytes.len().into();
                found = true;
            }
        }
    }
    found
}

/// All descriptors under `json` (an index or manifest of the layout `oci`) with a media type
/// containing `kind`.
fn descriptors(oci: &Path, json: &serde_json::Value, kind: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["manifests", "layers"] {
        for d in json[key].as_array().into_iter().flatten() {
            let (digest, media) = (
                d["digest"].as_str().unwrap_or_default(),
                d["mediaType"].as_str().unwrap_or_default(),
            );
            if media.contains(kind) {
                out.push(digest.to_string());
            } else if media.contains("manifest") || media.contains("index") {
                let path = oci
                    .join("blobs/sha256")
                    .join(digest.trim_start_matches("sha256:"));
                if let Ok(raw) = std::fs::read(path) {
                    let child = serde_json::from_slice(&raw).expect("blob JSON");
                    out.extend(descriptors(oci, &child, kind));
                }
            }
        }
    }
    out
}

/// containerd's own restore path: a checkpoint image (`ctr containers checkpoint --task`) is
/// exported, its CRIU layer forged — every core image's capability sets raised, in the Belayer
/// chain (with the chain's manifests updated to match) and in the flat CRIU images beside it,
/// or with the chain taken out so the flat images are all there is (a runc-made image) — and
/// imported again under a new name. `ctr containers restore` of either is refused naming the
/// task and the field, and no task runs; the unforged image restores.
#[test]
fn a_capability_raised_checkpoint_image_is_refused_by_ctr_container_restore() {
    let c = Containerd::start(Flavor::V2);
    run_detached(&c, BELAYER, "privctr", &["sh", "-c", COUNTER]);
    let pid = task_pid(&c, "privctr");
    let word = cap_word(&pid, "CapPrm");
    assert_eq!(word & (1 << 21), 0, "the spec grants CAP_SYS_ADMIN");
    c.ctr(&[
        "containers",
        "checkpoint",
        "--task",
        "privctr",
        "belayer.local/good:1",
    ])
    .ok();
    let work = c.dir.join("forge-ctr");
    let oci = work.join("oci");
    std::fs::create_dir_all(&oci).unwrap();
    let s = |p: &Path| p.display().to_string();
    let exported = work.join("good.tar");
    // A checkpoint image has no platform manifest: no Docker manifest.json, every platform.
    // --local: through the transfer API (the default) ctr returns once containerd has sent the
    // archive, while its own goroutine may still be writing it to the file (containerd 2.1's
    // `ImageExportStream.MarshalAny`): 1 run in 6 read a truncated tar here.
    let flags = ["--skip-manifest-json", "--all-platforms", "--local"];
    c.ctr(&[
        "images",
        "export",
        flags[0],
        flags[1],
        flags[2],
        &s(&exported),
        "belayer.local/good:1",
    ])
    .ok();
    tar(&[
        "--extract",
        "--file",
        &s(&exported),
        "--directory",
        &s(&oci),
    ]);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(oci.join("index.json")).unwrap()).unwrap();
    let criu = descriptors(&oci, &index, "criu.checkpoint");
    assert_eq!(
        criu.len(),
        1,
        "one CRIU layer in the checkpoint image: {index}"
    );
    let criu_blob = oci
        .join("blobs/sha256")
        .join(criu[0].trim_start_matches("sha256:"));

    for (variant, keep_chain) in [("chain", true), ("flat", false)] {
        let layer = work.join(format!("layer-{variant}"));
        std::fs::create_dir_all(&layer).unwrap();
        tar(&[
            "--extract",
            "--file",
            &s(&criu_blob),
            "--directory",
            &s(&layer),
        ]);
        let chain = layer.join("belayer-chain.tar");
        assert!(chain.exists(), "no belayer-chain.tar in the CRIU layer");
        // The flat CRIU images (what runc restores; the chain's newest checkpoint is read
        // from them too), then the chain's own, whose manifests then name the forged digests.
        let mut digests = Vec::new();
        let mut raised = raise_caps_under(&layer, word, &mut digests);
        if keep_chain {
            let inner = work.join(format!("chain-{variant}"));
            std::fs::create_dir_all(&inner).unwrap();
            let keep = [
                "--xattrs",
                "--xattrs-include=*",
                "--numeric-owner",
                "--sparse",
            ];
            let mut args = vec!["--extract", "--same-owner", "--preserve-permissions"];
            args.extend(keep);
            let (chain_s, inner_s) = (s(&chain), s(&inner));
            args.extend(["--file", &chain_s, "--directory", &inner_s]);
            tar(&args);
            raised += raise_caps_under(&inner, word, &mut digests);
            rewrite_manifests(&inner, &digests);
            let mut args = vec!["--create", "--format=posix"];
            args.extend(keep);
            args.extend(["--file", &chain_s, "--directory", &inner_s, "checkpoints"]);
            tar(&args);
        } else {
            std::fs::remove_file(&chain).unwrap();
        }
        assert!(raised >= 3, "{variant}: no capability field was raised");
        let forged_layer = work.join(format!("layer-{variant}.tar"));
        tar(&[
            "--create",
            "--file",
            &s(&forged_layer),
            "--directory",
            &s(&layer),
            ".",
        ]);
        let mut forged_index = index.clone();
        let bytes = std::fs::read(&forged_layer).unwrap();
        assert!(replace_blob(&oci, &mut forged_index, &criu[0], &bytes));
        let name = format!("belayer.local/forged-{variant}:1");
        for m in forged_index["manifests"].as_array_mut().unwrap() {
            m["annotations"]["io.containerd.image.name"] = name.clone().into();
            m["annotations"]["org.opencontainers.image.ref.name"] = "1".into();
        }
        std::fs::write(
            oci.join("index.json"),
            serde_json::to_vec(&forged_index).unwrap(),
        )
        .unwrap();
        let packed = work.join(format!("forged-{variant}.tar"));
        tar(&[
            "--create",
            "--file",
            &s(&packed),
            "--directory",
            &s(&oci),
            ".",
        ]);
        c.ctr(&[
            "images",
            "import",
            "--all-platforms",
            "--no-unpack",
            &s(&packed),
        ])
        .ok();

        let id = format!("forged-{variant}");
        let out = c.ctr(&["containers", "restore", "--live", &id, &name]);
        eprintln!("{variant}: {out:?}");
        assert_ne!(out.code, 0, "{variant}: a capability-raised image restored");
        let text = format!("{}{}", out.stdout, out.stderr);
        assert!(
            text.contains("exceeds the container's spec")
                && text.contains("cap_prm")
                && text.contains("CAP_SYS_ADMIN"),
            "{variant}: the refusal does not name the field: {text}"
        );
        // A Belayer chain is checked when the task is created (no task is left); raw CRIU
        // images when it starts (the task stays CREATED, with no process).
        let row = c.task_row(&id);
        assert!(
            row.is_empty() || row == ["0", "CREATED"],
            "{variant}: a task was started: {row:?}"
        );
        let _ = c.ctr(&["tasks", "rm", &id]);
        let _ = c.ctr(&["containers", "rm", &id]);
    }
    assert_eq!(
        task_pid(&c, "privctr"),
        pid,
        "the source container was touched"
    );
    c.ctr(&[
        "containers",
        "restore",
        "--live",
        "fromgood",
        "belayer.local/good:1",
    ])
    .ok();
    assert_eq!(task_status(&c, "fromgood"), "RUNNING");
    assert_eq!(cap_word(&task_pid(&c, "fromgood"), "CapPrm"), word);
    remove(&c, "fromgood");
    remove(&c, "privctr");
}
