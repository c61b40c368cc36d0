//! A comparable snapshot of a directory tree (paths, type, mode, owner, xattrs, link counts,
//! content hashes, symlink targets, mtimes), to check that a restore shows the captured instant.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::layer::encode_path;

/// One node of a [`TreeSnapshot`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// `d`, `f`, `l`, `p` (fifo), `s`, `c`, `b`.
    pub kind: char,
    /// Permission bits incl. setuid/setgid/sticky.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count (not for directories: overlay reports 1 for merged ones).
    pub nlink: Option<u64>,
    /// Size (files only).
    pub size: Option<u64>,
    /// sha256 of the content (files) or the target (symlinks).
    pub digest: Option<String>,
    /// Device number (device nodes).
    pub rdev: u64,
    /// Modification time (seconds, nanoseconds); `None` for the root, which a fresh upper owns.
    pub mtime: Option<(i64, i64)>,
    /// Extended attributes, except overlay's own, as name → hex value.
    pub xattrs: BTreeMap<String, String>,
}

/// Relative path (encoded, see [`encode_path`]) → node; the root is `""`.
pub type TreeSnapshot = BTreeMap<String, Node>;

/// Takes a snapshot of the tree at `root` (not following symlinks).
pub fn snapshot_tree(root: &Path) -> io::Result<TreeSnapshot> {
    let mut out = TreeSnapshot::new();
    walk(root, Path::new(""), &mut out)?;
    Ok(out)
}

fn walk(root: &Path, rel: &Path, out: &mut TreeSnapshot) -> io::Result<()> {
    let path = root.join(rel);
    // Errors name the node they happened on.
    let at = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let m = fs::symlink_metadata(&path).map_err(at)?;
    let ft = m.file_type();
    let kind = match () {
        _ if ft.is_dir() => 'd',
        _ if ft.is_file() => 'f',
        _ if ft.is_symlink() => 'l',
        _ if ft.is_fifo() => 'p',
        _ if ft.is_socket() => 's',
        _ if ft.is_char_device() => 'c',
        _ => 'b',
    };
    let digest = match kind {
        'f' => Some(hash_file(&path).map_err(at)?),
        'l' => Some(hex(&Sha256::digest(
            fs::read_link(&path).map_err(at)?.as_os_str().as_bytes(),
        ))),
        _ => None,
    };
    let mut xattrs = BTreeMap::new();
    for name in crate::sys::llistxattr(&path).map_err(at)? {
        if name.as_bytes().starts_with(b"trusted.overlay.") {
            continue;
        }
        if let Some(v) = crate::sys::lgetxattr(&path, &name).map_err(at)? {
            xattrs.insert(name.to_string_lossy().into_owned(), hex(&v));
        }
    }
    let is_root = rel.as_os_str().is_empty();
    out.insert(
        encode_path(rel),
        Node {
            kind,
            mode: m.mode() & 0o7777,
            uid: m.uid(),
            gid: m.gid(),
            nlink: (kind != 'd').then_some(m.nlink()),
            size: (kind == 'f').then_some(m.size()),
            digest,
            rdev: if matches!(kind, 'c' | 'b') {
                m.rdev()
            } else {
                0
            },
            mtime: (!is_root).then_some((m.mtime(), m.mtime_nsec())),
            xattrs,
        },
    );
    if kind == 'd' {
        for e in fs::read_dir(&path).map_err(at)? {
            walk(root, &rel.join(e.map_err(at)?.file_name()), out)?;
        }
    }
    Ok(())
}

/// sha256 of a file's content, hex.
pub fn hash_file(path: &Path) -> io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    io::copy(&mut f, &mut h)?;
    Ok(hex(&h.finalize()))
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Human-readable differences between two snapshots, empty when they are equal.
pub fn diff_trees(expected: &TreeSnapshot, actual: &TreeSnapshot) -> Vec<String> {
    let mut out = Vec::new();
    for (p, e) in expected {
        match actual.get(p) {
            None => out.push(format!("missing: /{p}")),
            Some(a) if a != e => {
                out.push(format!("differs: /{p}\n  expected {e:?}\n  actual   {a:?}"))
            }
            _ => {}
        }
    }
    for p in actual.keys().filter(|p| !expected.contains_key(*p)) {
        out.push(format!("extra: /{p}"));
    }
    out
}
