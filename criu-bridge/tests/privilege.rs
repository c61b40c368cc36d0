//! Real runc + CRIU: the core image of a checkpointed busybox container decodes to the
//! credentials its spec gave it (runc's default capabilities, no_new_privs, a seccomp filter),
//! and the same image rewritten with raised capability sets or seccomp off is refused before
//! CRIU runs (nothing restored, nothing written), while the unmodified image restores.

mod common;

use std::path::Path;
use std::process::Command;

use common::Container;
use criu_bridge::criu::PrivilegeError;
use criu_bridge::criu::images::{self, CORE_MAGIC, CredsEntry, IDS_MAGIC};
use criu_bridge::runc::{CriuOptions, RestoreStdio};
use criu_bridge::{CheckpointRequest, RestoreError, RestoreRequest, Store, checkpoint_container};
use prost::Message;
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};

/// runc's default capabilities (`runc spec`): CAP_KILL, CAP_NET_BIND_SERVICE, CAP_AUDIT_WRITE.
const RUNC_DEFAULT_CAPS: u32 = (1 << 5) | (1 << 10) | (1 << 29);

/// The fields of a protobuf message as (tag, wire type, the field's bytes after its key).
fn fields(mut buf: &[u8]) -> Vec<(u32, WireType, Vec<u8>)> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let (tag, wt) = decode_key(&mut buf).unwrap();
        let start = buf;
        let len = match wt {
            WireType::Varint => {
                decode_varint(&mut buf).unwrap();
                start.len() - buf.len()
            }
            WireType::SixtyFourBit => 8,
            WireType::ThirtyTwoBit => 4,
            WireType::LengthDelimited => {
                let n = decode_varint(&mut buf).unwrap() as usize;
                start.len() - buf.len() + n
            }
            other => panic!("unexpected wire type {other:?}"),
        };
        out.push((tag, wt, start[..len].to_vec()));
        buf = &start[len..];
    }
    out
}

fn encode(fields: &[(u32, WireType, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, wt, body) in fields {
        encode_key(*tag, *wt, &mut out);
        out.extend_from_slice(body);
    }
    out
}

fn length_delimited(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_varint(msg.len() as u64, &mut out);
    out.extend_from_slice(msg);
    out
}

/// The payload of a length-delimited field's bytes.
fn payload(body: &[u8]) -> &[u8] {
    let mut b = body;
    let n = decode_varint(&mut b).unwrap() as usize;
    &b[..n]
}

/// Rewrites a real core image: `edit` changes its thread's creds, and its seccomp mode is set
/// to `seccomp_mode`. Every other field (registers, signals, the task part) is kept byte for
/// byte; `CredsEntry` models every field of `creds.proto`, so re-encoding it loses nothing.
fn forge(core_img: &[u8], edit: impl Fn(&mut CredsEntry), seccomp_mode: Option<u64>) -> Vec<u8> {
    let (head, rest) = core_img.split_at(8);
    assert_eq!(
        u32::from_le_bytes(head[4..].try_into().unwrap()),
        CORE_MAGIC
    );
    let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
    assert_eq!(rest.len(), 4 + len, "one core entry");
    let mut core = fields(&rest[4..]);
    let tc = core.iter_mut().find(|f| f.0 == 5).expect("thread_core");
    let mut thread = fields(payload(&tc.2));
    let creds = thread.iter_mut().find(|f| f.0 == 10).expect("creds");
    let mut c = CredsEntry::decode(payload(&creds.2)).unwrap();
    edit(&mut c);
    creds.2 = length_delimited(&c.encode_to_vec());
    if let Some(mode) = seccomp_mode {
        thread.retain(|f| f.0 != 11);
        let mut v = Vec::new();
        encode_varint(mode, &mut v);
        thread.push((11, WireType::Varint, v));
    }
    tc.2 = length_delimited(&encode(&thread));
    let body = encode(&core);
    let mut out = head.to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Rewrites a real ids image: its task's network namespace id becomes `net_ns_id`; every other
/// field is kept.
fn forge_net_ns(ids_img: &[u8], net_ns_id: u32) -> Vec<u8> {
    let (head, rest) = ids_img.split_at(8);
    assert_eq!(u32::from_le_bytes(head[4..].try_into().unwrap()), IDS_MAGIC);
    let mut ids = fields(&rest[4..]);
    let net = ids.iter_mut().find(|f| f.0 == 6).expect("net_ns_id");
    net.2.clear();
    encode_varint(net_ns_id.into(), &mut net.2);
    let body = encode(&ids);
    let mut out = head.to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// Starts `c` again under a spec with a seccomp filter (runc's default spec has none).
fn rerun_with_seccomp(c: &Container, base: &Path) {
    c.kill(&c.id);
    let path = c.bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["linux"]["seccomp"] = serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [{"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO"}],
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let log = base.join("rerun.log");
    let ok = Command::new("runc")
        .arg("--root")
        .arg(&c.runc.root)
        .arg("--log")
        .arg(&log)
        .args(["run", "--detach", &c.id])
        .current_dir(&c.bundle)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "runc run: {}", std::fs::read_to_string(&log).unwrap());
}

#[test]
fn a_capability_raised_core_image_is_refused_and_the_real_one_restores() {
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let c = Container::start(base, "bl-priv", "while :; do sleep 0.05; done");
    rerun_with_seccomp(&c, base);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let store = Store::new(base.join("store"));
    let cp = checkpoint_container(&CheckpointRequest {
        runc: &c.runc,
        store: &store,
        namespace: "default",
        id: &c.id,
        bundle: &c.bundle,
        upper_dir: &c.upper,
        image_lowers: std::slice::from_ref(&c.lower),
        rootfs_shared: false,
        parent: None,
        leave_running: false,
        uncaptured_execs: &[],
        criu: CriuOptions::default(),
        yield_to_blocked: false,
        frozen_limit: criu_bridge::DEFAULT_FROZEN_LIMIT,
    })
    .unwrap();
    let dir = cp.criu_dir();

    // What CRIU 4.2.1 wrote decodes to what the spec gave the process.
    let tasks = images::read_pstree(&dir).unwrap();
    let pid = tasks[0].pid;
    let core = images::read_core(&dir, pid).unwrap();
    let th = core.thread_core.as_ref().unwrap();
    let creds = th.creds.as_ref().unwrap();
    eprintln!("task {pid}: {creds:?}, seccomp {:?}", th.seccomp_mode);
    assert_eq!(core.tc.as_ref().unwrap().comm.as_deref(), Some("sh"));
    assert_eq!((creds.uid, creds.euid, creds.gid), (0, 0, 0));
    for set in [&creds.cap_prm, &creds.cap_eff, &creds.cap_bnd] {
        assert_eq!(set[..], [RUNC_DEFAULT_CAPS, 0]);
    }
    assert!(creds.cap_amb.iter().all(|&w| w == 0));
    assert_eq!(creds.no_new_privs, Some(1));
    assert_eq!(th.seccomp_mode, Some(2));
    // runc's spec gives the container new namespaces: none is the one CRIU dumped from.
    let host = images::read_inventory(&dir).unwrap().root_ids.unwrap();
    let ids = images::read_ids(&dir, pid).unwrap().unwrap();
    for kind in ["pid", "network", "ipc", "uts", "mount"] {
        assert_ne!(ids.of(kind), host.of(kind), "{kind}");
        assert!(ids.of(kind).is_some(), "{kind}");
    }
    criu_bridge::check_privilege(&dir, &c.bundle).unwrap();

    // A bundle to restore into, under another id, with the same spec.
    let id = "bl-priv-r";
    let bundle = base.join(format!("bundle-{id}"));
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::copy(c.bundle.join("config.json"), bundle.join("config.json")).unwrap();
    let rootfs = bundle.join("rootfs");
    criu_bridge::mount_rootfs(&store, &cp, &base.join("r-up"), &base.join("r-wk"), &rootfs)
        .unwrap();
    c.extra_mounts.borrow_mut().push(rootfs.clone());
    c.extra_ids.borrow_mut().push(id.into());
    let work = base.join("restore-work");
    let restore = || {
        criu_bridge::restore_processes(
            &RestoreRequest {
                runc: &c.runc,
                image_dir: &dir,
                criu: &cp.manifest.criu_options,
                id,
                bundle: &bundle,
                work_dir: &work,
                detach: true,
                pid_file: Some(&work.join("pid")),
                console_socket: None,
                lazy_pages: false,
            },
            RestoreStdio::default(),
        )
    };

    let core_path = dir.join(format!("core-{pid}.img"));
    let real = std::fs::read(&core_path).unwrap();
    let raise = |c: &mut CredsEntry| {
        c.cap_prm = vec![u32::MAX, 0x1ff];
        c.cap_eff = vec![u32::MAX, 0x1ff];
        c.cap_bnd = vec![u32::MAX, 0x1ff];
    };
    let cases: [(&str, Vec<u8>); 5] = [
        ("cap_prm", forge(&real, raise, Some(0))),
        ("cap_eff", forge(&real, |c| c.cap_eff[0] |= 1 << 21, None)),
        ("cap_bnd", forge(&real, |c| c.cap_bnd[1] = 1, None)),
        (
            "no_new_privs",
            forge(&real, |c| c.no_new_privs = Some(0), None),
        ),
        ("seccomp_mode", forge(&real, |_| {}, Some(0))),
    ];
    // The rewrite keeps everything else: unedited, it is the real image.
    assert_eq!(forge(&real, |_| {}, None), real);
    for (field, img) in cases {
        std::fs::write(&core_path, &img).unwrap();
        let forged = images::read_core(&dir, pid).unwrap();
        assert_ne!(forged, core, "{field}: the image was rewritten");
        let err = restore().expect_err(field);
        let msg = criu_bridge_error_chain(&err);
        eprintln!("{field}: {msg}");
        match &err {
            RestoreError::Privilege { source, .. } => match source.as_ref() {
                PrivilegeError::Task {
                    pid: p,
                    field: f,
                    comm,
                    ..
                } => assert_eq!((*p, *f, comm.as_str()), (pid, field, "sh"), "{msg}"),
                other => panic!("{field}: refused for another reason: {other:?}"),
            },
            other => panic!("{field}: not refused for privilege: {other:?}"),
        }
        assert!(!work.exists(), "{field}: nothing is written");
        assert_eq!(c.status(id), None, "{field}: no container");
    }
    // The root task's ids rewritten to the namespace CRIU dumped from: restored in the node's.
    std::fs::write(&core_path, &real).unwrap();
    let ids_path = dir.join(format!("ids-{pid}.img"));
    let real_ids = std::fs::read(&ids_path).unwrap();
    std::fs::write(&ids_path, forge_net_ns(&real_ids, host.net_ns_id.unwrap())).unwrap();
    let msg = criu_bridge_error_chain(&restore().unwrap_err());
    eprintln!("net_ns_id: {msg}");
    assert!(
        msg.contains(&format!("task {pid} (sh, thread {pid})")) && msg.contains("net_ns_id"),
        "{msg}"
    );
    assert!(!work.exists(), "nothing is written");
    std::fs::write(&ids_path, &real_ids).unwrap();

    let all_raised = forge(&real, raise, Some(0));
    std::fs::write(&core_path, &all_raised).unwrap();
    let msg = criu_bridge_error_chain(&restore().unwrap_err());
    assert!(
        msg.contains(&format!("task {pid} (sh, thread {pid})"))
            && msg.contains("cap_prm")
            && msg.contains("CAP_SYS_ADMIN"),
        "{msg}"
    );

    std::fs::write(&core_path, &real).unwrap();
    restore().expect("the real images restore");
    assert_eq!(c.status(id).as_deref(), Some("running"));
}

fn criu_bridge_error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
