//! CUDA VMM backend: `cuMemCreate` allocations with POSIX-fd shareable handles, exported to
//! workers and imported/mapped there (`cuMemImportFromShareableHandle`, `cuMemMap`,
//! `cuMemSetAccess`). The driver is loaded dynamically; its presence is checked before any call,
//! so a machine without one gets [`BackendError::NoDriver`] instead of a panic.

use std::ffi::c_void;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys::{
    self, CUcontext, CUdevice, CUdeviceptr, CUmemAccess_flags, CUmemAccessDesc,
    CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationProp,
    CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation, CUmemLocationType, CUresult,
};

use super::{Backend, BackendError, Integrity, Region};

fn check(step: &'static str, r: CUresult) -> Result<(), BackendError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(BackendError::Driver {
            step,
            code: r as i64,
        })
    }
}

/// Whether libcuda can be loaded (never panics).
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; no driver call is made.
    unsafe { sys::is_culib_present() }
}

/// An initialised device with its primary context current on the calling thread.
#[derive(Debug)]
pub struct CudaDevice {
    dev: CUdevice,
    ctx: CUcontext,
    granularity: usize,
}

// SAFETY: the primary context handle may be made current on any thread (`make_current`).
unsafe impl Send for CudaDevice {}

fn prop(dev: CUdevice) -> CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero is a valid value.
    let mut p: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location = CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: dev,
    };
    p
}

impl CudaDevice {
    /// Loads the driver (after checking it exists), initialises it and retains the primary
    /// context of device `ordinal`.
    pub fn open(ordinal: i32) -> Result<Self, BackendError> {
        if !driver_present() {
            return Err(BackendError::NoDriver);
        }
        let mut dev: CUdevice = 0;
        let mut ctx: CUcontext = std::ptr::null_mut();
        let mut granularity = 0usize;
        // SAFETY: the library is present (checked above); each call gets valid out-pointers to
        // locals of the right types.
        unsafe {
            check("cuInit", sys::cuInit(0))?;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let p = prop(dev);
            check(
                "cuMemGetAllocationGranularity",
                sys::cuMemGetAllocationGranularity(
                    &mut granularity,
                    &p,
                    CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                ),
            )?;
        }
        Ok(Self {
            dev,
            ctx,
            granularity: granularity.max(1),
        })
    }

    /// Makes the context current on this thread.
    pub fn make_current(&self) -> Result<(), BackendError> {
        // SAFETY: ctx is a retained primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    /// Rounds `bytes` up to the allocation granularity; a size whose rounding overflows the
    /// address space is refused.
    pub fn round(&self, bytes: u64) -> Result<usize, BackendError> {
        let g = self.granularity as u64;
        bytes
            .checked_next_multiple_of(g)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or(BackendError::TooLarge {
                bytes,
                limit: usize::MAX as u64 / g * g,
            })
    }

    /// Sticky-error check: a context in an error state fails every call, synchronize included.
    pub fn probe(&self) -> Result<(), BackendError> {
        self.make_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: current context; valid out-pointers.
        unsafe {
            check("cuCtxSynchronize", sys::cuCtxSynchronize())?;
            check("cuMemGetInfo", sys::cuMemGetInfo_v2(&mut free, &mut total))?;
        }
        Ok(())
    }
}

/// A device allocation owned by the broker, with its exported fd.
#[derive(Debug)]
pub struct CudaRegion {
    handle: CUmemGenericAllocationHandle,
    fd: OwnedFd,
    bytes: u64,
    dev: CUdevice,
}

// SAFETY: the allocation handle is a plain integer valid in any thread of this process.
unsafe impl Send for CudaRegion {}

impl CudaRegion {
    fn create(d: &CudaDevice, bytes: u64) -> Result<Self, BackendError> {
        d.make_current()?;
        let size = d.round(bytes)?;
        let p = prop(d.dev);
        let mut handle: CUmemGenericAllocationHandle = 0;
        let mut fd: i32 = -1;
        // SAFETY: current context, valid prop and out-pointers; the export writes an int fd into
        // `fd` for the POSIX handle type.
        unsafe {
            check("cuMemCreate", sys::cuMemCreate(&mut handle, size, &p, 0))?;
            let r = sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast::<c_void>(),
                handle,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            );
            if let Err(e) = check("cuMemExportToShareableHandle", r) {
                sys::cuMemRelease(handle);
                return Err(e);
            }
        }
        Ok(Self {
            handle,
            // SAFETY: the driver returned a new fd that we now own.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            bytes: size as u64,
            dev: d.dev,
        })
    }
}

impl Drop for CudaRegion {
    fn drop(&mut self) {
        // SAFETY: releases our reference to the allocation exactly once.
        unsafe { sys::cuMemRelease(self.handle) };
    }
}

/// A device allocation imported from an fd and mapped into this process's address space.
#[derive(Debug)]
pub struct CudaMapping {
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    bytes: usize,
    read_only: bool,
}

impl CudaMapping {
    /// Imports `fd` (a POSIX-fd shareable handle of `bytes` bytes) and maps it read-write on
    /// `dev`. The driver keeps the memory alive while any process holds a handle or mapping.
    pub fn import(dev: &CudaDevice, fd: BorrowedFd<'_>, bytes: u64) -> Result<Self, BackendError> {
        Self::import_with(
            dev,
            fd,
            bytes,
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        )
    }

    /// Imports `fd` like [`CudaMapping::import`] but maps it read-only (published weights), where
    /// the driver allows it; where `cuMemSetAccess` refuses `PROT_READ` for device memory, maps
    /// it read-write instead and says so ([`CudaMapping::read_only`] is false, and a warning is
    /// logged). Either way this only guards the importing process against its own stray writes:
    /// a POSIX-fd handle carries no access mode, so whoever holds the fd can map it writable.
    pub fn import_read_only(
        dev: &CudaDevice,
        fd: BorrowedFd<'_>,
        bytes: u64,
    ) -> Result<Self, BackendError> {
        match Self::import_with(
            dev,
            fd,
            bytes,
            CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        ) {
            Err(BackendError::Driver {
                step: "cuMemSetAccess",
                code,
            }) => {
                tracing::warn!(
                    code,
                    "the driver refuses read-only device mappings: mapping the weights read-write"
                );
                Self::import(dev, fd, bytes)
            }
            r => r,
        }
    }

    fn import_with(
        dev: &CudaDevice,
        fd: BorrowedFd<'_>,
        bytes: u64,
        flags: CUmemAccess_flags,
    ) -> Result<Self, BackendError> {
        dev.make_current()?;
        let size = dev.round(bytes)?;
        let mut handle: CUmemGenericAllocationHandle = 0;
        let mut ptr: CUdeviceptr = 0;
        let desc = CUmemAccessDesc {
            location: CUmemLocation {
                type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: dev.dev,
            },
            flags,
        };
        // SAFETY: current context; for the POSIX-fd handle type the OS handle argument is the
        // fd value itself; reserve/map/access get the sizes rounded to the granularity; on
        // failure everything acquired so far is released.
        unsafe {
            check(
                "cuMemImportFromShareableHandle",
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as usize as *mut c_void,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                ),
            )?;
            if let Err(e) = check(
                "cuMemAddressReserve",
                sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0),
            ) {
                sys::cuMemRelease(handle);
                return Err(e);
            }
            if let Err(e) = check("cuMemMap", sys::cuMemMap(ptr, size, 0, handle, 0)) {
                sys::cuMemAddressFree(ptr, size);
                sys::cuMemRelease(handle);
                return Err(e);
            }
            if let Err(e) = check("cuMemSetAccess", sys::cuMemSetAccess(ptr, size, &desc, 1)) {
                sys::cuMemUnmap(ptr, size);
                sys::cuMemAddressFree(ptr, size);
                sys::cuMemRelease(handle);
                return Err(e);
            }
        }
        Ok(Self {
            handle,
            ptr,
            bytes: size,
            read_only: flags == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        })
    }

    /// Whether the device forbids writes through this mapping.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Device address of the mapping.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Mapped size.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the mapping is empty (never).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Fills the mapping with a 32-bit pattern.
    pub fn fill_u32(&self, v: u32) -> Result<(), BackendError> {
        if self.read_only {
            return Err(BackendError::Unsupported(
                "writing through a read-only mapping",
            ));
        }
        // SAFETY: the range ptr..ptr+bytes is mapped read-write on the current context (checked).
        unsafe {
            check(
                "cuMemsetD32",
                sys::cuMemsetD32_v2(self.ptr, v, self.bytes / 4),
            )?;
            check("cuCtxSynchronize", sys::cuCtxSynchronize())
        }
    }

    /// Copies `dst.len()` bytes from offset `off` to host memory.
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), BackendError> {
        if off.checked_add(dst.len()).is_none_or(|e| e > self.bytes) {
            return Err(BackendError::Unsupported("read beyond the mapping"));
        }
        // SAFETY: the source range is inside the mapping (checked), dst is writable host memory.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + off as u64, dst.len())
        })
    }

    /// Checksum of the content (copied to the host in chunks).
    pub fn checksum(&self) -> Result<u64, BackendError> {
        const CHUNK: usize = 256 << 20;
        let mut host = vec![0u8; CHUNK.min(self.bytes)];
        let mut h = crate::checksum::Hasher::default();
        let mut off = 0;
        while off < self.bytes {
            let n = CHUNK.min(self.bytes - off);
            self.read(off, &mut host[..n])?;
            h.update(&host[..n]);
            off += n;
        }
        Ok(h.finish())
    }
}

impl Drop for CudaMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps and frees exactly what `import` mapped and reserved, then drops our
        // handle reference.
        unsafe {
            sys::cuMemUnmap(self.ptr, self.bytes);
            sys::cuMemAddressFree(self.ptr, self.bytes);
            sys::cuMemRelease(self.handle);
        }
    }
}

/// The CUDA backend (one device).
#[derive(Debug)]
pub struct CudaBackend {
    dev: CudaDevice,
}

impl CudaBackend {
    /// Opens device `ordinal`; fails cleanly without a driver.
    pub fn new(ordinal: i32) -> Result<Self, BackendError> {
        Ok(Self {
            dev: CudaDevice::open(ordinal)?,
        })
    }
}

impl Region for CudaRegion {
    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn handle(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn seal(&mut self, _write: bool) -> Result<(), BackendError> {
        // VMM allocations cannot be resized; write protection is not available, so the broker's
        // checksum policy verifies the weights at every takeover (integrity says unprotected).
        Ok(())
    }

    fn integrity(&self) -> Result<Integrity, BackendError> {
        // SAFETY: all-zero is a valid CUmemAllocationProp; the call fills it from our handle.
        let mut p: CUmemAllocationProp = unsafe { std::mem::zeroed() };
        // SAFETY: valid out-pointer; the handle is ours and not yet released.
        let r = unsafe { sys::cuMemGetAllocationPropertiesFromHandle(&mut p, self.handle) };
        let fd_ok = nix::sys::stat::fstat(self.fd.as_raw_fd()).is_ok();
        Ok(Integrity {
            intact: r == CUresult::CUDA_SUCCESS && fd_ok && p.location.id == self.dev,
            write_protected: false,
        })
    }

    fn checksum(&self) -> Result<u64, BackendError> {
        let d = CudaDevice::open(self.dev)?;
        CudaMapping::import_read_only(&d, self.fd.as_fd(), self.bytes)?.checksum()
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn create(&self, _label: &str, bytes: u64) -> Result<Box<dyn Region>, BackendError> {
        Ok(Box::new(CudaRegion::create(&self.dev, bytes)?))
    }

    fn probe(&self) -> Result<(), BackendError> {
        self.dev.probe()
    }
}
