//! Verifying a checkpoint before restore: the manifest, then every recorded node (missing,
//! extra, wrong kind, wrong size, wrong sha256), for the checkpoint and its whole fs chain.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    /// Every node present with its kind and size; a file is hashed unless its inode, ctime and
    /// size equal those stamped when its sha256 last matched (at write time, or a previous
    /// verification). Any write to a file moves its ctime, so a modified file is always hashed;
    /// only corruption below the page cache (bit rot) goes unnoticed — use `Full` for that.
    Stamped,
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
    /// An image lower dir that no checkpoint may stack on: relative, or a dir of this store
    /// (named directly or through a symlink) other than a checkpoint's fs layer (an upper, CRIU
    /// images, the store itself).
    #[error("image lower dir {0} is not an image layer nor a checkpoint's fs layer")]
    ForeignImageLower(PathBuf),
}

/// Verifies one checkpoint dir against its manifest.
pub fn verify_dir(cp: &Checkpoint, level: VerifyLevel) -> Result<(), VerifyError> {
    verify_part(cp, level, "")
}

/// Verifies the nodes of `cp` whose path starts with `prefix` ("" for all).
fn verify_part(cp: &Checkpoint, level: VerifyLevel, prefix: &str) -> Result<(), VerifyError> {
    let (found, keys): (Vec<FileEntry>, BTreeMap<String, StampKey>) = if level == VerifyLevel::Full
    {
        let all =
            record(&cp.dir, false).map_err(|(path, source)| VerifyError::Read { path, source })?;
        (all, BTreeMap::new())
    } else {
        let all = stat_all(&cp.dir)?;
        let keys = all.iter().map(|(e, k)| (e.path.clone(), *k)).collect();
        (all.into_iter().map(|(e, _)| e).collect(), keys)
    };
    let mut stamp = if level == VerifyLevel::Stamped {
        read_stamp(&cp.dir)
    } else {
        Stamp::default()
    };
    let mut stamp_changed = false;
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
        let mut got_sha = got.sha256.clone();
        if level == VerifyLevel::Stamped && want.kind == 'f' {
            let key = keys.get(&want.path).copied();
            if key.is_none() || stamp.files.get(&want.path).copied() != key {
                let path = file(&want.path);
                let (_, digest) = super::files::hash_and_sync(&path, false).map_err(|source| {
                    VerifyError::Read {
                        path: path.clone(),
                        source,
                    }
                })?;
                if Some(&digest) == want.sha256.as_ref()
                    && let Some(k) = key
                {
                    stamp.files.insert(want.path.clone(), k);
                    stamp_changed = true;
                }
                got_sha = Some(digest);
            } else {
                got_sha = want.sha256.clone();
            }
        }
        if level != VerifyLevel::Sizes && got_sha != want.sha256 {
            return Err(VerifyError::Corrupt {
                file: file(&want.path),
                expected: want.sha256.clone().unwrap_or_default(),
                found: got_sha.unwrap_or_default(),
            });
        }
    }
    if stamp_changed {
        write_stamp_file(&cp.dir, &stamp);
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

/// (inode, ctime seconds, ctime nanoseconds, size): any write to a file changes it.
type StampKey = (u64, i64, i64, u64);

/// Per file, the [`StampKey`] at which its sha256 last matched the manifest.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Stamp {
    files: BTreeMap<String, StampKey>,
}

/// The stamp of checkpoint dir `dir`: a sibling `.verified-<name>` (never inside the checkpoint,
/// never listed).
pub(crate) fn stamp_path(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    dir.with_file_name(format!(".verified-{name}"))
}

fn read_stamp(dir: &Path) -> Stamp {
    std::fs::read(stamp_path(dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn write_stamp_file(dir: &Path, stamp: &Stamp) {
    // Only inside a store (its container dirs hold `.lock`): no litter beside exported copies.
    if !dir.with_file_name(super::LOCK_FILE).exists() {
        return;
    }
    let path = stamp_path(dir);
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec(stamp).expect("a stamp always serializes");
    if std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, &path))
        .is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Every regular file under `dir` (but the manifest) with its [`StampKey`]: taken before a
/// checkpoint's files are hashed, for [`write_stamp`].
pub(crate) fn stamp_keys(dir: &Path) -> BTreeMap<String, StampKey> {
    stat_all(dir)
        .map(|all| {
            all.into_iter()
                .filter(|(e, _)| e.kind == 'f')
                .map(|(e, k)| (e.path, k))
                .collect()
        })
        .unwrap_or_default()
}

/// Stamps the files of checkpoint `written` (its files hashed since `before` was taken of them)
/// as verified, for the checkpoint that will be `dir`: only a file whose key is the same now as
/// before its hashing, so that a write that came between — or after, were this stamped once the
/// checkpoint is listed (the soak's `corrupt-newest` flipped a byte there, and a later restore
/// trusted the stamp and took the corrupt image) — leaves it to be hashed at its next
/// verification. Called before the checkpoint becomes visible.
pub(crate) fn write_stamp(written: &Path, dir: &Path, before: &BTreeMap<String, StampKey>) {
    let files = stamp_keys(written)
        .into_iter()
        .filter(|(path, k)| before.get(path) == Some(k))
        .collect();
    write_stamp_file(dir, &Stamp { files });
}

/// Every node under `dir` (except the manifest) with its kind, size and stamp key; no hashing.
fn stat_all(root: &Path) -> Result<Vec<(FileEntry, StampKey)>, VerifyError> {
    use std::os::unix::fs::MetadataExt;
    let mut all = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let read_err = |source| VerifyError::Read {
            path: dir.clone(),
            source,
        };
        for e in std::fs::read_dir(&dir).map_err(read_err)? {
            let e = e.map_err(read_err)?;
            let child = rel.join(e.file_name());
            if rel.as_os_str().is_empty() && e.file_name() == super::manifest::MANIFEST_FILE {
                continue;
            }
            let path = root.join(&child);
            let m = std::fs::symlink_metadata(&path).map_err(|source| VerifyError::Read {
                path: path.clone(),
                source,
            })?;
            let kind = kind_of(&m);
            let size = if kind == 'f' { m.len() } else { 0 };
            let sha256 = if kind == 'l' {
                let t = std::fs::read_link(&path).map_err(|source| VerifyError::Read {
                    path: path.clone(),
                    source,
                })?;
                Some(crate::tree::hex(&<sha2::Sha256 as sha2::Digest>::digest(
                    std::os::unix::ffi::OsStrExt::as_bytes(t.as_os_str()),
                )))
            } else {
                None
            };
            all.push((
                FileEntry {
                    path: crate::layer::encode_path(&child),
                    kind,
                    size,
                    sha256,
                },
                (m.ino(), m.ctime(), m.ctime_nsec(), m.size()),
            ));
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

/// Verifies a checkpoint and every checkpoint of its fs chain, and that the image lowers exist;
/// an image lower that is another checkpoint's layer in this store (a fork stacks on the chain
/// it was forked from) is verified as that checkpoint's layer, and one that is (or resolves to)
/// another dir of the store, or a relative path, is refused.
pub fn verify_checkpoint(
    store: &Store,
    cp: &Checkpoint,
    level: VerifyLevel,
) -> Result<(), VerifyError> {
    verify_dir(cp, level)?;
    let m = &cp.manifest;
    for &seq in m.fs_chain.iter().filter(|s| **s != m.seq) {
        verify_layer_of(store, &m.namespace, &m.container, seq, level)?;
    }
    for l in &m.image_lowers {
        if !l.is_dir() {
            return Err(VerifyError::MissingImageLower(l.clone()));
        }
        // Not the symlinks themselves: docker's overlay2 names its layers by symlinks (`l/…`).
        let owner = store.layer_owner(l);
        let in_store = std::fs::canonicalize(l).is_ok_and(|c| {
            std::fs::canonicalize(store.root()).is_ok_and(|root| c.starts_with(root))
        });
        if l.is_relative() || (owner.is_none() && (l.starts_with(store.root()) || in_store)) {
            return Err(VerifyError::ForeignImageLower(l.clone()));
        }
        if let Some((namespace, container, seq)) = owner {
            verify_layer_of(store, &namespace, &container, seq, level)?;
        }
    }
    Ok(())
}

/// Verifies the fs layer of checkpoint `seq` of `container`, one a restore stacks on: only its
/// layer is needed, not its CRIU images.
fn verify_layer_of(
    store: &Store,
    namespace: &str,
    container: &str,
    seq: u64,
    level: VerifyLevel,
) -> Result<(), VerifyError> {
    let cp = store.load(namespace, container, seq).map_err(|e| match e {
        super::StoreError::Format(f) => VerifyError::Format(f),
        _ => VerifyError::ChainBroken {
            container: container.into(),
            seq,
        },
    })?;
    verify_part(&cp, level, super::manifest::FS_DIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file rewritten (same size) between the keys taken before a checkpoint's hashing and
    /// its stamp is left out of the stamp, so a later `Stamped` verification hashes it and finds
    /// the change; an untouched file is stamped.
    #[test]
    fn a_file_written_after_its_keys_were_taken_is_not_stamped() {
        let tmp = tempfile::tempdir().unwrap();
        let container = tmp.path().join("c1");
        let written = container.join(".tmp-1");
        std::fs::create_dir_all(written.join("criu")).unwrap();
        std::fs::write(container.join(super::super::LOCK_FILE), b"").unwrap();
        std::fs::write(written.join("criu/a.img"), b"aaaa").unwrap();
        std::fs::write(written.join("criu/b.img"), b"bbbb").unwrap();
        let before = stamp_keys(&written);
        assert_eq!(before.len(), 2, "{before:?}");
        std::fs::write(written.join("criu/b.img"), b"BBBB").unwrap();
        let dir = container.join("1");
        write_stamp(&written, &dir, &before);
        let stamp = read_stamp(&dir);
        assert!(stamp.files.contains_key("criu/a.img"), "{stamp:?}");
        assert!(!stamp.files.contains_key("criu/b.img"), "{stamp:?}");
    }
}
