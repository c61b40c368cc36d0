//! Copying one filesystem node with everything overlay cares about: content (sparse-aware),
//! owner, mode (setuid too), xattrs, hardlinks within the destination layer, and mtimes.

use std::collections::HashMap;
use std::ffi::{CStr, OsStr, OsString};
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::at::{self, Stat};
use crate::sys;

/// Xattrs overlay keeps for itself; never copied verbatim.
pub(crate) const OVERLAY_XATTR_PREFIX: &[u8] = b"trusted.overlay.";
/// The xattr that marks an opaque directory.
pub(crate) const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// A failed filesystem step while copying a node: which step, on which path.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}")]
pub struct CopyError {
    /// The step that failed ("read", "create", "chown", "set xattr on", ...).
    pub step: &'static str,
    /// The path the step worked on.
    pub path: PathBuf,
    /// The underlying error.
    #[source]
    pub source: io::Error,
}

impl CopyError {
    /// Did this step fail because the disk is full?
    pub fn is_disk_full(&self) -> bool {
        sys::is_disk_full(&self.source)
    }
}

pub(crate) fn step<T>(r: io::Result<T>, step: &'static str, path: &Path) -> Result<T, CopyError> {
    r.map_err(|source| CopyError {
        step,
        path: path.to_path_buf(),
        source,
    })
}

/// Is `meta` an overlay whiteout (char device 0/0)?
pub(crate) fn is_whiteout(meta: &Stat) -> bool {
    meta.kind() == libc::S_IFCHR && meta.rdev == 0
}

/// Where [`Copier::copy_node`] reads a node's data, symlink target and xattrs from.
pub(crate) enum Source<'a> {
    /// A path (the store's own layers, which only Belayer writes).
    Path(&'a Path),
    /// A directory or regular file of an upper dir, open and checked against the scan.
    Open {
        /// The open node.
        fd: BorrowedFd<'a>,
        /// Its path, for messages.
        path: &'a Path,
    },
    /// Another node of an upper dir (symlink, device, fifo, socket, whiteout), open `O_PATH`
    /// and checked against the scan; its xattrs are read by name in its checked parent.
    Node {
        /// The node, `O_PATH`.
        fd: BorrowedFd<'a>,
        /// Its parent directory.
        parent: BorrowedFd<'a>,
        /// Its name in `parent`.
        name: &'a CStr,
        /// Its path, for messages.
        path: &'a Path,
    },
}

impl Source<'_> {
    fn path(&self) -> &Path {
        match self {
            Self::Path(p) | Self::Open { path: p, .. } | Self::Node { path: p, .. } => p,
        }
    }

    fn list_xattrs(&self) -> io::Result<Vec<OsString>> {
        match self {
            Self::Path(p) => sys::llistxattr(p),
            Self::Open { fd, .. } => at::flistxattr(*fd),
            Self::Node { parent, name, .. } => {
                sys::llistxattr(&at::proc_path(*parent, OsStr::from_bytes(name.to_bytes())))
            }
        }
    }

    fn get_xattr(&self, attr: &OsStr) -> io::Result<Option<Vec<u8>>> {
        match self {
            Self::Path(p) => sys::lgetxattr(p, attr),
            Self::Open { fd, .. } => at::fgetxattr(*fd, attr),
            Self::Node { parent, name, .. } => sys::lgetxattr(
                &at::proc_path(*parent, OsStr::from_bytes(name.to_bytes())),
                attr,
            ),
        }
    }

    fn read_link(&self) -> io::Result<PathBuf> {
        match self {
            Self::Path(p) => fs::read_link(p),
            Self::Node { fd, .. } => at::read_link(*fd),
            Self::Open { .. } => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn open_data(&self) -> io::Result<File> {
        match self {
            Self::Path(p) => File::open(p),
            Self::Open { fd, .. } => Ok(File::from(fd.try_clone_to_owned()?)),
            Self::Node { .. } => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }
}

/// Is `dir` marked opaque?
pub(crate) fn is_opaque(dir: &Path) -> Result<bool, CopyError> {
    let v = step(
        sys::lgetxattr(dir, OsStr::new(OPAQUE_XATTR)),
        "read xattrs of",
        dir,
    )?;
    Ok(v.as_deref() == Some(b"y"))
}

/// Creates an overlay whiteout at `dst`.
pub(crate) fn make_whiteout(dst: &Path) -> Result<(), CopyError> {
    step(sys::mknod(dst, libc::S_IFCHR, 0), "create whiteout", dst)
}

/// Marks `dir` opaque.
pub(crate) fn set_opaque(dir: &Path) -> Result<(), CopyError> {
    step(
        sys::lsetxattr(dir, OsStr::new(OPAQUE_XATTR), b"y"),
        "mark opaque",
        dir,
    )
}

/// Removes whatever is at `path` (a subtree too); absent is fine.
pub(crate) fn remove_any(path: &Path) -> Result<(), CopyError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => step(Err(e), "stat", path),
        Ok(m) if m.is_dir() => step(fs::remove_dir_all(path), "remove", path),
        Ok(_) => step(fs::remove_file(path), "remove", path),
    }
}

/// State shared across one copy pass: hardlink map and counters.
#[derive(Default)]
pub(crate) struct Copier {
    links: HashMap<(u64, u64), PathBuf>,
    /// Directories whose mtime must be set after their children are in place.
    dir_times: Vec<(PathBuf, (i64, i64))>,
    /// Bytes of file data written.
    pub bytes: u64,
    /// Nodes written.
    pub nodes: u64,
}

impl Copier {
    /// Copies the non-overlay xattrs of `src` to `dst`.
    fn copy_xattrs(&self, src: &Source<'_>, dst: &Path) -> Result<(), CopyError> {
        let path = src.path();
        for name in step(src.list_xattrs(), "list xattrs of", path)? {
            if name.as_bytes().starts_with(OVERLAY_XATTR_PREFIX) {
                continue;
            }
            if let Some(v) = step(src.get_xattr(&name), "read xattrs of", path)? {
                step(sys::lsetxattr(dst, &name, &v), "set xattr on", dst)?;
            }
        }
        Ok(())
    }

    /// Owner, xattrs, then mode (chown clears setuid and capabilities, so it comes first).
    fn apply_meta(&self, src: &Source<'_>, dst: &Path, meta: &Stat) -> Result<(), CopyError> {
        step(
            std::os::unix::fs::lchown(dst, Some(meta.uid), Some(meta.gid)),
            "chown",
            dst,
        )?;
        self.copy_xattrs(src, dst)?;
        if !meta.is_symlink() {
            let perm = fs::Permissions::from_mode(meta.mode & 0o7777);
            step(fs::set_permissions(dst, perm), "chmod", dst)?;
        }
        Ok(())
    }

    /// Copies the node `src` (described by `meta`) to `dst`, which must not exist. Directories
    /// are created empty; call [`Copier::finish`] after their children to set their mtimes.
    pub fn copy_node(
        &mut self,
        src: &Source<'_>,
        dst: &Path,
        meta: &Stat,
    ) -> Result<(), CopyError> {
        let times = (meta.atime, meta.mtime);
        self.nodes += 1;
        if meta.is_dir() {
            step(fs::create_dir(dst), "create directory", dst)?;
            self.apply_meta(src, dst, meta)?;
            self.dir_times.push((dst.to_path_buf(), times.1));
            return Ok(());
        }
        if is_whiteout(meta) {
            return make_whiteout(dst);
        }
        let key = (meta.dev, meta.ino);
        if meta.nlink > 1
            && let Some(first) = self.links.get(&key)
        {
            return step(fs::hard_link(first, dst), "hardlink", dst);
        }
        if meta.is_file() {
            let from = step(src.open_data(), "read", src.path())?;
            self.bytes += copy_sparse(&from, src.path(), dst)?;
        } else if meta.is_symlink() {
            let target = step(src.read_link(), "read symlink", src.path())?;
            step(
                std::os::unix::fs::symlink(&target, dst),
                "create symlink",
                dst,
            )?;
        } else {
            step(
                sys::mknod(dst, meta.kind() | 0o600, meta.rdev),
                "create special file",
                dst,
            )?;
        }
        self.apply_meta(src, dst, meta)?;
        step(sys::set_times(dst, times.0, times.1), "set times of", dst)?;
        if meta.nlink > 1 {
            self.links.insert(key, dst.to_path_buf());
        }
        Ok(())
    }

    /// Forgets the hardlink map (the next source layer has its own inodes).
    pub fn reset_links(&mut self) {
        self.links.clear();
    }

    /// Sets directory mtimes, deepest first (creating children changes a directory's mtime).
    pub fn finish(&mut self) -> Result<(), CopyError> {
        self.dir_times
            .sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
        for (dir, mtime) in self.dir_times.drain(..) {
            // A later layer may have replaced or removed the directory (compaction).
            if !fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                continue;
            }
            step(sys::set_times(&dir, mtime, mtime), "set times of", &dir)?;
        }
        Ok(())
    }

    /// Sets `dst`'s directory metadata (owner, mode, xattrs, mtime) from `src`, for a directory
    /// that already exists in the destination.
    pub fn update_dir(&mut self, src: &Path, dst: &Path, meta: &Stat) -> Result<(), CopyError> {
        for name in step(sys::llistxattr(dst), "list xattrs of", dst)? {
            if !name.as_bytes().starts_with(OVERLAY_XATTR_PREFIX) {
                let p = crate::sys::lgetxattr(src, &name);
                if matches!(p, Ok(None)) {
                    remove_xattr(dst, &name)?;
                }
            }
        }
        self.apply_meta(&Source::Path(src), dst, meta)?;
        self.dir_times.push((dst.to_path_buf(), meta.mtime));
        Ok(())
    }
}

fn remove_xattr(path: &Path, name: &OsStr) -> Result<(), CopyError> {
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| CopyError {
        step: "remove xattr from",
        path: path.to_path_buf(),
        source: io::ErrorKind::InvalidInput.into(),
    })?;
    let n = std::ffi::CString::new(name.as_bytes()).map_err(|_| CopyError {
        step: "remove xattr from",
        path: path.to_path_buf(),
        source: io::ErrorKind::InvalidInput.into(),
    })?;
    // SAFETY: both strings are NUL-terminated and outlive the call.
    let r = unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) };
    if r < 0 {
        return step(Err(io::Error::last_os_error()), "remove xattr from", path);
    }
    Ok(())
}

/// Copies a regular file's data (in the kernel where it can), keeping holes as holes. Returns the bytes written.
fn copy_sparse(mut from: &File, src: &Path, dst: &Path) -> Result<u64, CopyError> {
    let mut to = step(File::create(dst), "create", dst)?;
    let len = step(from.metadata(), "stat", src)?.len();
    let mut written = 0u64;
    let mut pos = 0u64;
    let mut buf = Vec::new();
    // copy_file_range keeps the data in the kernel; read/write where it is not supported.
    let mut in_kernel = true;
    while pos < len {
        let Some(data) = step(
            sys::seek_data_hole(from, pos, libc::SEEK_DATA),
            "seek data in",
            src,
        )?
        else {
            break;
        };
        let hole = step(
            sys::seek_data_hole(from, data, libc::SEEK_HOLE),
            "seek hole in",
            src,
        )?
        .unwrap_or(len);
        let mut at = data;
        if in_kernel {
            while at < hole {
                match sys::copy_range(from, &to, at, hole - at) {
                    Ok(0) => break,
                    Ok(n) => at += n,
                    Err(e)
                        if at == data
                            && matches!(
                                e.raw_os_error(),
                                Some(libc::EXDEV | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
                            ) =>
                    {
                        in_kernel = false;
                        break;
                    }
                    Err(e) => return step(Err(e), "copy", dst),
                }
            }
            written += at - data;
        }
        if !in_kernel {
            buf.resize(1 << 20, 0);
            step(from.seek(SeekFrom::Start(data)), "seek in", src)?;
            step(to.seek(SeekFrom::Start(data)), "seek in", dst)?;
            let mut left = hole - data;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = step(from.read(&mut buf[..want]), "read", src)?;
                if n == 0 {
                    break;
                }
                step(to.write_all(&buf[..n]), "write", dst)?;
                left -= n as u64;
                written += n as u64;
            }
        }
        pos = hole;
    }
    step(to.set_len(len), "truncate", dst)?;
    Ok(written)
}
