//! Host-memory backend: `memfd_create` regions with seals, mapped `MAP_SHARED`.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MemFdCreateFlag, memfd_create};
use nix::sys::stat::{Mode, fchmod, fstat};
use nix::unistd::ftruncate;

use super::{Backend, BackendError, Integrity, Region};
use crate::mapping::Mapping;

fn sys(step: &'static str) -> impl FnOnce(nix::errno::Errno) -> BackendError {
    move |source| BackendError::Sys { step, source }
}

/// The host-memory backend.
#[derive(Debug, Default)]
pub struct HostBackend;

/// A memfd region.
#[derive(Debug)]
pub struct HostRegion {
    fd: OwnedFd,
    bytes: u64,
    ino: u64,
}

/// Physical memory in bytes, if `sysconf` can tell.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf reads a system constant; it takes no pointers.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    u64::try_from(pages)
        .ok()?
        .checked_mul(crate::mapping::page_size())
}

impl HostRegion {
    /// Creates a sealable memfd of `bytes` bytes. A size beyond physical memory is refused: the
    /// memfd would be sparse, and fail only later, when touched.
    pub fn create(label: &str, bytes: u64) -> Result<Self, BackendError> {
        if let Some(limit) = physical_memory()
            && bytes > limit
        {
            return Err(BackendError::TooLarge { bytes, limit });
        }
        let name = CString::new(format!("belayer-{label}")).unwrap_or_default();
        let fd = memfd_create(
            &name,
            MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
        )
        .map_err(sys("memfd_create"))?;
        let len = i64::try_from(bytes).map_err(|_| BackendError::Sys {
            step: "size",
            source: nix::errno::Errno::EINVAL,
        })?;
        ftruncate(&fd, len).map_err(sys("ftruncate"))?;
        // A memfd's inode is 0777: anyone holding even a read-only fd could reopen it writable
        // through /proc/self/fd. Owner-only, a peer of another uid cannot.
        fchmod(fd.as_raw_fd(), Mode::from_bits_truncate(0o600)).map_err(sys("fchmod"))?;
        let st = fstat(fd.as_raw_fd()).map_err(sys("fstat"))?;
        Ok(Self {
            fd,
            bytes,
            ino: st.st_ino,
        })
    }

    fn seals(&self) -> Result<SealFlag, BackendError> {
        let s = fcntl(self.fd.as_raw_fd(), FcntlArg::F_GET_SEALS).map_err(sys("F_GET_SEALS"))?;
        Ok(SealFlag::from_bits_truncate(s))
    }
}

impl Region for HostRegion {
    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn handle(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn read_only_handle(&self) -> Result<Option<OwnedFd>, BackendError> {
        // A new open file description of the same memfd, opened read-only: a writable shared
        // mapping and write(2) through it fail.
        let f =
            std::fs::File::open(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).map_err(|e| {
                BackendError::Sys {
                    step: "reopen the region read-only",
                    source: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
                }
            })?;
        Ok(Some(f.into()))
    }

    fn seal(&mut self, write: bool) -> Result<(), BackendError> {
        let mut s = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW;
        if write {
            s |= SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_SEAL;
        }
        fcntl(self.fd.as_raw_fd(), FcntlArg::F_ADD_SEALS(s)).map_err(sys("F_ADD_SEALS"))?;
        Ok(())
    }

    fn integrity(&self) -> Result<Integrity, BackendError> {
        let st = fstat(self.fd.as_raw_fd()).map_err(sys("fstat"))?;
        let seals = self.seals()?;
        let sized = seals.contains(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW);
        Ok(Integrity {
            intact: st.st_ino == self.ino && st.st_size as u64 == self.bytes && sized,
            write_protected: seals.contains(SealFlag::F_SEAL_WRITE),
        })
    }

    fn checksum(&self) -> Result<u64, BackendError> {
        let m = Mapping::new(&self.fd, self.bytes as usize, false).map_err(sys("mmap"))?;
        Ok(crate::checksum::checksum(m.bytes()))
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn create(&self, label: &str, bytes: u64) -> Result<Box<dyn Region>, BackendError> {
        Ok(Box::new(HostRegion::create(label, bytes)?))
    }

    fn probe(&self) -> Result<(), BackendError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_beyond_physical_memory_is_refused() {
        let limit = physical_memory().unwrap();
        assert!(matches!(
            HostRegion::create("t", 1 << 50),
            Err(BackendError::TooLarge { bytes, limit: l }) if bytes == 1 << 50 && l == limit
        ));
        assert!(HostRegion::create("t", limit + 1).is_err());
    }

    #[test]
    fn sealed_region_refuses_writable_maps_and_resizes() {
        let mut r = HostRegion::create("t", 1 << 16).unwrap();
        {
            let mut m = Mapping::new(r.handle(), 1 << 16, true).unwrap();
            m.bytes_mut()[5] = 9;
        }
        r.seal(true).unwrap();
        let i = r.integrity().unwrap();
        assert!(i.intact && i.write_protected);
        assert!(Mapping::new(r.handle(), 1 << 16, true).is_err());
        assert!(ftruncate(r.handle(), 10).is_err());
        let ro = Mapping::new(r.handle(), 1 << 16, false).unwrap();
        assert_eq!(ro.bytes()[5], 9);
        assert_eq!(r.checksum().unwrap(), crate::checksum::checksum(ro.bytes()));
    }
}
