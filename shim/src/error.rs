//! The shim's error type and its mapping onto ttrpc status codes (the containerd task API) and
//! HTTP statuses (the control API). Errors of criu-bridge are kept whole (`#[from]`): the code
//! is derived from their variant, and the message from the error and its sources ([`chain`]).

use std::path::PathBuf;

use containerd_shim::protos::ttrpc::{self, Code};
use criu_bridge::criu::{PrivilegeError, VersionError};
use criu_bridge::store::{CompactCheckpointError, StoreError};
use criu_bridge::{CheckpointError, RestoreError};

pub use belayer_api::report::chain;

use crate::archive::ArchiveError;

/// Every failure a task RPC or a control request can report. Messages are sentence fragments
/// that name the step and the object; containerd prefixes them with the RPC name.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("container {0} not found")]
    ContainerNotFound(String),
    #[error("process {exec_id} of container {id} not found")]
    ExecNotFound { id: String, exec_id: String },
    #[error("container {0} already exists")]
    AlreadyExists(String),
    #[error("process already finished")]
    ProcessFinished,
    #[error("container {0} has no checkpoints")]
    NoCheckpoints(String),
    #[error("a checkpoint or restore of container {0} is already in progress")]
    InProgress(String),
    /// The memory of the container's last (lazy) restore is still being filled: an automatic
    /// checkpoint yields (a later one may succeed), a requested one fails.
    #[error(
        "container {id}: criu lazy-pages (pid {pid}) is still filling the memory of its last restore"
    )]
    LazyFill {
        id: String,
        pid: i32,
        automatic: bool,
    },
    #[error(
        "container {id}: the memory of its last (lazy) restore is still being filled by criu lazy-pages (pid {pid}) after {waited:?}; try again"
    )]
    LazyFillTimeout {
        id: String,
        pid: i32,
        waited: std::time::Duration,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Compact(#[from] CompactCheckpointError),
    #[error(transparent)]
    Criu(#[from] VersionError),
    #[error(transparent)]
    Export(#[from] ExportError),
    /// A push to a registry failed; `what` names the push, `source` the step.
    #[error("{what}")]
    Registry {
        what: String,
        #[source]
        source: belayer_registry::Error,
    },
    #[error(transparent)]
    CheckpointId(#[from] belayer_api::InvalidCheckpointId),
    #[error(transparent)]
    Hint(#[from] belayer_api::UnknownHint),
    #[error("invalid request body")]
    Body(#[source] serde_json::Error),
    #[error("{}", path.display())]
    Spec {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A container whose spec makes no Kubernetes checkpoint image (`path`: the spec).
    #[error("container {id}: {} makes no Kubernetes checkpoint image", path.display())]
    KubeSpec {
        id: String,
        path: std::path::PathBuf,
        #[source]
        source: belayer_registry::error::CriSpecError,
    },
    #[error("invalid {name} annotation")]
    Annotation {
        name: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("runtime options ({type_url})")]
    RuntimeOptions {
        type_url: String,
        #[source]
        source: containerd_shim::protos::protobuf::Error,
    },
    #[error("checkpoint options")]
    CheckpointOptions(#[source] containerd_shim::protos::protobuf::Error),
    #[error("bad pid in {}", path.display())]
    BadPid {
        path: std::path::PathBuf,
        #[source]
        source: std::num::ParseIntError,
    },
    /// A blocking task of step `step` ended abnormally (a panic).
    #[error("{step}")]
    Task {
        step: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// The container died under a checkpoint; `source` is what the checkpoint met.
    #[error("container {id} died during the checkpoint; nothing was kept")]
    DiedDuringCheckpoint {
        id: String,
        #[source]
        source: Box<Error>,
    },
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unimplemented(String),
    /// runc failed; `message` is runc's own error text.
    #[error("OCI runtime {step} failed: {message}")]
    Runc { step: &'static str, message: String },
    /// runc failed because the container does not exist (any more).
    #[error("OCI runtime {step} failed: {message}")]
    RuncNoContainer { step: &'static str, message: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {source}")]
    Shim {
        context: String,
        #[source]
        source: containerd_shim::Error,
    },
}

/// Why a containerd checkpoint export ([`crate::export`]) cannot be written or imported (I/O
/// errors aside: [`Error::Io`]).
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A tool (tar) failed; `stderr` is its own error text.
    #[error("{what}: {stderr}")]
    Tool { what: String, stderr: String },
    #[error("{how} {} to {}", from.display(), to.display())]
    Place {
        how: &'static str,
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is outside the store", .0.display())]
    OutsideStore(PathBuf),
    #[error("{} is not a regular file: a Belayer export holds only files", .0.display())]
    NotAFile(PathBuf),
    #[error(
        "{} holds no checkpoint: neither a Belayer one ({archive}) nor CRIU images ({inventory})",
        path.display()
    )]
    NoCheckpoint {
        path: PathBuf,
        archive: &'static str,
        inventory: &'static str,
    },
    /// The archive is refused before anything is unpacked.
    #[error("import {}", path.display())]
    Archive {
        path: PathBuf,
        #[source]
        source: ArchiveError,
    },
    /// The unpacked checkpoints are refused before anything moves into the store.
    #[error("import {}", path.display())]
    Refused {
        path: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error(
        "import {}: container {container} has no overlay image snapshot to stack a Belayer checkpoint on",
        path.display()
    )]
    NoSnapshot { path: PathBuf, container: String },
    /// The store holds other checkpoints under the numbers the archive's take.
    #[error("{}", archive.display())]
    Clash {
        archive: PathBuf,
        #[source]
        source: StoreError,
    },
    #[error("{} holds no checkpoint of {namespace}/{container}", archive.display())]
    NotOurs {
        archive: PathBuf,
        namespace: String,
        container: String,
    },
}

impl ExportError {
    /// The kind of failure.
    pub fn kind(&self) -> Kind {
        match self {
            ExportError::NotAFile(_)
            | ExportError::NoCheckpoint { .. }
            | ExportError::Archive { .. }
            | ExportError::Refused { .. }
            | ExportError::NotOurs { .. } => Kind::InvalidArgument,
            ExportError::NoSnapshot { .. } | ExportError::Clash { .. } => Kind::FailedPrecondition,
            ExportError::Tool { .. } | ExportError::Place { .. } | ExportError::OutsideStore(_) => {
                Kind::Unknown
            }
        }
    }
}

/// Wraps an `io::Error` with the step that failed.
pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

/// Wraps a registry error with `what` the push was ([`Error::Registry`]); callable again for
/// each step of one push.
pub fn registry(what: impl Into<String>) -> impl Fn(belayer_registry::Error) -> Error {
    let what = what.into();
    move |source| Error::Registry {
        what: what.clone(),
        source,
    }
}

/// Wraps the `JoinError` of a blocking task with its step.
pub fn task(step: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Error {
    move |source| Error::Task { step, source }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure an error is, whichever layer it comes from: the ttrpc code and the HTTP
/// status follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No such container, process or checkpoint.
    NotFound,
    /// The process has exited (ttrpc NOT_FOUND, HTTP 409).
    Finished,
    /// Another checkpoint or restore is under way.
    InProgress,
    AlreadyExists,
    /// The container is not in a state that allows it.
    FailedPrecondition,
    /// Not now: a later attempt may succeed.
    Unavailable,
    DiskFull,
    /// A checkpoint is corrupt or of an unknown format.
    Corrupt,
    InvalidArgument,
    Unimplemented,
    Unknown,
}

impl Error {
    /// The kind of this error, from the variant of the error it wraps where it wraps one.
    pub fn kind(&self) -> Kind {
        match self {
            Error::ContainerNotFound(_) | Error::ExecNotFound { .. } | Error::NoCheckpoints(_) => {
                Kind::NotFound
            }
            Error::ProcessFinished => Kind::Finished,
            Error::InProgress(_) => Kind::InProgress,
            Error::LazyFill {
                automatic: true, ..
            } => Kind::Unavailable,
            Error::LazyFill { .. } | Error::LazyFillTimeout { .. } => Kind::FailedPrecondition,
            Error::Checkpoint(e) => checkpoint_kind(e),
            Error::Restore(e) => restore_kind(e),
            Error::Store(e) => store_kind(e),
            Error::Compact(CompactCheckpointError::Store(e)) => store_kind(e),
            Error::Compact(CompactCheckpointError::Corrupt { .. }) => Kind::Corrupt,
            Error::Compact(_) => Kind::Unknown,
            Error::Criu(_) => Kind::FailedPrecondition,
            Error::Export(e) => e.kind(),
            Error::Registry { source, .. } => registry_kind(source),
            Error::AlreadyExists(_) => Kind::AlreadyExists,
            Error::DiedDuringCheckpoint { .. } => Kind::FailedPrecondition,
            Error::FailedPrecondition(_) => Kind::FailedPrecondition,
            Error::InvalidArgument(_)
            | Error::CheckpointId(_)
            | Error::Hint(_)
            | Error::Body(_)
            | Error::Spec { .. }
            | Error::KubeSpec { .. }
            | Error::Annotation { .. }
            | Error::RuntimeOptions { .. }
            | Error::CheckpointOptions(_) => Kind::InvalidArgument,
            Error::Unimplemented(_) => Kind::Unimplemented,
            Error::BadPid { .. }
            | Error::Task { .. }
            | Error::Runc { .. }
            | Error::RuncNoContainer { .. }
            | Error::Io { .. }
            | Error::Shim { .. } => Kind::Unknown,
        }
    }

    /// The HTTP status of the control API for this error.
    pub fn http_status(&self) -> u16 {
        match self.kind() {
            Kind::NotFound => 404,
            Kind::Finished | Kind::InProgress | Kind::AlreadyExists | Kind::FailedPrecondition => {
                409
            }
            Kind::Unavailable => 503,
            Kind::DiskFull => 507,
            Kind::Corrupt => 422,
            Kind::InvalidArgument => 400,
            Kind::Unimplemented => 501,
            Kind::Unknown => 500,
        }
    }

    /// The error and its sources, as the control API answers them.
    pub fn message(&self) -> String {
        chain(self)
    }
}

fn checkpoint_kind(e: &CheckpointError) -> Kind {
    match e {
        CheckpointError::InProgress(_) => Kind::InProgress,
        CheckpointError::DiskFull { .. } => Kind::DiskFull,
        CheckpointError::Blocked { .. }
        | CheckpointError::Stalled { .. }
        | CheckpointError::StoppedBesideExec { .. }
        | CheckpointError::NotRefrozen { .. } => Kind::Unavailable,
        CheckpointError::Unsupported { .. }
        | CheckpointError::RemovedHardLink { .. }
        | CheckpointError::NotRunning { .. } => Kind::FailedPrecondition,
        _ => Kind::Unknown,
    }
}

fn restore_kind(e: &RestoreError) -> Kind {
    match e {
        RestoreError::Verify { .. } => Kind::Corrupt,
        RestoreError::Load(StoreError::NotFound { .. }) => Kind::NotFound,
        RestoreError::Load(_) => Kind::Corrupt,
        RestoreError::Privilege { source, .. } => match **source {
            PrivilegeError::Image(_) => Kind::Corrupt,
            _ => Kind::FailedPrecondition,
        },
        _ => Kind::Unknown,
    }
}

fn registry_kind(e: &belayer_registry::Error) -> Kind {
    use belayer_registry::Error as R;
    match e {
        R::Reference { .. } | R::ReferenceDigest { .. } | R::Refused { .. } => {
            Kind::InvalidArgument
        }
        // Dumps that make no checkpoint image (`belayer push --kube`).
        R::KubeExport { .. } => Kind::InvalidArgument,
        // The registry is there but will not have it: not now, or not with these credentials.
        R::Unauthorized { .. } | R::Credentials { .. } | R::Token { .. } => {
            Kind::FailedPrecondition
        }
        R::Transport { .. } => Kind::Unavailable,
        _ => Kind::Unknown,
    }
}

fn store_kind(e: &StoreError) -> Kind {
    match e {
        StoreError::NotFound { .. } => Kind::NotFound,
        StoreError::InChain { .. } | StoreError::UsedAsLower { .. } | StoreError::InUse { .. } => {
            Kind::FailedPrecondition
        }
        StoreError::InProgress { .. } => Kind::InProgress,
        StoreError::DiskFull { .. } => Kind::DiskFull,
        StoreError::Format(_) => Kind::Corrupt,
        _ => Kind::Unknown,
    }
}

impl From<Error> for ttrpc::Error {
    /// containerd's Go errors carry their kind as a suffix ("…: not found"); so do ours, which
    /// keeps messages identical to runc-v2's where the cause is the same.
    fn from(e: Error) -> Self {
        let (code, kind) = match e.kind() {
            Kind::NotFound | Kind::Finished => (Code::NOT_FOUND, Some("not found")),
            Kind::InProgress | Kind::FailedPrecondition => {
                (Code::FAILED_PRECONDITION, Some("failed precondition"))
            }
            Kind::DiskFull => (Code::RESOURCE_EXHAUSTED, None),
            Kind::Unavailable => (Code::UNAVAILABLE, Some("unavailable")),
            Kind::Corrupt => (Code::DATA_LOSS, None),
            Kind::AlreadyExists => (Code::ALREADY_EXISTS, Some("already exists")),
            Kind::InvalidArgument => (Code::INVALID_ARGUMENT, Some("invalid argument")),
            Kind::Unimplemented => (Code::UNIMPLEMENTED, Some("not implemented")),
            Kind::Unknown => (Code::UNKNOWN, None),
        };
        let message = match kind {
            Some(kind) => format!("{}: {kind}", e.message()),
            None => e.message(),
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn wrapped_errors_take_their_code_from_the_inner_variant() {
        let not_found = Error::from(StoreError::NotFound {
            namespace: "ns".into(),
            container: "c".into(),
            seq: 3,
        });
        assert_eq!(not_found.kind(), Kind::NotFound);
        assert_eq!(not_found.http_status(), 404);
        let full = Error::from(CheckpointError::DiskFull {
            path: PathBuf::from("/store/x"),
        });
        assert_eq!(full.http_status(), 507);
        assert!(full.message().contains("disk full"), "{}", full.message());
        let in_progress = Error::from(CheckpointError::InProgress("c".into()));
        assert_eq!(in_progress.http_status(), 409);
        let missing = Error::from(RestoreError::Load(StoreError::NotFound {
            namespace: "ns".into(),
            container: "c".into(),
            seq: 3,
        }));
        assert_eq!(missing.http_status(), 404);
    }

    #[test]
    fn the_ttrpc_message_keeps_the_sources_and_says_the_kind() {
        let e = Error::Spec {
            path: PathBuf::from("/b/config.json"),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        };
        let ttrpc::Error::RpcStatus(status) = ttrpc::Error::from(e) else {
            panic!("not a status");
        };
        assert_eq!(status.code(), Code::INVALID_ARGUMENT);
        assert!(
            status
                .message()
                .starts_with("/b/config.json: expected value")
                && status.message().ends_with(": invalid argument"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn an_automatic_checkpoint_yields_to_a_lazy_fill_a_request_fails() {
        let lazy = |automatic| Error::LazyFill {
            id: "c".into(),
            pid: 9,
            automatic,
        };
        assert_eq!(lazy(true).kind(), Kind::Unavailable);
        assert_eq!(lazy(false).http_status(), 409);
    }
}
