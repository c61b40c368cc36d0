//! What the Belayer shim, the `belayer` CLI and the test suites share: the control API's request
//! and response types ([`control`], re-exported at the root), the per-container policy and
//! recovery records ([`policy`]), the OCI annotation names ([`annotations`]), the action journal's
//! entry ([`journal`]), the node settings ([`settings`]) and how an error is shown in one line
//! ([`report`]).
//!
//! No I/O beyond reading the settings file: the server is in the shim, the client in the CLI.

pub mod annotations;
pub mod control;
pub mod journal;
pub mod policy;
pub mod report;
pub mod settings;

/// The containerd runtime name of the Belayer shim.
pub const RUNTIME_ID: &str = "io.containerd.belayer.v1";

pub use annotations::{RESTORE_ANNOTATION, SHIM_GROUP_ANNOTATION};
pub use control::*;
pub use policy::{ContainerPolicy, Position, Recovery};
pub use settings::Settings;
