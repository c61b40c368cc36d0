//! containerd's own checkpoint path: `Task.Checkpoint` writes a self-contained Belayer checkpoint
//! (processes and filesystem, the whole layer chain) into the directory containerd names, and a
//! task created with `checkpoint` set imports such a directory and restores it.
//!
//! The exported directory is a small store: `belayer/checkpoints/<namespace>/<container>/<seq>/`
//! for every checkpoint of the chain.
//!
//! To restore from a checkpoint image, containerd unpacks it into a fresh `ctrd-checkpoint*`
//! directory under its temporary directory and never removes it (runc's restores leave theirs
//! too). The import moves the chain out of such a directory instead of copying it, and removes
//! what is left: otherwise every restore through containerd leaves a copy of the whole chain
//! behind, memory pages included. A directory the caller named is only read.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::protos::protobuf::Message;
use containerd_shim::protos::shim::oci::CheckpointOptions;

use crate::api::RestoreOptions;
use crate::error::{Error, Result, io};
use crate::task::Inner;

const EXPORT_DIR: &str = "belayer";

/// `cp -a` through the reaper (hardlinks, xattrs, device nodes and sparse files kept).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    use criu_bridge::runc::Spawner;
    let mut cmd = std::process::Command::new("cp");
    cmd.arg("-a").arg("--sparse=always").arg(from).arg(to);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = crate::reaper::ReaperSpawner
        .output(cmd)
        .map_err(io("run cp"))?;
    if !out.status.success() {
        return Err(Error::Checkpoint(format!(
            "copy {} to {}: {}",
            from.display(),
            to.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether `path` is the directory containerd unpacked a checkpoint image into for this create:
/// `ctrd-checkpoint*` directly under `$XDG_RUNTIME_DIR`, or the temporary directory without it
/// (containerd's `os.MkdirTemp(os.Getenv("XDG_RUNTIME_DIR"), "ctrd-checkpoint")`; the shim runs
/// in containerd's environment).
fn unpacked_by_containerd(path: &Path) -> bool {
    let tmp = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(std::env::temp_dir, PathBuf::from);
    path.parent() == Some(tmp.as_path())
        && path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("ctrd-checkpoint"))
}

/// Puts checkpoint directory `from` at `to`: a rename when `from` may be taken (falling back to
/// a copy across filesystems), else a copy.
fn take_or_copy(from: &Path, to: &Path, take: bool) -> Result<()> {
    if take {
        match std::fs::rename(from, to) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
            Err(e) => {
                return Err(Error::Checkpoint(format!(
                    "move {} to {}: {e}",
                    from.display(),
                    to.display()
                )));
            }
        }
    }
    copy_tree(from, to)
}

impl Inner {
    /// containerd's `Task.Checkpoint`: a Belayer checkpoint, exported to `path` (or the
    /// options' image path).
    pub async fn checkpoint_for_containerd(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        options: Option<&[u8]>,
    ) -> Result<()> {
        let opts = match options {
            Some(bytes) => CheckpointOptions::parse_from_bytes(bytes)
                .map_err(|e| Error::InvalidArgument(format!("checkpoint options: {e}")))?,
            None => CheckpointOptions::default(),
        };
        let dest = PathBuf::from(if opts.image_path.is_empty() {
            path
        } else {
            opts.image_path.as_str()
        });
        if dest.as_os_str().is_empty() {
            return Err(Error::InvalidArgument("checkpoint: no image path".into()));
        }
        let info = self.checkpoint(id, opts.exit).await?;
        let store = self.store();
        let ns = self.namespace.clone();
        let cid = id.to_string();
        let seq: u64 = info.id.parse().unwrap_or_default();
        tokio::task::spawn_blocking(move || -> Result<()> {
            let cp = store.load(&ns, &cid, seq)?;
            let target = dest
                .join(EXPORT_DIR)
                .join("checkpoints")
                .join(&ns)
                .join(&cid);
            std::fs::create_dir_all(&target).map_err(io(format!("create {}", target.display())))?;
            for member in &cp.manifest.fs_chain {
                let from = store.load(&ns, &cid, *member)?.dir;
                copy_tree(&from, &target.join(member.to_string()))?;
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::Checkpoint(e.to_string()))?
    }

    /// For a task created from a containerd checkpoint directory: imports the exported chain into
    /// this node's store (unless already there) and names the checkpoint to restore.
    pub async fn import_checkpoint(&self, path: &str) -> Result<RestoreOptions> {
        let root = Path::new(path).join(EXPORT_DIR);
        let store = self.store();
        let root2 = root.clone();
        let take = unpacked_by_containerd(Path::new(path));
        let path = path.to_string();
        tokio::task::spawn_blocking(move || -> Result<RestoreOptions> {
            let mut found = None;
            let nss = std::fs::read_dir(root2.join("checkpoints")).map_err(|_| {
                Error::InvalidArgument(format!("{path} holds no Belayer checkpoint"))
            })?;
            for ns in nss.flatten() {
                for c in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
                    let (nsn, cn) = (
                        ns.file_name().to_string_lossy().into_owned(),
                        c.file_name().to_string_lossy().into_owned(),
                    );
                    let exported = criu_bridge::Store::new(&root2);
                    let seqs = exported.list(&nsn, &cn)?;
                    let Some(&newest) = seqs.last() else { continue };
                    let own = store.root().join("checkpoints").join(&nsn).join(&cn);
                    std::fs::create_dir_all(&own)
                        .map_err(io(format!("create {}", own.display())))?;
                    for seq in seqs {
                        if !own.join(seq.to_string()).exists() {
                            take_or_copy(
                                &exported.load(&nsn, &cn, seq)?.dir,
                                &own.join(seq.to_string()),
                                take,
                            )?;
                        }
                    }
                    found = Some(RestoreOptions {
                        namespace: nsn,
                        container: cn,
                        checkpoint: newest,
                    });
                }
            }
            let found = found.ok_or_else(|| {
                Error::InvalidArgument(format!("{path} holds no Belayer checkpoint"))
            })?;
            if take && let Err(e) = std::fs::remove_dir_all(&path) {
                log::warn!("remove {path}, containerd's unpacked checkpoint: {e}");
            }
            Ok(found)
        })
        .await
        .map_err(|e| Error::Checkpoint(e.to_string()))?
    }
}
