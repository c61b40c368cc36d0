//! The README's usage sketch, compiled: checkpoint a runc container (processes and writable
//! layer at one instant), restore it in place, and fork it into a new container.
//!
//! `cargo run -p criu-bridge --example usage -- ID BUNDLE UPPER` (as root, on a container runc
//! runs under `/run/containerd/runc/default` whose rootfs is an overlay with upper dir UPPER;
//! the restore and the fork then need their own bundles and dirs, named below).

use std::path::{Path, PathBuf};

use criu_bridge::runc::{CriuOptions, RestoreStdio, Runc};
use criu_bridge::store::VerifyLevel;
use criu_bridge::{
    CheckpointRequest, DEFAULT_FROZEN_LIMIT, RestoreRequest, Store, checkpoint_container,
    mount_rootfs, restore_processes, verify,
};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Checkpoints container `id` (bundle `bundle`, rootfs upper dir `upper`, image lowers
/// `image_lowers`), leaving it running; returns the checkpoint's number.
fn checkpoint(
    runc: &Runc,
    store: &Store,
    id: &str,
    bundle: &Path,
    upper: &Path,
    image_lowers: &[PathBuf],
) -> Result<u64> {
    // The checkpoint the current rootfs descends from (the previous one of this upper dir, or
    // the one the rootfs was mounted from at a restore); `None`: straight on the image.
    let parent = store.latest("default", id)?;
    let cp = checkpoint_container(&CheckpointRequest {
        runc,
        store,
        namespace: "default",
        id,
        bundle,
        upper_dir: upper,
        image_lowers,
        rootfs_shared: false,
        parent: parent.as_ref(),
        leave_running: true,
        uncaptured_execs: &[],
        criu: CriuOptions::default(),
        yield_to_blocked: false,
        frozen_limit: DEFAULT_FROZEN_LIMIT,
    })?;
    Ok(cp.manifest.seq) // cp.manifest also has the timings and sizes
}

/// Restores checkpoint `seq` of `id` as container `as_id` (the same id: in place, after
/// `runc delete` of the old one; a new id: a fork) in `bundle`, whose rootfs is mounted here
/// over the checkpoint's layers with the empty `upper` and `work`.
fn restore(
    runc: &Runc,
    store: &Store,
    id: &str,
    seq: u64,
    as_id: &str,
    bundle: &Path,
    (upper, work): (&Path, &Path),
) -> Result<()> {
    let cp = store.load("default", id, seq)?;
    verify(store, &cp, VerifyLevel::Stamped)?; // before touching anything
    mount_rootfs(store, &cp, upper, work, &bundle.join("rootfs"))?;
    let criu = cp.manifest.criu_options.clone();
    let report = restore_processes(
        &RestoreRequest {
            runc,
            image_dir: &cp.criu_dir(),
            criu: &criu,
            id: as_id,
            bundle,
            work_dir: &bundle.join("restore-work"),
            detach: true,
            pid_file: Some(&bundle.join("init.pid")),
            console_socket: None,
            lazy_pages: false,
        },
        RestoreStdio {
            stdin: None,
            stdout: None,
            stderr: None,
        },
    )?;
    println!("{as_id} restored: {report:?}");
    // Its next checkpoint passes `parent: Some(&cp)` and `upper_dir: upper`.
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [id, bundle, upper] = &args[..] else {
        eprintln!("usage: usage ID BUNDLE UPPER (see the source)");
        return Ok(());
    };
    let runc = Runc::new("/run/containerd/runc/default");
    let store = Store::default(); // /var/lib/belayer
    let seq = checkpoint(&runc, &store, id, Path::new(bundle), Path::new(upper), &[])?;
    // Fork: a new id, a bundle with the same config.json, its own upper and work dirs.
    let fork = format!("{id}-fork-1");
    let fork_bundle = PathBuf::from(format!("{bundle}-fork-1"));
    let (fork_upper, fork_work) = (fork_bundle.join("upper"), fork_bundle.join("work"));
    restore(
        &runc,
        &store,
        id,
        seq,
        &fork,
        &fork_bundle,
        (&fork_upper, &fork_work),
    )
}
