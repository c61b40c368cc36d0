//! The action journal's entry, as the shim keeps it and `GET /v1/containers/{id}/journal`
//! answers it.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Suffix of a container's journal file of checkpoint positions (checkpoint id → actions
/// completed at its instant, a JSON object), beside its entries in the journal dir.
pub const POSITIONS_SUFFIX: &str = ".checkpoints.json";

/// Container `id`'s positions file in journal dir `dir` (the shim writes it at each checkpoint;
/// `belayer pull` seeds it with the pulled checkpoint's position).
pub fn positions_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}{POSITIONS_SUFFIX}"))
}

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
