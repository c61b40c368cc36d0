//! The control API every shim serves on a root-only Unix socket, HTTP/1.1 + JSON, one request per
//! connection. Shared by the server (the shim's `control` module) and the `belayer` CLI.
//!
//! | request | body | answer |
//! | --- | --- | --- |
//! | `POST /v1/containers/{id}/checkpoint` | [`CheckpointRequest`] | [`CheckpointInfo`] |
//! | `GET /v1/containers/{id}/checkpoints` | | `[CheckpointInfo]`, oldest first |
//! | `GET /v1/containers/{id}/checkpoints/{cp}` | | [`CheckpointInfo`] |
//! | `DELETE /v1/containers/{id}/checkpoints/{cp}` | | `{}` |
//! | `POST /v1/containers/{id}/restore` | [`RestoreRequest`] | [`RestoreInfo`] |
//! | `POST /v1/containers/{id}/hint` | [`HintRequest`] | `{}` |
//! | `GET /v1/containers/{id}/status` | | [`Status`] |
//! | `GET /v1/containers/{id}/journal` | | `[`[`journal::Entry`](crate::journal::Entry)`]` |
//! | `POST /v1/containers/{id}/push` | [`PushRequest`] | [`PushInfo`] |
//!
//! Errors answer 400 (bad request), 404 (no such container or checkpoint), 409 (another
//! checkpoint or restore in progress, or the container is not running), 422 (the checkpoint is
//! corrupt or of an unknown format), 507 (the store's disk is full) or 500, with
//! [`ErrorBody`].

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where the shim hosting container `id` of `namespace` listens.
pub fn socket_path(namespace: &str, id: &str) -> PathBuf {
    Path::new("/run/belayer/ctl")
        .join(namespace)
        .join(format!("{id}.sock"))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestoreOptions {
    /// Namespace and container whose checkpoint is restored (a fork's source).
    pub namespace: String,
    pub container: String,
    pub checkpoint: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CheckpointRequest {
    /// Stop the processes after the dump (CRIU's default), instead of leaving them running.
    #[serde(default)]
    pub exit: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RestoreRequest {
    /// The checkpoint to restore; the newest when absent.
    #[serde(default)]
    pub checkpoint: Option<u64>,
}

/// `belayer push`: a checkpoint (the newest when absent) pushed to an OCI registry as an
/// artifact (belayer-registry's README has the format).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PushRequest {
    #[serde(default)]
    pub checkpoint: Option<u64>,
    /// `host[:port]/repository:tag` (or `@sha256:…`, which must be the manifest's digest).
    pub reference: String,
    /// The registry's credentials, as the client read them (its docker config); `None`: none.
    #[serde(default)]
    pub credentials: Option<RegistryCredentials>,
    /// Plain HTTP to any host, not only loopback (TLS is not implemented yet).
    #[serde(default)]
    pub plain_http: bool,
    /// `belayer push --kube`: push the checkpoint as a Kubernetes checkpoint image (what a pod
    /// restores from through CRI), with these dumps beside it, instead of as Belayer's artifact.
    #[serde(default)]
    pub kube: Option<KubeDumps>,
}

/// The files CRI's checkpoint archive holds beside the checkpoint (`config.dump`, `spec.dump`,
/// `status.dump`), which the CLI makes from containerd's records of the container
/// (belayer-registry's `kube::ContainerRecords`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KubeDumps {
    pub config: String,
    pub spec: String,
    pub status: String,
}

/// The prefix of a push's staging directory (its export) in the store root; the shim's pid
/// and a stamp follow. One left by a process that died is removed by the next import or push.
pub const PUSH_STAGING_PREFIX: &str = ".tmp-push-";
/// The prefix of a pull's staging directory in the store root; the CLI's pid and a stamp follow.
pub const PULL_STAGING_PREFIX: &str = ".tmp-pull-";

/// A user and password for a registry. Never logged or printed (its `Debug` hides the password).
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct RegistryCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryCredentials")
            .field("username", &self.username)
            .field("password", &"…")
            .finish()
    }
}

/// What a push did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PushInfo {
    pub container: String,
    pub checkpoint: String,
    /// The reference pushed, pinned to the manifest's digest (`host/repo:tag@sha256:…`).
    pub reference: String,
    /// The manifest's digest.
    pub digest: String,
    /// Blobs uploaded (the config included) and their bytes.
    pub uploaded: usize,
    pub uploaded_bytes: u64,
    /// Blobs the registry had already (older members of the chain) and their bytes.
    pub skipped: usize,
    pub skipped_bytes: u64,
    /// Actions the container had completed at the checkpoint's instant (its journal), carried
    /// in the artifact for the pulling node to report.
    #[serde(default)]
    pub journal_position: Option<u64>,
    /// Export into a private directory, and the push (split into blobs, upload), milliseconds.
    pub export_ms: u64,
    pub push_ms: u64,
}

/// A checkpoint as `inspect` shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CheckpointInfo {
    pub id: String,
    pub container: String,
    pub namespace: String,
    pub path: PathBuf,
    pub parent: Option<String>,
    /// The checkpoint's instant (its freeze began), milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Checkpoints whose filesystem layers this one's rootfs stacks, newest first.
    pub fs_chain: Vec<String>,
    pub leave_running: bool,
    /// Exec'd processes running at the checkpoint instant, which it does not hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncaptured_execs: Vec<criu_bridge::UncapturedExec>,
    pub sizes: serde_json::Value,
    pub timings: serde_json::Value,
    pub criu_stats: serde_json::Value,
}

impl From<&criu_bridge::Checkpoint> for CheckpointInfo {
    fn from(cp: &criu_bridge::Checkpoint) -> Self {
        let m = &cp.manifest;
        Self {
            id: m.seq.to_string(),
            container: m.container.clone(),
            namespace: m.namespace.clone(),
            path: cp.dir.clone(),
            parent: m.parent.map(|p| p.to_string()),
            created_unix_ms: m.created_unix_ms,
            fs_chain: m.fs_chain.iter().map(u64::to_string).collect(),
            leave_running: m.leave_running,
            uncaptured_execs: m.uncaptured_execs.clone(),
            sizes: serde_json::to_value(&m.sizes).unwrap_or_default(),
            timings: serde_json::to_value(&m.timings).unwrap_or_default(),
            criu_stats: serde_json::to_value(&m.criu_stats).unwrap_or_default(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RestoreInfo {
    pub container: String,
    pub checkpoint: String,
    pub pid: u32,
    /// Verification, rootfs mount and CRIU restore, milliseconds.
    pub verify_ms: u64,
    pub mount_ms: u64,
    pub restore_ms: u64,
    pub total_ms: u64,
    /// The processes ran before their memory was filled (a `criu lazy-pages` daemon fills it).
    #[serde(default)]
    pub lazy_pages: bool,
    /// Which journalled actions the environment now reflects.
    pub position: Option<crate::policy::Position>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// A checkpoint id that is not one.
#[derive(Debug, thiserror::Error)]
#[error("invalid checkpoint id {0:?}: ids are the numbers `belayer checkpoints` lists")]
pub struct InvalidCheckpointId(pub String);

/// Parses a checkpoint id as the CLI and API spell it.
pub fn parse_checkpoint_id(s: &str) -> Result<u64, InvalidCheckpointId> {
    s.parse().map_err(|_| InvalidCheckpointId(s.to_string()))
}

/// A hint that is neither `llm-start` nor `llm-end`.
#[derive(Debug, thiserror::Error)]
#[error("unknown hint {0:?}: use llm-start or llm-end")]
pub struct UnknownHint(pub String);

/// A hint from the agent loop: `llm-start` (optionally with the expected generation time or
/// tokens) when the model starts generating the next action, `llm-end` when it is done.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HintRequest {
    pub hint: String,
    #[serde(default)]
    pub expected_ms: Option<u64>,
    #[serde(default)]
    pub expected_tokens: Option<u64>,
}

impl HintRequest {
    /// The scheduler's hint this request carries.
    pub fn to_hint(&self) -> Result<scheduler::Hint, UnknownHint> {
        use scheduler::{Expected, Hint};
        match self.hint.as_str() {
            "llm-start" => Ok(Hint::LlmStart {
                expected: self
                    .expected_ms
                    .map(Expected::Millis)
                    .or(self.expected_tokens.map(Expected::Tokens)),
            }),
            "llm-end" => Ok(Hint::LlmEnd),
            other => Err(UnknownHint(other.to_string())),
        }
    }
}

/// What `belayer status` shows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub container: String,
    pub namespace: String,
    pub pid: u32,
    pub policy: crate::policy::ContainerPolicy,
    pub checkpoints: Vec<String>,
    /// Actions journalled (completed ones).
    pub actions: u64,
    /// Where the journal stands after the last restore.
    pub position: Option<crate::policy::Position>,
    pub recoveries: Vec<crate::policy::Recovery>,
    /// Why the shim last killed the container itself: the `criu lazy-pages` daemon filling the
    /// memory of a lazy restore died first, so the processes' memory was incomplete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fill_failure: Option<String>,
    /// Hints this container's control socket took (from `belayer hint` or `belayer gateway`).
    #[serde(default)]
    pub hints: HintStats,
    /// Where the automatic replication of its checkpoints stands (`io.belayer.replicate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationStatus>,
}

/// Where a container's automatic replication to a registry stands: what a node loss now would
/// lose is `behind`, the checkpoints newer than the newest replicated one.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ReplicationStatus {
    /// The repository (`host[:port]/path`).
    pub repository: String,
    /// Checkpoints this shim pushed, oldest first (each as `REPO:<container>-<checkpoint>`).
    pub replicated: Vec<String>,
    /// The newest replicated checkpoint, and its reference pinned by digest (also tagged
    /// `REPO:<container>`).
    pub newest: Option<String>,
    pub newest_reference: Option<String>,
    /// Checkpoints in the store newer than [`ReplicationStatus::newest`] (all of them when none
    /// is replicated): not yet off the node.
    pub behind: Vec<String>,
    /// How long the oldest of `behind` has waited (since it was taken), ms; 0 when none.
    pub behind_ms: u64,
    /// The checkpoint being pushed now.
    pub pushing: Option<String>,
    /// Pushes that succeeded and failed.
    pub pushes: u64,
    pub failures: u64,
    /// Why the last push failed, until one succeeds.
    pub last_error: Option<String>,
    /// For a pod's container (CRI made it): the newest checkpoint also pushed as a Kubernetes
    /// checkpoint image (`REPO:<container>-<checkpoint>-kube`, also tagged
    /// `REPO:<container>-kube` and `REPO:<namespace>_<pod>_<container>-kube`), and that image's
    /// reference pinned by digest.
    #[serde(default)]
    pub kube_checkpoint: Option<String>,
    #[serde(default)]
    pub kube_reference: Option<String>,
    /// Those image pushes that succeeded and failed (a failed one leaves the artifact's
    /// replication as it was).
    #[serde(default)]
    pub kube_pushes: u64,
    #[serde(default)]
    pub kube_failures: u64,
    /// Why the last image push failed, until one succeeds.
    #[serde(default)]
    pub kube_last_error: Option<String>,
}

/// What the control socket saw of a container's hints since its shim started serving it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HintStats {
    /// Hints accepted.
    pub received: u64,
    /// The last hint accepted (`llm-start` or `llm-end`) and when.
    pub last: Option<String>,
    pub last_unix_ms: Option<u64>,
    /// The last `llm-start`'s expectation.
    pub last_expected_ms: Option<u64>,
    pub last_expected_tokens: Option<u64>,
    /// An `llm-start` came and no `llm-end` since.
    pub llm_in_flight: bool,
}

impl HintStats {
    /// Counts an accepted hint.
    pub fn record(&mut self, hint: &HintRequest) {
        self.received += 1;
        self.last = Some(hint.hint.clone());
        self.last_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_millis() as u64);
        self.llm_in_flight = hint.hint == "llm-start";
        if self.llm_in_flight {
            self.last_expected_ms = hint.expected_ms;
            self.last_expected_tokens = hint.expected_tokens;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_ids_are_numbers() {
        assert_eq!(parse_checkpoint_id("12").unwrap(), 12);
        let e = parse_checkpoint_id("latest").unwrap_err();
        assert!(e.to_string().contains("\"latest\""), "{e}");
    }

    #[test]
    fn hints_map_onto_the_scheduler_s() {
        let start = HintRequest {
            hint: "llm-start".into(),
            expected_ms: Some(1500),
            expected_tokens: Some(10),
        };
        assert!(matches!(
            start.to_hint().unwrap(),
            scheduler::Hint::LlmStart {
                expected: Some(scheduler::Expected::Millis(1500))
            }
        ));
        let end = HintRequest {
            hint: "llm-end".into(),
            ..Default::default()
        };
        assert!(matches!(end.to_hint().unwrap(), scheduler::Hint::LlmEnd));
        let bad = HintRequest {
            hint: "llm-middle".into(),
            ..Default::default()
        };
        assert!(bad.to_hint().is_err());
    }

    #[test]
    fn hint_stats_count_and_track_the_generation_in_flight() {
        let mut stats = HintStats::default();
        stats.record(&HintRequest {
            hint: "llm-start".into(),
            expected_ms: Some(10),
            expected_tokens: None,
        });
        assert!(stats.llm_in_flight);
        assert_eq!(stats.last_expected_ms, Some(10));
        stats.record(&HintRequest {
            hint: "llm-end".into(),
            ..Default::default()
        });
        assert_eq!(stats.received, 2);
        assert!(!stats.llm_in_flight);
        assert_eq!(stats.last.as_deref(), Some("llm-end"));
        // An end keeps the last start's expectation.
        assert_eq!(stats.last_expected_ms, Some(10));
    }
}
