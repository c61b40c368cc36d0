//! Claiming an imported chain: the one container's checkpoints that an archive unpacked into a
//! staging store holds become checkpoints of the container importing them, whatever namespace,
//! container and image lower dirs the archive's manifests name. Nothing is created, moved or
//! mounted by a name the archive gives before it is checked here.

use std::fs;
use std::path::{Path, PathBuf};

use super::confine::{MAX_SEQ, check_beneath};
use super::manifest::{MANIFEST_FILE, Manifest};
use super::{Checkpoint, Store, StoreError, check_name, mkdir_private, write_private};

impl Store {
    /// Makes the one chain unpacked into this (staging) store the chain of
    /// `namespace/container`, stacked on `image_lowers` (the image snapshot of the container
    /// being created, newest first). Refused, before anything moves: another number of chains
    /// than one, a symlink where a dir of the store layout belongs, an entry that is not a
    /// checkpoint named by an id below [`MAX_SEQ`], a manifest whose paths leave its dir, CRIU
    /// images that are not regular files (a symlink would feed a host file to CRIU as a memory
    /// image, or take the images copied in), a chain member the archive lacks, another number of
    /// image lower dirs than the snapshot's.
    /// Then the chain moves to its new name and every manifest is rewritten with the owner and
    /// image lower dirs given.
    pub fn claim(
        &self,
        namespace: &str,
        container: &str,
        image_lowers: &[PathBuf],
    ) -> Result<Vec<u64>, StoreError> {
        check_name("namespace", namespace)?;
        check_name("container id", container)?;
        let (from_ns, from_c) = self.the_one_chain()?;
        let from_rel = format!("checkpoints/{from_ns}/{from_c}");
        check_beneath(self.root(), "container dir", &from_rel)?;
        let from = self.root().join(&from_rel);
        let seqs = checkpoint_ids(&from)?;
        for &seq in &seqs {
            let rel = format!("{from_rel}/{seq}/{MANIFEST_FILE}");
            check_beneath(self.root(), "manifest", &rel)?;
            let dir = from.join(seq.to_string());
            let cp = Checkpoint::open(&dir)?;
            only_files(&cp.criu_dir())?;
            let m = &cp.manifest;
            if m.seq != seq {
                return Err(StoreError::Mismatch {
                    dir,
                    expected: seq.to_string(),
                    found: m.seq.to_string(),
                });
            }
            if let Some(&member) = m.fs_chain.iter().find(|s| !seqs.contains(s)) {
                return Err(StoreError::ChainOutside { seq, member });
            }
            if m.image_lowers.len() != image_lowers.len() {
                return Err(StoreError::ImageLowers {
                    seq,
                    found: m.image_lowers.len(),
                    expected: image_lowers.len(),
                });
            }
        }
        let to = self.container_dir(namespace, container)?;
        if to != from {
            mkdir_private(to.parent().unwrap_or(self.root()))?;
            fs::rename(&from, &to).map_err(|e| StoreError::io("move", &from, e))?;
        }
        for &seq in &seqs {
            let path = to.join(seq.to_string()).join(MANIFEST_FILE);
            let mut m = Manifest::read(&path)?;
            m.namespace = namespace.into();
            m.container = container.into();
            m.image_lowers = image_lowers.to_vec();
            write_private(&path, &m.to_bytes())?;
        }
        tracing::info!(
            from = %format!("{from_ns}/{from_c}"),
            to = %format!("{namespace}/{container}"),
            checkpoints = seqs.len(),
            "imported chain claimed"
        );
        Ok(seqs)
    }

    /// `(namespace, container)` of the one chain under `checkpoints/`.
    fn the_one_chain(&self) -> Result<(String, String), StoreError> {
        let top = self.root().join("checkpoints");
        let names = |dir: &Path| -> Result<Vec<String>, StoreError> {
            let rd = match fs::read_dir(dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                r => r.map_err(|e| StoreError::io("read", dir, e))?,
            };
            rd.map(|e| {
                e.map(|e| e.file_name().to_string_lossy().into_owned())
                    .map_err(|e| StoreError::io("read", dir, e))
            })
            .collect()
        };
        check_beneath(self.root(), "checkpoints dir", "checkpoints")?;
        let mut chains = Vec::new();
        for ns in names(&top)? {
            check_beneath(self.root(), "namespace dir", &format!("checkpoints/{ns}"))?;
            for c in names(&top.join(&ns))? {
                chains.push((ns.clone(), c));
            }
        }
        match <[_; 1]>::try_from(chains) {
            Ok([one]) => Ok(one),
            Err(chains) => Err(StoreError::NotOneChain {
                dir: self.root().into(),
                found: chains.len(),
            }),
        }
    }
}

/// Refuses anything but regular files in the CRIU image dir `dir` (absent is fine: an export
/// keeps its newest checkpoint's images beside the archive).
fn only_files(dir: &Path) -> Result<(), StoreError> {
    let rd = match fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        r => r.map_err(|e| StoreError::io("read", dir, e))?,
    };
    for e in rd {
        let e = e.map_err(|e| StoreError::io("read", dir, e))?;
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            return Err(StoreError::Unconfined {
                base: dir.into(),
                what: "CRIU image",
                path: e.file_name().to_string_lossy().into_owned(),
                why: "is not a regular file",
            });
        }
    }
    Ok(())
}

/// The checkpoint ids of the container dir `dir`, every entry a real dir named by an id in
/// `1..MAX_SEQ`. A store's own bookkeeping (`.lock`, `.leases`, verification stamps) is never
/// taken from an archive: such entries are removed.
fn checkpoint_ids(dir: &Path) -> Result<Vec<u64>, StoreError> {
    let mut seqs = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| StoreError::io("read", dir, e))? {
        let e = e.map_err(|e| StoreError::io("read", dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            let path = e.path();
            let removed = match e.file_type() {
                Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
                _ => fs::remove_file(&path),
            };
            removed.map_err(|e| StoreError::io("remove", &path, e))?;
            continue;
        }
        let seq = name
            .parse::<u64>()
            .ok()
            .filter(|s| (1..MAX_SEQ).contains(s) && name == s.to_string());
        match seq {
            Some(seq) if e.file_type().is_ok_and(|t| t.is_dir()) => seqs.push(seq),
            _ => {
                return Err(StoreError::BadCheckpointName {
                    dir: dir.into(),
                    name,
                });
            }
        }
    }
    seqs.sort_unstable();
    Ok(seqs)
}
