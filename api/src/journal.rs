//! The action journal's entry, as the shim keeps it and `GET /v1/containers/{id}/journal`
//! answers it.

use serde::{Deserialize, Serialize};

/// One action.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    /// Position in the journal, from 1.
    pub index: u64,
    pub exec_id: String,
    pub args: Vec<String>,
    pub cwd: String,
    /// sha256 of the environment, `KEY=value` lines in order.
    pub env_sha256: String,
    pub started_unix_ms: u64,
    pub ended_unix_ms: Option<u64>,
    pub exit_code: Option<u32>,
    /// The newest checkpoint when the action started.
    pub after_checkpoint: Option<u64>,
    /// The OCI process spec, for replay.
    pub spec: serde_json::Value,
}
