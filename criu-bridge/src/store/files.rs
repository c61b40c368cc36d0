//! Recording the nodes of a checkpoint dir (sha256 of every file) and flushing them to disk.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::manifest::{FileEntry, MANIFEST_FILE};
use crate::layer::encode_path;
use crate::tree::hex;

/// Lists every node under `dir` except the top-level manifest, sorted by path. With `sync`,
/// every file and directory is fsynced while it is read (a checkpoint is written once).
pub(crate) fn record(
    dir: &Path,
    sync: bool,
) -> Result<Vec<FileEntry>, (std::path::PathBuf, io::Error)> {
    let mut out = Vec::new();
    walk(dir, Path::new(""), sync, &mut out)?;
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn walk(
    root: &Path,
    rel: &Path,
    sync: bool,
    out: &mut Vec<FileEntry>,
) -> Result<(), (std::path::PathBuf, io::Error)> {
    let dir = root.join(rel);
    let err = |p: &Path| {
        let p = p.to_path_buf();
        move |e| (p, e)
    };
    for e in fs::read_dir(&dir).map_err(err(&dir))? {
        let e = e.map_err(err(&dir))?;
        let name = e.file_name();
        let child = rel.join(&name);
        if rel.as_os_str().is_empty() && name == MANIFEST_FILE {
            continue;
        }
        let path = root.join(&child);
        let ft = fs::symlink_metadata(&path).map_err(err(&path))?.file_type();
        let (kind, size, sha256) = if ft.is_file() {
            let (size, digest) = hash_and_sync(&path, sync).map_err(err(&path))?;
            ('f', size, Some(digest))
        } else if ft.is_symlink() {
            let t = fs::read_link(&path).map_err(err(&path))?;
            ('l', 0, Some(hex(&Sha256::digest(t.as_os_str().as_bytes()))))
        } else if ft.is_dir() {
            ('d', 0, None)
        } else if ft.is_char_device() {
            ('c', 0, None)
        } else if ft.is_block_device() {
            ('b', 0, None)
        } else if ft.is_fifo() {
            ('p', 0, None)
        } else {
            ('s', 0, None)
        };
        out.push(FileEntry {
            path: encode_path(&child),
            kind,
            size,
            sha256,
        });
        if kind == 'd' {
            walk(root, &child, sync, out)?;
        }
    }
    if sync {
        crate::sys::fsync_dir(&dir).map_err(err(&dir))?;
    }
    Ok(())
}

/// Size and sha256 of a file; fsyncs it when `sync`.
pub(crate) fn hash_and_sync(path: &Path, sync: bool) -> io::Result<(u64, String)> {
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let n = io::copy(&mut f, &mut h)?;
    if sync {
        f.sync_all()?;
    }
    Ok((n, hex(&h.finalize())))
}
