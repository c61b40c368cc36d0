//! Belayer checkpoints in an OCI registry: a small distribution-spec client (plain HTTP;
//! Basic and Bearer auth with docker's credentials) and the mapping of a checkpoint export onto
//! an OCI artifact, one blob per chain member, so that pushing a later checkpoint of a chain
//! uploads only what is new. See the crate's README for the design.

pub mod auth;
pub mod checkpoint;
pub mod client;
pub mod digest;
pub mod error;
pub mod kube;
pub mod oci;
pub mod reference;
pub mod tar;
#[cfg(feature = "testing")]
pub mod testing;

pub use checkpoint::{PullLimits, PushReport, pull_to_archive, push_archive_parts};
pub use client::{Client, ClientOptions, PlainHttp};
pub use digest::Digest;
pub use error::Error;
pub use reference::Reference;
