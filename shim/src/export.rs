//! containerd's own checkpoint path: `Task.Checkpoint` writes a self-contained Belayer checkpoint
//! (processes and filesystem, the whole layer chain) into the directory containerd names, and a
//! task created with `checkpoint` set imports such a directory and restores it.
//!
//! The export is flat, regular files only, because Kubernetes' checkpoint (CRI
//! `CheckpointContainer`) unpacks containerd's checkpoint blob into one directory and creates
//! every entry as a file:
//! - the CRIU images of the checkpoint, as runc leaves them (what `checkpointctl` reads);
//! - [`CHAIN_ARCHIVE`]: the rest of the chain as a store (`checkpoints/<namespace>/<container>/
//!   <seq>/`, every member but the newest one's CRIU images), a tar that keeps owners, modes,
//!   xattrs (overlay's `trusted.*` too), whiteouts, hardlinks and sparse files.
//!
//! To restore from a checkpoint image, containerd unpacks it into a fresh `ctrd-checkpoint*`
//! directory under its temporary directory and never removes it (runc's restores leave theirs
//! too). The import moves the images out of such a directory instead of copying them, and
//! removes what is left: otherwise every restore through containerd leaves a copy of the
//! checkpoint behind, memory pages included. A directory the caller named (CRI's unpacked
//! archive among them) is only read: its files are hardlinked into the store where they can be
//! (the store verifies every file against the manifest before a restore uses it).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use containerd_shim::protos::protobuf::Message;
use containerd_shim::protos::shim::oci::CheckpointOptions;

use crate::api::RestoreOptions;
use crate::error::{Error, Result, io};
use crate::task::Inner;

/// The archive of the chain in an export.
pub const CHAIN_ARCHIVE: &str = "belayer-chain.tar";

/// GNU tar's options for a store tree, on both ends: every xattr namespace (overlay's opaque
/// dirs and redirects are `trusted.*`), numeric owners, holes kept.
const TAR_OPTIONS: [&str; 4] = [
    "--xattrs",
    "--xattrs-include=*",
    "--numeric-owner",
    "--sparse",
];

/// Runs `cmd` through the reaper; `what` names it in the error.
fn run(what: &str, mut cmd: Command) -> Result<()> {
    use criu_bridge::runc::Spawner;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = crate::reaper::ReaperSpawner
        .output(cmd)
        .map_err(io(format!("run {what}")))?;
    if !out.status.success() {
        return Err(Error::Checkpoint(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Whether `path` is a directory containerd made for this create and removes never or itself:
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

/// Puts file `from` at `to`: a rename when `from` may be taken, else a hardlink; a copy where
/// neither works (another filesystem).
fn place_file(from: &Path, to: &Path, take: bool) -> Result<()> {
    let linked = if take {
        std::fs::rename(from, to)
    } else {
        std::fs::hard_link(from, to)
    };
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => std::fs::copy(from, to)
            .map(drop)
            .map_err(io(format!("copy {} to {}", from.display(), to.display()))),
        Err(e) => Err(Error::Checkpoint(format!(
            "{} {} to {}: {e}",
            if take { "move" } else { "link" },
            from.display(),
            to.display()
        ))),
    }
}

/// The regular files directly in `dir`, but [`CHAIN_ARCHIVE`]; anything else is an error, for
/// an export holds nothing else.
fn flat_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(format!("read {}", dir.display())))? {
        let e = e.map_err(io(format!("read {}", dir.display())))?;
        if e.file_name() == CHAIN_ARCHIVE {
            continue;
        }
        let kind = e
            .file_type()
            .map_err(io(format!("stat {}", e.path().display())))?;
        if !kind.is_file() {
            return Err(Error::InvalidArgument(format!(
                "{} is not a regular file: a Belayer export holds only files",
                e.path().display()
            )));
        }
        files.push(e.path());
    }
    Ok(files)
}

/// Writes checkpoint `seq` of `namespace/container` in `store`, with its whole chain, to `dest`
/// as a flat export (module doc).
fn export(
    store: &criu_bridge::Store,
    namespace: &str,
    container: &str,
    seq: u64,
    dest: &Path,
) -> Result<()> {
    let cp = store.load(namespace, container, seq)?;
    std::fs::create_dir_all(dest).map_err(io(format!("create {}", dest.display())))?;
    let criu = cp.criu_dir();
    for file in flat_files(&criu)? {
        let name = file.file_name().unwrap_or_default();
        place_file(&file, &dest.join(name), false)?;
    }
    let relative = |p: &Path| p.strip_prefix(store.root()).map(Path::to_path_buf);
    let skip = relative(&criu)
        .map_err(|_| Error::Checkpoint(format!("{} is outside the store", criu.display())))?;
    let mut tar = Command::new("tar");
    tar.arg("--create")
        .arg("--format=posix")
        .args(TAR_OPTIONS)
        .arg("--file")
        .arg(dest.join(CHAIN_ARCHIVE))
        .arg("--directory")
        .arg(store.root())
        .arg("--anchored")
        .arg(format!("--exclude={}", skip.display()));
    for member in &cp.manifest.fs_chain {
        let dir = store.load(namespace, container, *member)?.dir;
        tar.arg(
            relative(&dir).map_err(|_| {
                Error::Checkpoint(format!("{} is outside the store", dir.display()))
            })?,
        );
    }
    run(&format!("archive the chain into {}", dest.display()), tar)
}

/// Removes the directory on drop.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Imports the export at `path` (module doc) into `store`, unless its checkpoints are there
/// already, and names its newest checkpoint. `take`: the export's files may be moved.
fn import(store: &criu_bridge::Store, path: &Path, take: bool) -> Result<RestoreOptions> {
    let archive = path.join(CHAIN_ARCHIVE);
    if !archive.is_file() {
        return Err(Error::InvalidArgument(format!(
            "{} holds no Belayer checkpoint (no {CHAIN_ARCHIVE})",
            path.display()
        )));
    }
    let images = flat_files(path)?;
    // Unpacked beside the store's checkpoints, so that they move into place by rename.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let staging = store
        .root()
        .join(format!(".tmp-import-{}-{stamp}", std::process::id()));
    std::fs::create_dir_all(&staging).map_err(io(format!("create {}", staging.display())))?;
    let _remove = RemoveOnDrop(staging.clone());
    let mut tar = Command::new("tar");
    tar.arg("--extract")
        .args(TAR_OPTIONS)
        .arg("--same-owner")
        .arg("--preserve-permissions")
        .arg("--file")
        .arg(&archive)
        .arg("--directory")
        .arg(&staging);
    run(&format!("unpack {}", archive.display()), tar)?;

    let mut chains = Vec::new();
    let top = staging.join("checkpoints");
    for ns in std::fs::read_dir(&top).into_iter().flatten().flatten() {
        for c in std::fs::read_dir(ns.path()).into_iter().flatten().flatten() {
            chains.push((
                ns.file_name().to_string_lossy().into_owned(),
                c.file_name().to_string_lossy().into_owned(),
            ));
        }
    }
    let [(namespace, container)] = &chains[..] else {
        return Err(Error::InvalidArgument(format!(
            "{} holds {} checkpoint chains, not one",
            archive.display(),
            chains.len()
        )));
    };
    let exported = criu_bridge::Store::new(&staging);
    let seqs = exported.list(namespace, container)?;
    let Some(&newest) = seqs.last() else {
        return Err(Error::InvalidArgument(format!(
            "{} holds no checkpoint of {namespace}/{container}",
            archive.display()
        )));
    };
    let criu = exported.load(namespace, container, newest)?.criu_dir();
    std::fs::create_dir_all(&criu).map_err(io(format!("create {}", criu.display())))?;
    for image in &images {
        place_file(
            image,
            &criu.join(image.file_name().unwrap_or_default()),
            take,
        )?;
    }
    let own = store.container_dir(namespace, container)?;
    std::fs::create_dir_all(&own).map_err(io(format!("create {}", own.display())))?;
    for seq in seqs {
        let to = own.join(seq.to_string());
        let theirs = exported.load(namespace, container, seq)?;
        if let Ok(ours) = store.load(namespace, container, seq) {
            // The same checkpoint (exported from this store), or another node's checkpoint of a
            // container of the same name: never restore ours in place of theirs.
            if ours.manifest.created_unix_ms != theirs.manifest.created_unix_ms {
                return Err(Error::FailedPrecondition(format!(
                    "checkpoint {seq} of {namespace}/{container} in {} is not the one in this \
                     node's store (taken at {} ms, not {} ms since the epoch); remove it \
                     (belayer rm) or import elsewhere",
                    archive.display(),
                    theirs.manifest.created_unix_ms,
                    ours.manifest.created_unix_ms,
                )));
            }
        } else {
            let from = theirs.dir;
            // Another import of the same chain may have put it there first.
            if let Err(e) = std::fs::rename(&from, &to)
                && !to.join(criu_bridge::store::MANIFEST_FILE).is_file()
            {
                return Err(Error::Checkpoint(format!(
                    "move {} to {}: {e}",
                    from.display(),
                    to.display()
                )));
            }
        }
    }
    Ok(RestoreOptions {
        namespace: namespace.clone(),
        container: container.clone(),
        checkpoint: newest,
    })
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
        tokio::task::spawn_blocking(move || export(&store, &ns, &cid, seq, &dest))
            .await
            .map_err(|e| Error::Checkpoint(e.to_string()))?
    }

    /// For a task created from a containerd checkpoint directory: imports the exported chain into
    /// this node's store (unless already there) and names the checkpoint to restore.
    pub async fn import_checkpoint(&self, path: &str) -> Result<RestoreOptions> {
        let store = self.store();
        let path = PathBuf::from(path);
        tokio::task::spawn_blocking(move || {
            let take = unpacked_by_containerd(&path);
            let found = import(&store, &path, take)?;
            if take && let Err(e) = std::fs::remove_dir_all(&path) {
                log::warn!(
                    "remove {}, containerd's unpacked checkpoint: {e}",
                    path.display()
                );
            }
            Ok(found)
        })
        .await
        .map_err(|e| Error::Checkpoint(e.to_string()))?
    }
}
