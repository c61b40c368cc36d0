//! The Belayer containerd shim v2 (`io.containerd.belayer.v1`): runs sandbox containers through
//! runc and serves containerd's task API.

pub mod api;
pub mod archive;
pub mod auto;
pub mod cgroup;
pub mod checkpoint;
pub mod cli;
pub mod container;
pub mod control;
pub mod criu_conf;
pub mod error;
pub mod export;
pub mod journal;
pub mod netns;
pub mod process;
pub mod reaper;
pub mod rootfs;
pub mod runc;
pub mod service;
pub mod settings;
pub mod spec;
pub mod stdio;
pub mod task;
