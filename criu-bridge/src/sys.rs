//! Thin safe wrappers over the few Linux calls std does not offer: xattrs, mknod, timestamps,
//! mounts, `renameat2`, `statx` birth time, `flock` and sparse-file seeks.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Names of the extended attributes of `path` (not following symlinks).
pub fn llistxattr(path: &Path) -> io::Result<Vec<OsString>> {
    let p = cpath(path)?;
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: `p` is a valid NUL-terminated string and `buf` is a writable buffer of the
        // length passed.
        let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ERANGE) => buf.resize(buf.len() * 4, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(err),
        }
    }
    Ok(buf
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect())
}

/// The value of extended attribute `name` of `path`, `None` if it is absent.
pub fn lgetxattr(path: &Path, name: &OsStr) -> io::Result<Option<Vec<u8>>> {
    let p = cpath(path)?;
    let n = cstr(name)?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: both strings are NUL-terminated and `buf` is writable for `buf.len()` bytes.
        let r =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            buf.truncate(r as usize);
            return Ok(Some(buf));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ERANGE) => buf.resize(buf.len() * 16, 0),
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => return Ok(None),
            _ => return Err(err),
        }
    }
}

/// Sets extended attribute `name` of `path` (not following symlinks).
pub fn lsetxattr(path: &Path, name: &OsStr, value: &[u8]) -> io::Result<()> {
    let p = cpath(path)?;
    let n = cstr(name)?;
    // SAFETY: both strings are NUL-terminated and `value` is readable for its length.
    check(unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// Creates a special file (fifo, socket, char or block device) with `mode` (type and permission
/// bits) and device number `rdev`.
pub fn mknod(path: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let p = cpath(path)?;
    // SAFETY: `p` is NUL-terminated; mknod does not retain it.
    check(unsafe { libc::mknod(p.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })
}

/// Sets the modification (and access) time of `path` without following symlinks.
pub fn set_times(path: &Path, atime: (i64, i64), mtime: (i64, i64)) -> io::Result<()> {
    let p = cpath(path)?;
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: `p` is NUL-terminated and `ts` is an array of two valid timespecs.
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Mounts an overlay filesystem at `target` with the given option string.
pub fn mount_overlay(target: &Path, options: &str) -> io::Result<()> {
    let t = cpath(target)?;
    let data = CString::new(options).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let fstype = c"overlay";
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    check(unsafe {
        libc::mount(
            fstype.as_ptr(),
            t.as_ptr(),
            fstype.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    })
}

/// Unmounts `target`; `detach` makes it lazy (MNT_DETACH).
pub fn umount(target: &Path, detach: bool) -> io::Result<()> {
    let t = cpath(target)?;
    let flags = if detach { libc::MNT_DETACH } else { 0 };
    // SAFETY: `t` is NUL-terminated.
    check(unsafe { libc::umount2(t.as_ptr(), flags) })
}

/// Atomically exchanges two paths (`renameat2(RENAME_EXCHANGE)`).
pub fn rename_exchange(a: &Path, b: &Path) -> io::Result<()> {
    let pa = cpath(a)?;
    let pb = cpath(b)?;
    // SAFETY: both strings are NUL-terminated; the raw syscall takes no other pointers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            pa.as_ptr(),
            libc::AT_FDCWD,
            pb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Birth time of `path` as (seconds, nanoseconds), `None` if the filesystem does not record it.
pub fn birth_time(path: &Path) -> io::Result<Option<(i64, u32)>> {
    let p = cpath(path)?;
    // SAFETY: statx is plain old data; all-zero is a valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `stx` is a valid writable statx buffer.
    check(unsafe {
        libc::statx(
            libc::AT_FDCWD,
            p.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BTIME,
            &mut stx,
        )
    })?;
    if stx.stx_mask & libc::STATX_BTIME != 0 {
        Ok(Some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec)))
    } else {
        Ok(None)
    }
}

/// Keeps the calling thread at a lower CPU priority (a higher nice value) while it lives, then
/// puts the old one back. Linux keeps a nice value per thread; the guard is not `Send`, so it is
/// dropped on the thread it lowered.
pub struct ThreadNice {
    tid: libc::pid_t,
    before: libc::c_int,
    _same_thread: std::marker::PhantomData<*const ()>,
}

impl ThreadNice {
    /// Lowers the calling thread to nice `nice`, unless it runs at that or lower already.
    pub fn lower_to(nice: libc::c_int) -> io::Result<Self> {
        // SAFETY: gettid(2) has no preconditions.
        let tid = unsafe { libc::gettid() };
        // SAFETY: errno is thread-local; clearing it tells a nice of -1 from an error.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: getpriority(2) takes no pointers.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
        let err = io::Error::last_os_error();
        if before == -1 && err.raw_os_error() != Some(0) {
            return Err(err);
        }
        if nice > before {
            // SAFETY: setpriority(2) takes no pointers; it changes only this thread.
            let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(Self {
            tid,
            before,
            _same_thread: std::marker::PhantomData,
        })
    }
}

impl Drop for ThreadNice {
    fn drop(&mut self) {
        // SAFETY: as above; raising the priority back needs CAP_SYS_NICE, which root has (without
        // it the thread stays lower, which is harmless).
        unsafe { libc::setpriority(libc::PRIO_PROCESS, self.tid as libc::id_t, self.before) };
    }
}

/// Takes an exclusive non-blocking `flock` on `file`; `Ok(false)` if someone else holds it.
pub fn try_lock_exclusive(file: &File) -> io::Result<bool> {
    flock(file, libc::LOCK_EX | libc::LOCK_NB)
}

/// `flock(file, op)`; `Ok(false)` when `op` has `LOCK_NB` and someone else holds the lock.
pub fn flock(file: &File, op: libc::c_int) -> io::Result<bool> {
    loop {
        // SAFETY: the fd is owned by `file` and valid for the duration of the call.
        let r = unsafe { libc::flock(file.as_raw_fd(), op) };
        if r == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) => return Ok(false),
            _ => return Err(err),
        }
    }
}

/// `lseek(fd, offset, whence)` for SEEK_DATA / SEEK_HOLE; `Ok(None)` on ENXIO (no more data).
pub fn seek_data_hole(file: &File, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    // SAFETY: the fd is owned by `file`; lseek has no memory effects.
    let r = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Flushes a directory's entries to disk.
pub fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// The system page size (the limit of legacy `mount(2)` option strings).
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let r = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if r > 0 { r as usize } else { 4096 }
}

/// Is `err` "no space left on device" (or quota exceeded)?
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// `copy_file_range` of `len` bytes at offset `off` (same offset in both files); returns the
/// bytes copied, which may be fewer (0 at end of file).
pub fn copy_range(from: &File, to: &File, off: u64, len: u64) -> io::Result<u64> {
    let mut off_in = off as libc::loff_t;
    let mut off_out = off as libc::loff_t;
    // SAFETY: both fds are owned by live `File`s; the offsets are valid writable loff_t.
    let r = unsafe {
        libc::copy_file_range(
            from.as_raw_fd(),
            &mut off_in,
            to.as_raw_fd(),
            &mut off_out,
            len as usize,
            0,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as u64)
    }
}

/// Bytes available to unprivileged users on the filesystem of `path`.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let p = cpath(path)?;
    // SAFETY: statvfs is plain old data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `p` is NUL-terminated and `st` is a valid writable buffer.
    check(unsafe { libc::statvfs(p.as_ptr(), &mut st) })?;
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

fn fd_result(r: libc::c_long) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new file descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(r as libc::c_int) })
}

/// Mounts an overlay at `target` with the new mount API: one `lowerdir+` per lower dir (Linux
/// ≥ 6.8), so neither the page-size limit of mount(2) data nor `:`/`,` escaping applies.
/// `params` are further string options (upperdir, workdir, ...).
pub fn mount_overlay_fsconfig(
    target: &Path,
    lowers: &[std::path::PathBuf],
    params: &[(&str, &Path)],
) -> io::Result<()> {
    let fstype = c"overlay";
    // SAFETY: `fstype` is NUL-terminated; fsopen takes no other pointers.
    let fs =
        fd_result(unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) })?;
    let set = |key: &str, value: &Path| -> io::Result<()> {
        let k = CString::new(key).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let v = cpath(value)?;
        // SAFETY: the fd is owned by `fs`; key and value are NUL-terminated strings.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    for l in lowers {
        set("lowerdir+", l)?;
    }
    for (k, v) in params {
        set(k, v)?;
    }
    // SAFETY: the fd is owned by `fs`; CMD_CREATE takes no key or value.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the fd is owned by `fs`; fsmount takes no pointers.
    let mnt =
        fd_result(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) })?;
    let t = cpath(target)?;
    let empty = c"";
    // SAFETY: the fd is owned by `mnt`; both paths are NUL-terminated.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mnt.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `pidfd_open(2)`: a descriptor for `pid` that stays valid (and never names another process)
/// after it exits.
pub fn pidfd_open(pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    fd_result(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })
}

/// Sends `signal` through a pidfd (no pid-reuse race).
pub fn pidfd_send_signal(pidfd: &std::os::fd::OwnedFd, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: the pidfd is open; a null siginfo means "as kill(2)".
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Waits up to `timeout` for the process of `pidfd` to exit (its pidfd turns readable);
/// true once it has.
pub fn pidfd_wait_exit(pidfd: &std::os::fd::OwnedFd, timeout: std::time::Duration) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd for the duration of the call.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0
}

/// Drops the clean cached pages of `file` from the page cache (`POSIX_FADV_DONTNEED` over the
/// whole file); its contents are unchanged.
pub fn drop_cached(file: &File) -> io::Result<()> {
    // SAFETY: `file` is an open descriptor for the call's duration; no memory is passed.
    match unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_nice() -> libc::c_int {
        // SAFETY: as in `ThreadNice::lower_to`.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn a_lowered_thread_gets_its_priority_back() {
        std::thread::spawn(|| {
            let before = own_nice();
            let guard = ThreadNice::lower_to(before + 3).unwrap();
            assert_eq!(own_nice(), before + 3);
            drop(guard);
            assert_eq!(own_nice(), before);
        })
        .join()
        .unwrap();
    }
}
