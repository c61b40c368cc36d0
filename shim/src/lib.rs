//! The Belayer containerd shim v2 (`io.containerd.belayer.v1`): runs sandbox containers through
//! runc and serves containerd's task API and Belayer's control API.
//!
//! Layers, each using only those below it (`tests/layers.rs` checks it):
//!
//! 1. primitives: [`error`], [`process`], [`reaper`], [`runc`], [`stdio`], [`rootfs`],
//!    [`cgroup`], [`journal`], [`spec`], [`netns`], [`criu_conf`], [`archive`], [`export`],
//!    [`busy`];
//! 2. [`container`]: one container's processes, rootfs and Belayer state;
//! 3. [`engine`]: the table of containers and every operation on them, with private state;
//! 4. adapters: [`task`] (containerd's task API), [`control`] (the control socket) and
//!    [`service`] (the shim process as containerd starts it).
//!
//! The control API's types, the annotations and the node settings are in `belayer-api`.

// 1. primitives
pub mod archive;
pub mod busy;
pub mod cgroup;
pub mod criu_conf;
pub mod error;
pub mod export;
pub mod journal;
pub mod netns;
pub mod process;
pub mod reaper;
pub mod rootfs;
pub mod runc;
pub mod spec;
pub mod stdio;
// 2. the container
pub mod container;
// 3. the engine
pub mod engine;
// 4. adapters
pub mod control;
pub mod service;
pub mod task;
