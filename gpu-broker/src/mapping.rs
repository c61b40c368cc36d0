//! `MAP_SHARED` mappings of region fds, unmapped on drop.

use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::ptr::NonNull;

use nix::errno::Errno;
use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap, munmap};

/// The OS page size in bytes (4096 if `sysconf` cannot tell).
pub fn page_size() -> u64 {
    // SAFETY: sysconf reads a system constant; it takes no pointers.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
}

/// A shared mapping of a whole region.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory; access discipline (who writes which bytes) is the
// caller's, exactly as for a `&[u8]`/`&mut [u8]` obtained from it.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-only or read-write.
    pub fn new(fd: impl AsFd, len: usize, writable: bool) -> Result<Self, Errno> {
        let n = NonZeroUsize::new(len).ok_or(Errno::EINVAL)?;
        let prot = if writable {
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
        } else {
            ProtFlags::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel (no fixed address), over an fd we borrow
        // for the call; the memory stays valid until munmap in Drop.
        let p = unsafe { mmap(None, n, prot, MapFlags::MAP_SHARED, fd, 0)? };
        // Huge pages where the admin allows them for shmem (`shmem_enabled=advise`): fewer page
        // faults at cold load and a much cheaper page-table teardown when a worker dies.
        // SAFETY: advice on the range we just mapped; it never changes the contents.
        let _ = unsafe { madvise(p, len, MmapAdvise::MADV_HUGEPAGE) };
        Ok(Self {
            ptr: p.cast(),
            len,
            writable,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: zero-length maps are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the mapping was made writable.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len is mapped readable for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable. Panics if mapped read-only.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        assert!(self.writable, "mapping is read-only");
        // SAFETY: ptr..ptr+len is mapped read-write and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Raw base pointer (for views that split the region among owners).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from mmap and are unmapped exactly once.
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}
