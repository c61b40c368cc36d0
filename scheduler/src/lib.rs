//! Checkpoint scheduling for Belayer: when to checkpoint an agent's sandbox so that the checkpoint
//! falls into the idle gap while the model generates the next action (design doc §4).
//!
//! Pure logic, no I/O, no clock: the shim feeds action boundaries, hints, footprints and finished
//! checkpoints into a [`NodeScheduler`] with the time as a value, and asks it to [`decide`].
//! See `scheduler/README.md` for the model, the policy and the simulator.
//!
//! ```
//! use std::time::Duration;
//! use scheduler::*;
//!
//! let mut node = NodeScheduler::new(SchedulerConfig::default())?; // one per shim process
//! let t = Duration::from_secs_f64; // the shim's monotonic clock, as seconds since its start
//! node.on_exec_start("ctr", t(10.0)); // exec request arrived
//! node.on_exec_exit("ctr", t(11.2)); // last exec exited: an action boundary
//! let fp = Footprint { dirty_bytes: 64 << 20, resident_bytes: 512 << 20, fs_changed_bytes: 0 };
//! node.on_footprint("ctr", fp, t(11.2));
//! node.on_hint("ctr", Hint::LlmStart { expected: Some(Expected::Millis(8000)) }, t(11.3));
//! match node.decide("ctr", t(11.3)) {
//!     Decision::CheckpointNow | Decision::Force => {
//!         // ... checkpoint through criu-bridge, timing it ...
//!         node.on_checkpoint_done("ctr", CheckpointCost { footprint: fp, seconds: 0.7 })?;
//!     }
//!     Decision::Defer { reason } => println!("deferred: {reason:?}"), // see recheck_at
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`decide`]: NodeScheduler::decide

pub mod activity;
pub mod config;
pub mod cost;
pub mod gap;
pub mod node;
pub mod policy;
pub mod quantile;
pub mod retention;

pub use activity::{ActivityConfig, ActivityDetector, ActivitySample, Boundary};
pub use config::{ConfigError, CostPrior, MAX_GAP_WINDOW, SchedulerConfig};
pub use cost::{CheckpointCost, CostEstimate, CostModel, Footprint};
pub use gap::{Expected, GapPrediction, GapSource, Hint};
pub use node::{NodeScheduler, SchedError};
pub use policy::{Decision, DeferReason};
pub use retention::{CheckpointRef, RetentionPlan, plan_retention};
