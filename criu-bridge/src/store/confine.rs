//! Confinement of the paths a manifest names: each resolves inside its checkpoint's own dir (and
//! a checkpoint dir inside its store), with no absolute path, no `..` and no symlink in any
//! component (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`). A manifest can come from
//! an imported archive: it is checked before anything is created, moved or mounted by its name.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::StoreError;

/// Checkpoint ids are below this (2^32): the next id of a container is always computed without
/// wrapping, whatever an imported archive names.
pub const MAX_SEQ: u64 = 1 << 32;

/// Why a relative path is refused by its text alone, if it is.
pub(crate) fn lexical_fault(rel: &str) -> Option<&'static str> {
    if rel.is_empty() {
        return Some("is empty");
    }
    if rel.starts_with('/') {
        return Some("is absolute");
    }
    if rel.contains('\0') {
        return Some("holds a NUL byte");
    }
    for part in rel.split('/') {
        match part {
            ".." => return Some("climbs out with '..'"),
            "" | "." => return Some("has an empty or '.' component"),
            _ => {}
        }
    }
    None
}

/// The kernel's `struct open_how` (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `rel` (relative, checked by [`lexical_fault`]) beneath the directory `base` as an
/// `O_PATH` descriptor, never through a symlink: `ELOOP` when a component is one, `EXDEV` when it
/// would leave `base`.
pub(crate) fn open_beneath(base: &Path, rel: &str) -> io::Result<OwnedFd> {
    let dir = File::open(base)?;
    let name = CString::new(rel).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // No O_NOFOLLOW: with it, a trailing symlink would be opened itself instead of refused.
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: `dir` is an open directory, `name` a NUL-terminated string and `how` a valid
    // `open_how` whose size is passed; the kernel only reads them.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ENOSYS) {
            return walk_beneath(dir, rel);
        }
        return Err(err);
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// [`open_beneath`] for kernels without `openat2` (before 5.6): one component at a time,
/// refusing a symlink at each.
fn walk_beneath(dir: File, rel: &str) -> io::Result<OwnedFd> {
    let mut at: OwnedFd = dir.into();
    for part in rel.split('/') {
        let name = CString::new(part).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: `at` is an open descriptor and `name` a NUL-terminated string.
        let fd = unsafe {
            libc::openat(
                at.as_raw_fd(),
                name.as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `openat` returned a new descriptor that nothing else owns.
        let next = unsafe { OwnedFd::from_raw_fd(fd) };
        if File::from(next.try_clone()?).metadata()?.is_symlink() {
            return Err(io::Error::from_raw_os_error(libc::ELOOP));
        }
        at = next;
    }
    Ok(at)
}

/// Refuses ([`StoreError::Unconfined`]) a path `rel` named by `what` that is not confined to
/// `base`; one that does not exist (yet) is confined when its text is. `Ok(true)` when it exists.
pub(crate) fn check_beneath(
    base: &Path,
    what: &'static str,
    rel: &str,
) -> Result<bool, StoreError> {
    let unconfined = |why: &'static str| StoreError::Unconfined {
        base: base.into(),
        what,
        path: rel.into(),
        why,
    };
    if let Some(why) = lexical_fault(rel) {
        return Err(unconfined(why));
    }
    match open_beneath(base, rel) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            Err(unconfined("goes through a symlink"))
        }
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => Err(unconfined("leaves it")),
        Err(e) => Err(StoreError::io("resolve", &base.join(rel), e)),
    }
}
