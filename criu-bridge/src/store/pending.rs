//! A checkpoint being written: a private temp dir that becomes `<seq>/` by one rename after
//! everything in it (and the manifest) is fsynced, or disappears when dropped.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::files::record;
use super::manifest::{CRIU_DIR, FS_DIR, INDEX_FILE, MANIFEST_FILE, Manifest, Sizes};
use super::{Checkpoint, StoreError, TMP_PREFIX, mkdir_private, write_private};
use crate::layer::LayerIndex;

/// A checkpoint under construction. Dropping it without [`PendingCheckpoint::commit`] removes
/// everything written so far.
#[derive(Debug)]
pub struct PendingCheckpoint {
    tmp: PathBuf,
    final_dir: PathBuf,
    seq: u64,
    committed: bool,
}

impl PendingCheckpoint {
    pub(crate) fn create(container_dir: &Path, seq: u64) -> Result<Self, StoreError> {
        let tmp = container_dir.join(format!("{TMP_PREFIX}{seq}-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| StoreError::io("remove", &tmp, e))?;
        }
        let p = Self {
            final_dir: container_dir.join(seq.to_string()),
            tmp,
            seq,
            committed: false,
        };
        mkdir_private(&p.tmp)?;
        mkdir_private(&p.criu_dir())?;
        Ok(p)
    }

    /// The sequence number this checkpoint will get.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The temp dir.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Where CRIU writes its images (and dump.log, stats-dump).
    pub fn criu_dir(&self) -> PathBuf {
        self.tmp.join(CRIU_DIR)
    }

    /// Where the fs layer goes (created by the capture).
    pub fn fs_dir(&self) -> PathBuf {
        self.tmp.join(FS_DIR)
    }

    /// Stores the capture index for the next incremental checkpoint.
    pub fn write_index(&self, index: &LayerIndex) -> Result<(), StoreError> {
        let path = self.tmp.join(INDEX_FILE);
        let bytes = serde_json::to_vec(index).expect("an index always serializes");
        write_private(&path, &bytes)
    }

    /// Records every node (sha256, sizes), writes the manifest, fsyncs everything and renames
    /// the temp dir into place. `manifest.files`, `sizes`, `timings.write_us` are filled here
    /// (`timings.total_us` grows by the write time).
    pub fn commit(mut self, mut manifest: Manifest) -> Result<Checkpoint, StoreError> {
        let start = Instant::now();
        let keys = super::verify::stamp_keys(&self.tmp);
        let files =
            record(&self.tmp, true).map_err(|(path, e)| StoreError::io("record", &path, e))?;
        let sum = |prefix: &str| {
            files
                .iter()
                .filter(|f| f.path.starts_with(prefix))
                .map(|f| f.size)
                .sum::<u64>()
        };
        manifest.sizes = Sizes {
            criu_bytes: sum(&format!("{CRIU_DIR}/")),
            fs_bytes: sum(&format!("{FS_DIR}/")),
            total_bytes: files.iter().map(|f| f.size).sum(),
            files: files.len() as u64,
        };
        manifest.files = files;
        manifest.seq = self.seq;
        let write_us = start.elapsed().as_micros() as u64;
        manifest.timings.write_us = write_us;
        manifest.timings.total_us += write_us;
        let path = self.tmp.join(MANIFEST_FILE);
        let write = || -> std::io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            f.write_all(&manifest.to_bytes())?;
            f.sync_all()
        };
        write().map_err(|e| StoreError::io("write", &path, e))?;
        crate::sys::fsync_dir(&self.tmp).map_err(|e| StoreError::io("fsync", &self.tmp, e))?;
        super::verify::write_stamp(&self.tmp, &self.final_dir, &keys);
        if let Err(e) = fs::rename(&self.tmp, &self.final_dir) {
            let _ = fs::remove_file(super::verify::stamp_path(&self.final_dir));
            return Err(StoreError::io("rename", &self.final_dir, e));
        }
        self.committed = true;
        let parent = self.final_dir.parent().unwrap_or(Path::new("/"));
        crate::sys::fsync_dir(parent).map_err(|e| StoreError::io("fsync", parent, e))?;
        tracing::info!(dir = %self.final_dir.display(), bytes = manifest.sizes.total_bytes, "checkpoint written");
        Ok(Checkpoint {
            dir: self.final_dir.clone(),
            manifest,
        })
    }
}

impl Drop for PendingCheckpoint {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}
