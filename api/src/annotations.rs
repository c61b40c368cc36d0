//! The OCI annotations Belayer reads from a container's spec, and the event topic it publishes.

/// OCI annotation that makes a shim restore a checkpoint at task start instead of running the
/// spec's process (value: JSON [`RestoreOptions`](crate::RestoreOptions)). The CLI sets it in the
/// spec of forks, and of a container without a task for the time of its restore. (containerd
/// refuses task options of types it does not know, so the spec carries it.)
pub const RESTORE_ANNOTATION: &str = "io.belayer.restore";

/// OCI annotation naming a group of containers that share one shim process (as a Kubernetes
/// pod's do): the forks of one `belayer fork` carry it, so N forks start one shim, not N.
pub const SHIM_GROUP_ANNOTATION: &str = "io.belayer.shim-group";

/// `auto`: checkpoint the container automatically at action boundaries (default: the node
/// settings' `checkpoint`).
pub const CHECKPOINT_ANNOTATION: &str = "io.belayer.checkpoint";

/// `auto`: restore the newest checkpoint when the init dies on its own (default: the node
/// settings' `recover`).
pub const RECOVER_ANNOTATION: &str = "io.belayer.recover";

/// `rewind` or `replay`: what a restore does with the journalled actions the checkpoint does not
/// reflect (default: the node settings' `policy`).
pub const POLICY_ANNOTATION: &str = "io.belayer.policy";

/// Checkpoints kept by automatic checkpointing (default: the node settings' `keep`).
pub const KEEP_ANNOTATION: &str = "io.belayer.keep";

/// `exec` or `activity`: where automatic checkpointing finds action boundaries — each exec, or
/// the container's cgroup CPU and I/O (default: the node settings' `actions`).
pub const ACTIONS_ANNOTATION: &str = "io.belayer.actions";

/// A registry repository (`host[:port]/path`) every automatic checkpoint is pushed to, in the
/// background: as `REPO:<container>-<checkpoint>` and `REPO:<container>`, the newest replicated
/// (default: the node settings' `[replication] repository`; `off`: none).
pub const REPLICATE_ANNOTATION: &str = "io.belayer.replicate";

/// Topic of the event a shim publishes when it recovered a container (a `TaskStart` with the new
/// pid).
pub const RECOVERED_TOPIC: &str = "/tasks/belayer/recovered";
