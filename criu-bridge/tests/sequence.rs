//! The one-instant sequence with a recording fake in place of runc and CRIU (no root needed):
//! the order of steps, thawing after failures, paused containers left paused, exit mode.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Output};
use std::sync::{Arc, Mutex};

use criu_bridge::runc::{CriuOptions, Runc, Spawner};
use criu_bridge::{CheckpointError, CheckpointRequest, Store, checkpoint_container};

/// Answers like runc/CRIU would and records the verbs it was asked for.
struct Fake {
    status: &'static str,
    fail_checkpoint: bool,
    /// The dump leaves something in the way of the manifest: the write after it fails.
    fail_write: bool,
    /// `runc delete` fails.
    fail_delete: bool,
    calls: Mutex<Vec<String>>,
}

impl Spawner for Fake {
    fn output(&self, cmd: Command) -> std::io::Result<Output> {
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let ok = |stdout: &str| Output {
            status: ExitStatus::from_raw(0),
            stdout: stdout.into(),
            stderr: Vec::new(),
        };
        if args == ["--version"] {
            return Ok(ok("Version: 4.2.1\n"));
        }
        let verb = args
            .iter()
            .skip(4)
            .find(|a| !a.starts_with('-'))
            .cloned()
            .unwrap_or_default();
        self.calls.lock().unwrap().push(verb.clone());
        match verb.as_str() {
            "state" => Ok(ok(&format!(
                r#"{{"id":"c1","pid":42,"status":"{}","bundle":"/b"}}"#,
                self.status
            ))),
            "checkpoint" if self.fail_checkpoint => Ok(Output {
                status: ExitStatus::from_raw(256),
                stdout: Vec::new(),
                stderr: b"criu failed: type NOTIFY errno 0".to_vec(),
            }),
            "checkpoint" => {
                assert!(
                    args.iter().any(|a| a == "--leave-running"),
                    "CRIU must leave the processes in place, exit mode too: {args:?}"
                );
                assert!(
                    cmd.get_envs().all(|(k, _)| k != "CRIU_FAULT"),
                    "no stopped task: CRIU seizes the frozen cgroup, runc's way"
                );
                if self.fail_write {
                    let at = args.iter().position(|a| a == "--image-path").unwrap();
                    let images = std::path::Path::new(&args[at + 1]);
                    std::fs::create_dir(images.parent().unwrap().join("manifest.json"))?;
                }
                Ok(ok(""))
            }
            "delete" if self.fail_delete => Ok(Output {
                status: ExitStatus::from_raw(256),
                stdout: Vec::new(),
                stderr: b"container init still running".to_vec(),
            }),
            _ => Ok(ok("")),
        }
    }
}

struct Env {
    tmp: tempfile::TempDir,
    fake: Arc<Fake>,
    runc: Runc,
    store: Store,
}

fn env(status: &'static str, fail_checkpoint: bool) -> Env {
    env_with(status, fail_checkpoint, false, false)
}

fn env_with(
    status: &'static str,
    fail_checkpoint: bool,
    fail_write: bool,
    fail_delete: bool,
) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("upper/etc")).unwrap();
    std::fs::write(tmp.path().join("upper/etc/x"), "x").unwrap();
    std::fs::write(tmp.path().join("config.json"), "{}").unwrap();
    let fake = Arc::new(Fake {
        status,
        fail_checkpoint,
        fail_write,
        fail_delete,
        calls: Mutex::new(Vec::new()),
    });
    let mut runc = Runc::new(tmp.path().join("runc"));
    runc.spawner = fake.clone();
    let store = Store::new(tmp.path().join("store"));
    Env {
        tmp,
        fake,
        runc,
        store,
    }
}

fn run(e: &Env, leave_running: bool) -> Result<criu_bridge::Checkpoint, CheckpointError> {
    let upper = e.tmp.path().join("upper");
    checkpoint_container(&CheckpointRequest {
        runc: &e.runc,
        store: &e.store,
        namespace: "default",
        id: "c1",
        bundle: e.tmp.path(),
        upper_dir: &upper,
        image_lowers: &[],
        rootfs_shared: false,
        parent: None,
        leave_running,
        uncaptured_execs: &[],
        criu: CriuOptions::default(),
        yield_to_blocked: false,
        frozen_limit: criu_bridge::DEFAULT_FROZEN_LIMIT,
    })
}

fn calls(e: &Env) -> Vec<String> {
    e.fake.calls.lock().unwrap().clone()
}

#[test]
fn running_container_is_paused_dumped_and_resumed() {
    let e = env("running", false);
    let cp = run(&e, true).unwrap();
    assert_eq!(calls(&e), ["state", "pause", "checkpoint", "resume"]);
    assert!(cp.fs_dir().join("etc/x").is_file(), "fs layer captured");
    assert_eq!(cp.manifest.fs_chain, [1]);
}

#[test]
fn paused_container_is_left_paused() {
    let e = env("paused", false);
    run(&e, true).unwrap();
    assert_eq!(calls(&e), ["state", "checkpoint"]);
}

#[test]
fn exit_mode_ends_the_container_once_the_checkpoint_is_stored() {
    let e = env("running", false);
    let cp = run(&e, false).unwrap();
    assert_eq!(calls(&e), ["state", "pause", "checkpoint", "delete"]);
    assert!(!cp.manifest.leave_running);
    assert_eq!(e.store.list("default", "c1").unwrap().len(), 1);
}

#[test]
fn exit_mode_failing_after_the_dump_keeps_the_container() {
    // The write fails (a full disk, say): the container runs on, and nothing is listed.
    let e = env_with("running", false, true, false);
    let err = run(&e, false).unwrap_err();
    assert!(matches!(err, CheckpointError::Store { .. }), "{err}");
    assert_eq!(calls(&e), ["state", "pause", "checkpoint", "resume"]);
    assert!(e.store.list("default", "c1").unwrap().is_empty());
    // Stored, but runc could not end it: it runs on, and the checkpoint stays.
    let e = env_with("running", false, false, true);
    let err = run(&e, false).unwrap_err();
    assert!(matches!(err, CheckpointError::End { seq: 1, .. }), "{err}");
    assert_eq!(
        calls(&e),
        ["state", "pause", "checkpoint", "delete", "resume"]
    );
    assert_eq!(e.store.list("default", "c1").unwrap().len(), 1);
}

#[test]
fn failed_dump_thaws_and_leaves_nothing() {
    let e = env("running", true);
    let err = run(&e, true).unwrap_err();
    assert!(matches!(err, CheckpointError::Dump { .. }), "{err}");
    assert_eq!(calls(&e), ["state", "pause", "checkpoint", "resume"]);
    assert!(e.store.list("default", "c1").unwrap().is_empty());
}

#[test]
fn failed_capture_thaws_and_leaves_nothing() {
    let e = env("running", false);
    std::fs::remove_dir_all(e.tmp.path().join("upper")).unwrap();
    let err = run(&e, true).unwrap_err();
    assert!(matches!(err, CheckpointError::Capture { .. }), "{err}");
    assert_eq!(calls(&e), ["state", "pause", "checkpoint", "resume"]);
    // Nor does it end the processes in exit mode.
    let e = env("running", false);
    std::fs::remove_dir_all(e.tmp.path().join("upper")).unwrap();
    run(&e, false).unwrap_err();
    assert_eq!(calls(&e), ["state", "pause", "checkpoint", "resume"]);
}

#[test]
fn stopped_container_is_refused() {
    let e = env("stopped", false);
    let err = run(&e, true).unwrap_err();
    assert!(matches!(err, CheckpointError::NotRunning { .. }), "{err}");
    assert_eq!(calls(&e), ["state"]);
}

#[test]
fn a_stale_parent_is_re_read_so_the_chain_stays_whole() {
    let e = env("running", false);
    let upper = e.tmp.path().join("upper");
    let req = |parent| CheckpointRequest {
        runc: &e.runc,
        store: &e.store,
        namespace: "default",
        id: "c1",
        bundle: e.tmp.path(),
        upper_dir: &upper,
        image_lowers: &[],
        rootfs_shared: false,
        parent,
        leave_running: true,
        uncaptured_execs: &[],
        criu: CriuOptions::default(),
        yield_to_blocked: false,
        frozen_limit: criu_bridge::DEFAULT_FROZEN_LIMIT,
    };
    let cp1 = checkpoint_container(&req(None)).unwrap();
    std::fs::write(upper.join("etc/y"), "y").unwrap();
    let stale = checkpoint_container(&req(Some(&cp1))).unwrap();
    assert_eq!(stale.manifest.fs_chain, [2, 1]);
    e.store.compact("default", "c1", 2).unwrap();
    e.store.delete("default", "c1", 1).unwrap();
    std::fs::write(upper.join("etc/z"), "z").unwrap();
    let cp3 = checkpoint_container(&req(Some(&stale))).unwrap();
    assert_eq!(
        cp3.manifest.fs_chain,
        [3, 2],
        "chain built from a stale parent manifest"
    );
    assert!(
        cp3.fs_dir().join("etc/z").is_file() && !cp3.fs_dir().join("etc/y").exists(),
        "not incremental"
    );
}
