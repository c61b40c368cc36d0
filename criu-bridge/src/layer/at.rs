//! Reading an upper dir by file descriptor: every node is opened relative to its parent's fd
//! without following symlinks and checked (`fstat`) against what the scan saw, so a process that
//! swaps a directory for a symlink while a capture runs cannot make it read outside the upper.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What a capture or compaction needs of a node's `stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stat {
    pub dev: u64,
    pub ino: u64,
    /// Type and permission bits.
    pub mode: u32,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub atime: (i64, i64),
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl Stat {
    fn from_raw(s: &libc::stat) -> Self {
        Self {
            dev: s.st_dev,
            ino: s.st_ino,
            mode: s.st_mode,
            nlink: s.st_nlink,
            uid: s.st_uid,
            gid: s.st_gid,
            rdev: s.st_rdev,
            size: s.st_size as u64,
            atime: (s.st_atime, s.st_atime_nsec),
            mtime: (s.st_mtime, s.st_mtime_nsec),
            ctime: (s.st_ctime, s.st_ctime_nsec),
        }
    }

    /// The file type bits (`S_IFMT`).
    pub fn kind(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.kind() == libc::S_IFDIR
    }

    pub fn is_file(&self) -> bool {
        self.kind() == libc::S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.kind() == libc::S_IFLNK
    }

    /// Same node (device, inode, file type) as `other`?
    pub fn same_node(&self, other: &Stat) -> bool {
        self.dev == other.dev && self.ino == other.ino && self.kind() == other.kind()
    }
}

impl From<&Metadata> for Stat {
    fn from(m: &Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            mode: m.mode(),
            nlink: m.nlink(),
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev(),
            size: m.size(),
            atime: (m.atime(), m.atime_nsec()),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// A directory entry name as a C string (names never hold NUL).
pub(crate) fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn fd_result(r: libc::c_int) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `r` is a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated and outlives the call; `dir` is a live fd.
    fd_result(unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) })
}

/// Opens the directory `path` itself (its last component must not be a symlink).
pub(crate) fn open_root(path: &Path) -> io::Result<OwnedFd> {
    let p = c_name(path.as_os_str())?;
    // SAFETY: `p` is NUL-terminated and outlives the call.
    fd_result(unsafe {
        libc::open(
            p.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })
}

/// Opens the directory `name` of `dir`; a symlink or non-directory there fails (ENOTDIR).
pub(crate) fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW,
    )
}

/// Opens the regular file `name` of `dir` for reading; a symlink there fails (ELOOP), and a
/// fifo or device swapped in neither blocks nor becomes the controlling terminal.
pub(crate) fn open_file(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<File> {
    let fd = openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NOCTTY | libc::O_NONBLOCK,
    )?;
    Ok(File::from(fd))
}

/// Opens the node `name` of `dir` itself (`O_PATH`, a symlink is not followed): for nodes that
/// must not be opened for I/O (devices, fifos, sockets, symlinks).
pub(crate) fn open_path(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    openat(dir, name, libc::O_PATH | libc::O_NOFOLLOW)
}

/// `fstat` of an open fd (`O_PATH` fds too).
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is live and `st` is a writable stat buffer.
    let r = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Stat::from_raw(&st))
}

/// `lstat` of `name` in `dir` (a symlink is described, not followed).
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    // SAFETY: `stat` is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is NUL-terminated, `dir` is live and `st` is a writable stat buffer.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Stat::from_raw(&st))
}

/// The entry names of the directory `dir` (without `.` and `..`), unsorted.
pub(crate) fn read_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    // A fresh open of the same directory: its own offset, and closedir closes it.
    let own = openat(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY)?;
    let raw = std::os::fd::IntoRawFd::into_raw_fd(own);
    // SAFETY: `raw` is an open directory fd that we own; on success the DIR owns it.
    let d = unsafe { libc::fdopendir(raw) };
    if d.is_null() {
        let err = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `raw` is still ours to close.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(err);
    }
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: errno is thread-local; clearing it tells end of directory from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: `d` is a live DIR stream used by this thread only.
        let e = unsafe { libc::readdir64(d) };
        if e.is_null() {
            let err = io::Error::last_os_error();
            break if err.raw_os_error() == Some(0) {
                Ok(())
            } else {
                Err(err)
            };
        }
        // SAFETY: a non-null dirent from readdir holds a NUL-terminated name and stays valid
        // until the next readdir on `d`.
        let name = unsafe { CStr::from_ptr((*e).d_name.as_ptr()) }.to_bytes();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name.to_vec()));
        }
    };
    // SAFETY: `d` is live and not used after this; closedir closes its fd.
    unsafe { libc::closedir(d) };
    result.map(|()| names)
}

/// The target of the symlink opened as `fd` (`O_PATH | O_NOFOLLOW`).
pub(crate) fn read_link(fd: BorrowedFd<'_>) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: the empty path is NUL-terminated; `buf` is writable for its length.
        let n = unsafe {
            libc::readlinkat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(PathBuf::from(OsString::from_vec(buf)));
        }
        buf.resize(buf.len() * 16, 0);
    }
}

/// A path that reaches `name` in the directory `dir` through `/proc/self/fd`, for the calls that
/// have no fd form (`l*xattr` on symlinks and devices). Valid while `dir` is open; only the
/// last component is looked up by name, and `l*` calls do not follow it.
pub(crate) fn proc_path(dir: BorrowedFd<'_>, name: &OsStr) -> PathBuf {
    let mut p = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    p.push(name);
    p
}

/// Runs an xattr call that fills `buf` and returns its length, growing `buf` on ERANGE; `None`
/// where the attribute is absent or the filesystem has none (ENODATA, ENOTSUP).
fn xattr_buf(
    mut call: impl FnMut(&mut [u8]) -> libc::ssize_t,
    initial: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut buf = vec![0u8; initial];
    loop {
        let n = call(&mut buf);
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(Some(buf));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ERANGE) => buf.resize(buf.len() * 16, 0),
            Some(libc::ENODATA | libc::ENOTSUP) => return Ok(None),
            _ => return Err(err),
        }
    }
}

/// Names of the extended attributes of the open file or directory `fd`.
pub(crate) fn flistxattr(fd: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let list = xattr_buf(
        // SAFETY: `fd` is live and `buf` is writable for the length passed.
        |buf| unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) },
        1024,
    )?
    .unwrap_or_default();
    Ok(list
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect())
}

/// The value of extended attribute `name` of the open file or directory `fd`, `None` if absent.
pub(crate) fn fgetxattr(fd: BorrowedFd<'_>, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
    let n = c_name(name)?;
    xattr_buf(
        // SAFETY: `n` is NUL-terminated, `fd` is live and `buf` is writable for its length.
        |buf| unsafe {
            libc::fgetxattr(
                fd.as_raw_fd(),
                n.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        },
        256,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn nodes_are_opened_without_following_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path();
        std::fs::create_dir(base.join("d")).unwrap();
        std::fs::write(base.join("d/f"), b"x").unwrap();
        std::os::unix::fs::symlink(base.join("d"), base.join("ld")).unwrap();
        std::os::unix::fs::symlink(base.join("d/f"), base.join("lf")).unwrap();
        let root = open_root(base).unwrap();
        let root = root.as_fd();
        let errno = |e: io::Error| e.raw_os_error();
        // O_DIRECTORY | O_NOFOLLOW on a symlink: ENOTDIR.
        assert_eq!(
            open_dir(root, c"ld").map_err(errno).err(),
            Some(Some(libc::ENOTDIR))
        );
        assert_eq!(
            open_file(root, c"lf").map_err(errno).err(),
            Some(Some(libc::ELOOP))
        );
        assert!(open_root(&base.join("ld")).is_err());

        let d = open_dir(root, c"d").unwrap();
        assert!(
            fstat(d.as_fd())
                .unwrap()
                .same_node(&stat_at(root, c"d").unwrap())
        );
        assert_eq!(read_names(d.as_fd()).unwrap(), [OsString::from("f")]);
        let l = open_path(root, c"lf").unwrap();
        let st = fstat(l.as_fd()).unwrap();
        assert!(st.is_symlink() && st.same_node(&stat_at(root, c"lf").unwrap()));
        assert_eq!(read_link(l.as_fd()).unwrap(), base.join("d/f"));
    }
}
