//! End-to-end test harness: a private containerd (and dockerd) that tests start themselves, the
//! locally built images, and checks for anything a test leaves behind.
//!
//! A missing prerequisite (containerd, runc, an image) fails the test with a message naming it:
//! nothing here skips.

pub mod bench;
pub mod client;
pub mod containerd;
pub mod docker;
pub mod episode;
pub mod leaks;
pub mod prereq;

pub use containerd::{Containerd, Flavor, Out};
pub use docker::Docker;
