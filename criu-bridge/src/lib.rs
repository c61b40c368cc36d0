//! criu-bridge: checkpoint and restore of runc containers, processes (CRIU through runc) and
//! filesystem (incremental overlay layers) at one instant, in Belayer's checkpoint format.
//! See README.md for the API overview and the on-disk format.

pub mod layer;
mod sys;
pub mod tree;
pub mod criu;
pub mod runc;
pub mod store;
mod checkpoint;
mod restore;

pub use checkpoint::{CheckpointError, CheckpointRequest, checkpoint_container};
pub use restore::{
    RestoreError, RestoreReport, RestoreRequest, mount_rootfs, restore_processes, rootfs_lowers, verify,
};
pub use store::{Checkpoint, Store};
