//! criu-bridge: checkpoint and restore of runc containers, processes (CRIU through runc) and
//! filesystem (incremental overlay layers) at one instant, in Belayer's checkpoint format.
//! See README.md for the API overview and the on-disk format.

pub mod blocked;
mod checkpoint;
pub mod criu;
mod freezer;
pub mod layer;
pub mod lazy;
mod netlock;
mod restore;
mod restore_watch;
pub mod runc;
pub mod store;
mod sys;
pub mod tree;
mod watch;

pub use checkpoint::{
    CheckpointError, CheckpointRequest, DEFAULT_FROZEN_LIMIT, checkpoint_container,
    checkpoint_container_with,
};
pub use restore::{
    RestoreError, RestoreReport, RestoreRequest, check_privilege, mount_rootfs, restore_processes,
    rootfs_lowers, verify,
};
pub use store::{Checkpoint, Store, UncapturedExec};
pub use watch::Stall;
