//! Verifying a checkpoint before restore: the manifest, then every recorded node (missing,
//! extra, wrong kind, wrong size, wrong sha256), for the checkpoint and its whole fs chain.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::files::record;
use super::manifest::{FileEntry, FormatError};
use super::{Checkpoint, Store};

/// How thoroughly to verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyLevel {
    /// Every node present with its kind and size; contents hashed (sha256).
    Full,
    /// Every node present with its kind and size; no hashing (fast, catches truncation only).
    Sizes,
}

/// Why a checkpoint failed verification.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Its manifest (or a chain member's) is unreadable.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A chain member is missing.
    #[error("checkpoint {seq} of the fs chain of {container} is missing")]
    ChainBroken {
        /// The container.
        container: String,
        /// The missing checkpoint.
        seq: u64,
    },
    /// A recorded node is missing.
    #[error("{file} is missing")]
    Missing {
        /// The missing file.
        file: PathBuf,
    },
    /// A node that is not in the manifest.
    #[error("{file} is not part of the checkpoint")]
    Extra {
        /// The extra file.
        file: PathBuf,
    },
    /// A node of the wrong kind or size.
    #[error(
        "{file} has changed: expected a {expected_kind} of {expected_size} bytes, found a {found_kind} of {found_size} bytes"
    )]
    Changed {
        /// The file.
        file: PathBuf,
        /// Recorded kind.
        expected_kind: char,
        /// Recorded size.
        expected_size: u64,
        /// Kind found.
        found_kind: char,
        /// Size found.
        found_size: u64,
    },
    /// A file whose content does not match its sha256.
    #[error("{file} is corrupt: sha256 {found}, recorded {expected}")]
    Corrupt {
        /// The file.
        file: PathBuf,
        /// Recorded digest.
        expected: String,
        /// Digest found.
        found: String,
    },
    /// A node could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The image lower dirs are gone.
    #[error("image lower dir {0} is missing")]
    MissingImageLower(PathBuf),
}

/// Verifies one checkpoint dir against its manifest.
pub fn verify_dir(cp: &Checkpoint, level: VerifyLevel) -> Result<(), VerifyError> {
    verify_part(cp, level, "")
}

/// Verifies the nodes of `cp` whose path starts with `prefix` ("" for all).
fn verify_part(cp: &Checkpoint, level: VerifyLevel, prefix: &str) -> Result<(), VerifyError> {
    let found = if level == VerifyLevel::Full {
        record(&cp.dir, false).map_err(|(path, source)| VerifyError::Read { path, source })?
    } else {
        record_sizes(cp)?
    };
    let found: BTreeMap<&str, &FileEntry> = found
        .iter()
        .filter(|e| e.path.starts_with(prefix))
        .map(|e| (e.path.as_str(), e))
        .collect();
    let wanted: Vec<&FileEntry> = cp
        .manifest
        .files
        .iter()
        .filter(|e| e.path.starts_with(prefix))
        .collect();
    let file = |p: &str| cp.dir.join(crate::layer::decode_path(p));
    for want in &wanted {
        let Some(got) = found.get(want.path.as_str()) else {
            return Err(VerifyError::Missing {
                file: file(&want.path),
            });
        };
        if got.kind != want.kind || got.size != want.size {
            return Err(VerifyError::Changed {
                file: file(&want.path),
                expected_kind: want.kind,
                expected_size: want.size,
                found_kind: got.kind,
                found_size: got.size,
            });
        }
        if level == VerifyLevel::Full && got.sha256 != want.sha256 {
            return Err(VerifyError::Corrupt {
                file: file(&want.path),
                expected: want.sha256.clone().unwrap_or_default(),
                found: got.sha256.clone().unwrap_or_default(),
            });
        }
    }
    if found.len() != wanted.len() {
        let known: std::collections::HashSet<&str> =
            wanted.iter().map(|e| e.path.as_str()).collect();
        if let Some(extra) = found.keys().find(|p| !known.contains(*p)) {
            return Err(VerifyError::Extra { file: file(extra) });
        }
    }
    Ok(())
}

fn record_sizes(cp: &Checkpoint) -> Result<Vec<FileEntry>, VerifyError> {
    // Same walk without hashing: stat every recorded path and look for extras.
    let mut all = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = cp.dir.join(&rel);
        let rd = std::fs::read_dir(&dir).map_err(|source| VerifyError::Read {
            path: dir.clone(),
            source,
        })?;
        for e in rd {
            let e = e.map_err(|source| VerifyError::Read {
                path: dir.clone(),
                source,
            })?;
            let child = rel.join(e.file_name());
            if rel.as_os_str().is_empty() && e.file_name() == super::manifest::MANIFEST_FILE {
                continue;
            }
            let m = std::fs::symlink_metadata(cp.dir.join(&child)).map_err(|source| {
                VerifyError::Read {
                    path: cp.dir.join(&child),
                    source,
                }
            })?;
            let kind = kind_of(&m);
            all.push(FileEntry {
                path: crate::layer::encode_path(&child),
                kind,
                size: if kind == 'f' { m.len() } else { 0 },
                sha256: None,
            });
            if kind == 'd' {
                stack.push(child);
            }
        }
    }
    Ok(all)
}

fn kind_of(m: &std::fs::Metadata) -> char {
    use std::os::unix::fs::FileTypeExt;
    let ft = m.file_type();
    match () {
        _ if ft.is_file() => 'f',
        _ if ft.is_dir() => 'd',
        _ if ft.is_symlink() => 'l',
        _ if ft.is_char_device() => 'c',
        _ if ft.is_block_device() => 'b',
        _ if ft.is_fifo() => 'p',
        _ => 's',
    }
}

/// Verifies a checkpoint and every checkpoint of its fs chain, and that the image lowers exist.
pub fn verify_checkpoint(
    store: &Store,
    cp: &Checkpoint,
    level: VerifyLevel,
) -> Result<(), VerifyError> {
    verify_dir(cp, level)?;
    let m = &cp.manifest;
    for &seq in m.fs_chain.iter().filter(|s| **s != m.seq) {
        let member = store
            .load(&m.namespace, &m.container, seq)
            .map_err(|e| match e {
                super::StoreError::Format(f) => VerifyError::Format(f),
                _ => VerifyError::ChainBroken {
                    container: m.container.clone(),
                    seq,
                },
            })?;
        // Only the layer of a chain member is needed to restore this checkpoint.
        verify_part(&member, level, super::manifest::FS_DIR)?;
    }
    for l in &m.image_lowers {
        if !l.is_dir() {
            return Err(VerifyError::MissingImageLower(l.clone()));
        }
    }
    Ok(())
}
