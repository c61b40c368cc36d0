//! Compacting a checkpoint's fs chain into its own single layer, so older checkpoints can be
//! deleted and overlay's lower-dir limits are never reached.

use std::fs;
use std::path::PathBuf;

use super::files::record;
use super::manifest::{FS_DIR, MANIFEST_FILE};
use super::{Checkpoint, Store, StoreError, TMP_PREFIX, mkdir_private};
use crate::layer::{CompactError, compact_layers};

/// Why compacting a checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum CompactCheckpointError {
    /// Loading, locking or writing in the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Merging the layers failed.
    #[error("cannot merge the fs chain of checkpoint {seq}")]
    Merge {
        /// The checkpoint.
        seq: u64,
        /// The cause.
        #[source]
        source: CompactError,
    },
}

impl Store {
    /// Rewrites checkpoint `seq` so that its `fs/` holds its whole chain merged (its `fs_chain`
    /// becomes `[seq]`). The old dir is swapped out atomically (`RENAME_EXCHANGE`).
    pub fn compact(
        &self,
        namespace: &str,
        container: &str,
        seq: u64,
    ) -> Result<Checkpoint, CompactCheckpointError> {
        let _lock = self.lock(namespace, container)?;
        let cp = self.load(namespace, container, seq)?;
        if cp.manifest.fs_chain.len() <= 1 {
            return Ok(cp);
        }
        let mut layers: Vec<PathBuf> = Vec::new();
        for &s in cp.manifest.fs_chain.iter().rev() {
            layers.push(if s == seq {
                cp.fs_dir()
            } else {
                self.load(namespace, container, s)?.fs_dir()
            });
        }
        let tmp = cp.dir.with_file_name(format!("{TMP_PREFIX}compact-{seq}"));
        let _ = fs::remove_dir_all(&tmp);
        let guard = RemoveOnDrop(tmp.clone());
        mkdir_private(&tmp)?;
        // Everything but the layer and the manifest is shared by hardlink (checkpoints are
        // immutable once written).
        for entry in record(&cp.dir, false).map_err(|(p, e)| StoreError::io("read", &p, e))? {
            let top = entry.path.split('/').next().unwrap_or_default();
            if top == FS_DIR || entry.path == MANIFEST_FILE {
                continue;
            }
            let src = cp.dir.join(crate::layer::decode_path(&entry.path));
            let dst = tmp.join(crate::layer::decode_path(&entry.path));
            let r = if entry.kind == 'd' {
                fs::create_dir(&dst)
            } else {
                fs::hard_link(&src, &dst)
            };
            r.map_err(|e| StoreError::io("link", &dst, e))?;
        }
        compact_layers(&layers, &cp.manifest.image_lowers, &tmp.join(FS_DIR))
            .map_err(|source| CompactCheckpointError::Merge { seq, source })?;
        let mut manifest = cp.manifest.clone();
        manifest.fs_chain = vec![seq];
        let files = record(&tmp, true).map_err(|(p, e)| StoreError::io("record", &p, e))?;
        manifest.sizes.fs_bytes = files
            .iter()
            .filter(|f| f.path.starts_with("fs/"))
            .map(|f| f.size)
            .sum();
        manifest.sizes.total_bytes = files.iter().map(|f| f.size).sum();
        manifest.sizes.files = files.len() as u64;
        manifest.files = files;
        let mpath = tmp.join(MANIFEST_FILE);
        fs::write(&mpath, manifest.to_bytes()).map_err(|e| StoreError::io("write", &mpath, e))?;
        fs::File::open(&mpath)
            .and_then(|f| f.sync_all())
            .map_err(|e| StoreError::io("fsync", &mpath, e))?;
        crate::sys::rename_exchange(&tmp, &cp.dir)
            .map_err(|e| StoreError::io("swap", &cp.dir, e))?;
        if let Some(parent) = cp.dir.parent() {
            crate::sys::fsync_dir(parent).map_err(|e| StoreError::io("fsync", parent, e))?;
        }
        drop(guard); // removes the old dir, now at `tmp`
        tracing::info!(container, seq, "fs chain compacted");
        Ok(Checkpoint {
            dir: cp.dir,
            manifest,
        })
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
