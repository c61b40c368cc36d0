//! Checkpoint scheduling for Belayer: when to checkpoint an agent's sandbox so that the checkpoint
//! falls into the idle gap while the model generates the next action (design doc §4).
//!
//! Pure logic, no I/O, no clock: the shim feeds action boundaries, hints, footprints and finished
//! checkpoints into a [`NodeScheduler`] with the time as a value, and asks it to [`decide`].
//! See `scheduler/README.md` for the model, the policy and the simulator.
//!
//! [`decide`]: NodeScheduler::decide

pub mod config;
pub mod cost;
pub mod gap;
pub mod node;
pub mod policy;
pub mod quantile;
pub mod retention;

pub use config::{ConfigError, CostPrior, SchedulerConfig};
pub use cost::{CheckpointCost, CostEstimate, CostModel, Footprint};
pub use gap::{Expected, GapPrediction, GapSource, Hint};
pub use node::{NodeScheduler, SchedError};
pub use policy::{Decision, DeferReason};
pub use retention::{CheckpointRef, RetentionPlan, plan_retention};
