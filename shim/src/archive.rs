//! An import's chain archive, read before a byte of it is unpacked: its size, the bytes it
//! unpacks to (a sparse member at its apparent size: it is hashed in full), its member count and
//! the store's free space are bounded ([`ImportLimits`]); every member lies under `checkpoints/`,
//! with no absolute name, no `..` and no member below a symlink an earlier one made. The
//! headers are read with the registry crate's tar reader ([`belayer_registry::tar`]), the one
//! reader of tar headers in the tree.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};

pub use belayer_api::settings::ImportLimits;
use belayer_registry::tar::{ReadError, Walker};

/// Why an archive is not imported.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The archive cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The archive.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A bound of [`ImportLimits`] is passed.
    #[error(
        "{path}: {what} is over {limit}, the import bound (import.{setting} in the node settings)"
    )]
    OverLimit {
        /// The archive.
        path: PathBuf,
        /// What passed it ("the export's size, 3000000 bytes", ...).
        what: String,
        /// The bound.
        limit: u64,
        /// Its setting.
        setting: &'static str,
    },
    /// The store's disk has no room for it.
    #[error("{path} needs {need} bytes; the store's disk ({store}) has {free} free")]
    NoRoom {
        /// The archive.
        path: PathBuf,
        /// Bytes it would write.
        need: u64,
        /// Bytes free.
        free: u64,
        /// The store root.
        store: PathBuf,
    },
    /// A member that no export holds.
    #[error("{path}: member {member:?} {why}")]
    BadMember {
        /// The archive.
        path: PathBuf,
        /// The member's name.
        member: String,
        /// What is wrong with it.
        why: String,
    },
    /// Not a tar archive, or cut short.
    #[error("{path} is not a whole tar archive: {source}")]
    Malformed {
        /// The archive.
        path: PathBuf,
        /// What is wrong.
        #[source]
        source: ReadError,
    },
}

/// What an archive holds, as its headers say.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// Members.
    pub members: u64,
    /// Bytes it unpacks to, sparse members at their apparent size.
    pub unpacked: u64,
    /// Bytes of data it holds (what lands on disk).
    pub stored: u64,
}

/// Checks the chain archive `path` (with `beside` bytes of CRIU images beside it) against
/// `limits` and the free space of the store at `store`, reading only its headers.
pub fn check(
    path: &Path,
    beside: u64,
    limits: &ImportLimits,
    store: &Path,
) -> Result<Scanned, ArchiveError> {
    let size = std::fs::metadata(path)
        .map_err(|source| ArchiveError::Read {
            path: path.into(),
            source,
        })?
        .len();
    let total = size.saturating_add(beside);
    if total > limits.max_archive_bytes {
        return Err(ArchiveError::OverLimit {
            path: path.into(),
            what: format!("the export's size, {total} bytes"),
            limit: limits.max_archive_bytes,
            setting: "max_archive_bytes",
        });
    }
    let scanned = scan(path, limits)?;
    let free = nix::sys::statvfs::statvfs(store)
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
        .map_err(|e| ArchiveError::Read {
            path: store.into(),
            source: e.into(),
        })?;
    // Each member takes at least a block of metadata besides its data.
    let need = scanned
        .stored
        .saturating_add(scanned.members.saturating_mul(4096))
        .saturating_add(beside);
    if need > free {
        return Err(ArchiveError::NoRoom {
            path: path.into(),
            need,
            free,
            store: store.into(),
        });
    }
    Ok(scanned)
}

/// Reads the headers of the tar archive `path` (ustar, pax, GNU long names and sparse members),
/// refusing a member no export holds and stopping at the first bound passed.
pub fn scan(path: &Path, limits: &ImportLimits) -> Result<Scanned, ArchiveError> {
    let mut file = File::open(path).map_err(|source| ArchiveError::Read {
        path: path.into(),
        source,
    })?;
    let walk_err = |e| match e {
        ReadError::Read { source, .. } => ArchiveError::Read {
            path: path.into(),
            source,
        },
        source => ArchiveError::Malformed {
            path: path.into(),
            source,
        },
    };
    let mut walker = Walker::new(&mut file, 0);
    let mut out = Scanned::default();
    let mut symlinks: HashSet<String> = HashSet::new();
    while let Some(entry) = walker.next_entry().map_err(walk_err)? {
        let (name, link, kind) = (&entry.name, &entry.link, entry.kind);
        let bad = |why: String| ArchiveError::BadMember {
            path: path.into(),
            member: name.clone(),
            why,
        };
        let member = confined(name).map_err(|why| bad(why.into()))?;
        if let Some(s) = under_symlink(&member, &symlinks) {
            return Err(bad(format!(
                "lies below the symlink {s:?} the archive made"
            )));
        }
        match kind {
            b'0' | b'\0' | b'7' | b'S' | b'3' | b'4' | b'5' | b'6' => {}
            b'2' => {
                symlinks.insert(member.clone());
            }
            b'1' => {
                let target =
                    confined(link).map_err(|why| bad(format!("links to {link:?}, which {why}")))?;
                if under_symlink(&target, &symlinks).is_some() {
                    return Err(bad(format!("links to {link:?}, below a symlink")));
                }
            }
            other => {
                return Err(bad(format!(
                    "is of tar type {:?}, which no export holds",
                    other as char
                )));
            }
        }
        // Links, dirs, devices and fifos have no data, whatever their size field says: the
        // reader gives them size 0.
        let (size, apparent) = (entry.size, entry.apparent);
        out.members += 1;
        out.stored = out.stored.saturating_add(size);
        out.unpacked = out.unpacked.saturating_add(apparent.max(size));
        if out.members > limits.max_files {
            return Err(ArchiveError::OverLimit {
                path: path.into(),
                what: format!("its member count, past {}", limits.max_files),
                limit: limits.max_files,
                setting: "max_files",
            });
        }
        if out.unpacked > limits.max_unpacked_bytes {
            return Err(ArchiveError::OverLimit {
                path: path.into(),
                what: format!(
                    "what it unpacks to, {} bytes with {name:?} ({apparent} bytes{})",
                    out.unpacked,
                    if apparent > size { ", sparse" } else { "" }
                ),
                limit: limits.max_unpacked_bytes,
                setting: "max_unpacked_bytes",
            });
        }
    }
    Ok(out)
}

/// `name` without a trailing `/`, if it is a relative path under `checkpoints/` with no `..`.
fn confined(name: &str) -> Result<String, &'static str> {
    let name = name
        .strip_prefix("./")
        .unwrap_or(name)
        .trim_end_matches('/');
    if name.starts_with('/') {
        return Err("is absolute");
    }
    let parts: Vec<&str> = name.split('/').collect();
    if parts.contains(&"..") {
        return Err("climbs out with '..'");
    }
    if parts.first() != Some(&"checkpoints") || parts.iter().any(|p| p.is_empty()) {
        return Err("is not under checkpoints/");
    }
    Ok(name.to_string())
}

/// The symlink among `symlinks` that `member` lies below, if any.
fn under_symlink<'a>(member: &str, symlinks: &'a HashSet<String>) -> Option<&'a String> {
    let mut at = 0;
    while let Some(i) = member[at..].find('/') {
        at += i;
        if let Some(s) = symlinks.get(&member[..at]) {
            return Some(s);
        }
        at += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_outside_checkpoints_or_below_a_symlink_are_named() {
        assert_eq!(
            confined("./checkpoints/a/b/1/").unwrap(),
            "checkpoints/a/b/1"
        );
        assert_eq!(confined("/etc/cron.d/x"), Err("is absolute"));
        assert_eq!(
            confined("checkpoints/../../etc"),
            Err("climbs out with '..'")
        );
        assert_eq!(confined("etc/passwd"), Err("is not under checkpoints/"));
        let links = HashSet::from(["checkpoints/a/b/1/fs/x".to_string()]);
        assert!(under_symlink("checkpoints/a/b/1/fs/x/etc/passwd", &links).is_some());
        assert!(under_symlink("checkpoints/a/b/1/fs/xy", &links).is_none());
        assert!(under_symlink("checkpoints/a/b/1/fs/x", &links).is_none());
    }
}
