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
