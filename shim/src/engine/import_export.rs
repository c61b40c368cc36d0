//! containerd's own checkpoint path as the engine serves it: `Task.Checkpoint` takes a Belayer
//! checkpoint and exports it to the directory containerd names; a task created from such a
//! directory imports it (the format and its checks: [`crate::export`]).

use std::path::PathBuf;
use std::sync::Arc;

use containerd_shim::protos::protobuf::Message;
use containerd_shim::protos::shim::oci::CheckpointOptions;

use super::Engine;
use crate::error::{Error, Result, task};
use crate::export::{Imported, Owner, Placing, export, import, placing_for};

impl Engine {
    /// containerd's `Task.Checkpoint`: a Belayer checkpoint, exported to `path` (or the
    /// options' image path).
    pub async fn checkpoint_for_containerd(
        self: &Arc<Self>,
        id: &str,
        path: &str,
        options: Option<&[u8]>,
    ) -> Result<()> {
        let opts = match options {
            Some(bytes) => {
                CheckpointOptions::parse_from_bytes(bytes).map_err(Error::CheckpointOptions)?
            }
            None => CheckpointOptions::default(),
        };
        let how = if opts.image_path.is_empty() {
            Placing::Link
        } else {
            Placing::Copy
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
        let seq: u64 = info.id.parse().unwrap_or_default();
        self.export_to(id, seq, dest, how).await
    }

    /// Writes checkpoint `seq` of container `id` (with its chain) to `dest` as an export, off
    /// the runtime's threads; `dest`'s parent must exist.
    pub(super) async fn export_to(
        &self,
        id: &str,
        seq: u64,
        dest: PathBuf,
        how: Placing,
    ) -> Result<()> {
        let store = self.store();
        let ns = self.namespace.clone();
        let cid = id.to_string();
        tokio::task::spawn_blocking(move || {
            export(
                &store,
                &ns,
                &cid,
                seq,
                &dest,
                how,
                &crate::reaper::ReaperSpawner,
            )
        })
        .await
        .map_err(task("export"))?
    }

    /// For task `id` created from a containerd checkpoint directory on the image snapshot whose
    /// lower dirs are `image_lowers`: imports the exported chain into this node's store as
    /// `id`'s (unless already there) and names the checkpoint to restore; runc's images stay
    /// where they are, for the start.
    pub(super) async fn import_checkpoint(
        &self,
        path: &str,
        id: &str,
        image_lowers: Option<Vec<PathBuf>>,
    ) -> Result<Imported> {
        let store = self.store();
        let path = PathBuf::from(path);
        let owner = Owner {
            namespace: self.namespace.clone(),
            container: id.to_string(),
            image_lowers,
            limits: self.settings.import.clone(),
        };
        tokio::task::spawn_blocking(move || {
            let how = placing_for(&path, store.root());
            let found = import(&store, &path, how, &crate::reaper::ReaperSpawner, &owner)?;
            if how == Placing::Take
                && matches!(found, Imported::Belayer(_))
                && let Err(e) = std::fs::remove_dir_all(&path)
            {
                log::warn!(
                    "remove {}, containerd's unpacked checkpoint: {e}",
                    path.display()
                );
            }
            Ok(found)
        })
        .await
        .map_err(task("import"))?
    }
}
