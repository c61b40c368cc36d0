//! criu-bridge: checkpoint and restore of runc containers, processes (CRIU through runc) and
//! filesystem (incremental overlay layers) at one instant, in Belayer's checkpoint format.
//! See README.md for the API overview and the on-disk format.

pub mod layer;
mod sys;
pub mod tree;
pub mod criu;
