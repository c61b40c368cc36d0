//! Compacting a checkpoint's fs chain into its own single layer, so older checkpoints can be
//! deleted and overlay's lower-dir limits are never reached; exporting a self-contained copy.

use std::fs;
use std::path::{Path, PathBuf};

use super::files::record;
use super::manifest::{FS_DIR, MANIFEST_FILE, Manifest};
use super::{Checkpoint, RemoveOnDrop, Store, StoreError, TMP_PREFIX, mkdir_private};
use crate::layer::{CompactError, compact_layers};

/// Why compacting a checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum CompactCheckpointError {
    /// Loading, locking or writing in the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The checkpoint, or a layer of its chain, no longer matches its manifest: a copy would
    /// record the damage as its truth (its CRIU images are linked, its layers merged, and the
    /// result hashed afresh), so nothing is written and the checkpoint stays as it is.
    #[error("checkpoint {seq} does not verify")]
    Corrupt {
        /// The checkpoint.
        seq: u64,
        /// What differs.
        #[source]
        source: super::VerifyError,
    },
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
    /// becomes `[seq]`), together with any layers of this store it has among its image lowers
    /// (a fork's). The old dir is swapped out atomically (`RENAME_EXCHANGE`).
    ///
    /// Refused while another checkpoint stacks on `seq`'s layer (a later one of the chain,
    /// [`StoreError::InChain`], or a fork's, [`StoreError::UsedAsLower`]): the merged layer
    /// keeps only the whiteouts that hide something in the image, so the layers below it in
    /// such a checkpoint's stack would show files `seq`'s chain had deleted. Compact the
    /// newest first.
    pub fn compact(
        &self,
        namespace: &str,
        container: &str,
        seq: u64,
    ) -> Result<Checkpoint, CompactCheckpointError> {
        let _lock = self.lock(namespace, container)?;
        let cp = self.load(namespace, container, seq)?;
        let borrows = cp
            .manifest
            .image_lowers
            .iter()
            .any(|l| self.is_store_layer(l));
        if cp.manifest.fs_chain.len() <= 1 && !borrows {
            return Ok(cp);
        }
        let dir = self.container_dir(namespace, container)?;
        // Refused before the merge, too, when refused at all: a running rootfs or a checkpoint
        // stacks on it.
        self.unless_leased(&dir, seq, || self.refuse_if_stacked_on(&cp))?;
        let tmp = cp.dir.with_file_name(format!("{TMP_PREFIX}compact-{seq}"));
        let guard = RemoveOnDrop(tmp.clone());
        let manifest = self.write_standalone(&cp, &tmp)?;
        // Stamped before the swap makes it visible (a write after it would go unnoticed).
        let keys = super::verify::stamp_keys(&tmp);
        super::verify::write_stamp(&tmp, &cp.dir, &keys);
        self.unless_leased(&dir, seq, || {
            crate::sys::rename_exchange(&tmp, &cp.dir)
                .map_err(|e| StoreError::io("swap", &cp.dir, e))
        })?;
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

    /// Writes a self-contained copy of checkpoint `seq` (CRIU images plus its fs chain merged
    /// into one layer) to the new dir `dest`, e.g. for containerd's `Task.Checkpoint` path or a
    /// registry push. Open it with [`Checkpoint::open`]; it restores without this store.
    pub fn export(
        &self,
        namespace: &str,
        container: &str,
        seq: u64,
        dest: &Path,
    ) -> Result<Checkpoint, CompactCheckpointError> {
        let cp = self.load(namespace, container, seq)?;
        // Retention, a delete or a compaction must not take a chain member while it is read.
        let _lease = self.lease(&cp, (namespace, container))?;
        if dest.exists() {
            return Err(
                StoreError::io("create", dest, std::io::ErrorKind::AlreadyExists.into()).into(),
            );
        }
        let name = dest
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dest.with_file_name(format!("{TMP_PREFIX}{name}"));
        let guard = RemoveOnDrop(tmp.clone());
        let manifest = self.write_standalone(&cp, &tmp)?;
        fs::rename(&tmp, dest).map_err(|e| StoreError::io("rename", dest, e))?;
        drop(guard);
        if let Some(parent) = dest.parent() {
            crate::sys::fsync_dir(parent).map_err(|e| StoreError::io("fsync", parent, e))?;
        }
        Ok(Checkpoint {
            dir: dest.to_path_buf(),
            manifest,
        })
    }

    /// Is `dir` the fs layer of a checkpoint in this store?
    fn is_store_layer(&self, dir: &Path) -> bool {
        dir.starts_with(self.root().join("checkpoints"))
            && dir.file_name().is_some_and(|n| n == FS_DIR)
    }

    /// Writes `cp` with its chain merged into the new dir `out` (files other than the layer are
    /// hardlinked, or copied across filesystems) and returns the new manifest.
    fn write_standalone(
        &self,
        cp: &Checkpoint,
        out: &Path,
    ) -> Result<Manifest, CompactCheckpointError> {
        let m = &cp.manifest;
        // What is copied must be what was checkpointed: the new manifest's hashes are taken
        // from the copy (found by the chaos soak: a byte flipped in a CRIU image, then a
        // compaction, and the restore of the damaged checkpoint verified).
        super::verify_checkpoint(self, cp, super::VerifyLevel::Stamped)
            .map_err(|source| CompactCheckpointError::Corrupt { seq: m.seq, source })?;
        // Layers of this store among the image lowers (a fork stacks on the chain it was forked
        // from) are folded in too, so the result depends on no other checkpoint.
        let (borrowed, image_lowers): (Vec<PathBuf>, Vec<PathBuf>) = m
            .image_lowers
            .iter()
            .cloned()
            .partition(|l| self.is_store_layer(l));
        let mut layers: Vec<PathBuf> = borrowed.into_iter().rev().collect();
        for &s in m.fs_chain.iter().rev() {
            layers.push(if s == m.seq {
                cp.fs_dir()
            } else {
                self.load(&m.namespace, &m.container, s)?.fs_dir()
            });
        }
        let _ = fs::remove_dir_all(out);
        mkdir_private(out)?;
        for entry in record(&cp.dir, false).map_err(|(p, e)| StoreError::io("read", &p, e))? {
            let top = entry.path.split('/').next().unwrap_or_default();
            if top == FS_DIR || entry.path == MANIFEST_FILE {
                continue;
            }
            let src = cp.dir.join(crate::layer::decode_path(&entry.path));
            let dst = out.join(crate::layer::decode_path(&entry.path));
            let r = match entry.kind {
                'd' => fs::create_dir(&dst),
                _ => fs::hard_link(&src, &dst).or_else(|_| fs::copy(&src, &dst).map(drop)),
            };
            r.map_err(|e| StoreError::io("link", &dst, e))?;
        }
        compact_layers(&layers, &image_lowers, &out.join(FS_DIR))
            .map_err(|source| CompactCheckpointError::Merge { seq: m.seq, source })?;
        let mut manifest = m.clone();
        manifest.fs_chain = vec![m.seq];
        manifest.image_lowers = image_lowers;
        let files = record(out, true).map_err(|(p, e)| StoreError::io("record", &p, e))?;
        manifest.sizes.fs_bytes = files
            .iter()
            .filter(|f| f.path.starts_with("fs/"))
            .map(|f| f.size)
            .sum();
        manifest.sizes.total_bytes = files.iter().map(|f| f.size).sum();
        manifest.sizes.files = files.len() as u64;
        manifest.files = files;
        let mpath = out.join(MANIFEST_FILE);
        super::write_private(&mpath, &manifest.to_bytes())?;
        crate::sys::fsync_dir(out).map_err(|e| StoreError::io("fsync", out, e))?;
        Ok(manifest)
    }
}
