//! Memory backends behind one trait: host memory (memfd) everywhere, CUDA VMM with `cuda`.

use std::os::fd::{BorrowedFd, OwnedFd};

use thiserror::Error;

pub mod host;

#[cfg(feature = "cuda")]
pub mod cuda;

/// A backend failure, naming the step.
#[derive(Debug, Error)]
pub enum BackendError {
    /// A system call failed.
    #[error("{step} failed")]
    Sys {
        /// The step.
        step: &'static str,
        /// Errno.
        #[source]
        source: nix::errno::Errno,
    },
    /// A driver call failed.
    #[error("{step} failed with driver error {code}")]
    Driver {
        /// The step.
        step: &'static str,
        /// Driver result code.
        code: i64,
    },
    /// The driver library is not installed on this machine.
    #[error("the CUDA driver library (libcuda.so) is not present on this machine")]
    NoDriver,
    /// The requested size is beyond what the backend can hold.
    #[error("a region of {bytes} bytes exceeds the {limit} bytes this backend can hold")]
    TooLarge {
        /// Requested size.
        bytes: u64,
        /// The backend's bound (host: physical memory).
        limit: u64,
    },
    /// The operation is not possible on this backend.
    #[error("{0} is not supported by this backend")]
    Unsupported(&'static str),
}

/// Result of the owner-side integrity check of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Integrity {
    /// Size and handle still what the broker recorded.
    pub intact: bool,
    /// The kernel forbids writes to the region (host seals), so its content cannot have changed.
    pub write_protected: bool,
}

/// A region of memory owned by the broker and shareable with workers by fd.
pub trait Region: Send {
    /// Size in bytes.
    fn bytes(&self) -> u64;
    /// The shareable handle, sent to workers with `SCM_RIGHTS`.
    fn handle(&self) -> BorrowedFd<'_>;
    /// A new handle to the region that only allows reading, for peers that must not write
    /// (observers, waiting shadows); `None` where the backend has none (CUDA: a POSIX-fd handle
    /// carries no access mode).
    fn read_only_handle(&self) -> Result<Option<OwnedFd>, BackendError> {
        Ok(None)
    }
    /// Fixes the size; with `write`, also forbids writes from anyone (weights after publication).
    fn seal(&mut self, write: bool) -> Result<(), BackendError>;
    /// Checks that metadata and handle are intact (owner health check).
    fn integrity(&self) -> Result<Integrity, BackendError>;
    /// Checksum of the content.
    fn checksum(&self) -> Result<u64, BackendError>;
}

/// Allocates regions and probes device health.
pub trait Backend: Send {
    /// Backend name for logs.
    fn name(&self) -> &'static str;
    /// Allocates a zeroed region.
    fn create(&self, label: &str, bytes: u64) -> Result<Box<dyn Region>, BackendError>;
    /// Device health: a probe and the sticky-error check (no-op for host memory).
    fn probe(&self) -> Result<(), BackendError>;
}
