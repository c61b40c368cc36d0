//! The shim's error type and its mapping onto ttrpc status codes at the RPC boundary.

use containerd_shim::protos::ttrpc::{self, Code};

/// Every failure a task RPC can report. Messages are sentence fragments that name the step
/// and the object; containerd prefixes them with the RPC name.
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
    #[error("{0}")]
    CheckpointNotFound(String),
    #[error("a checkpoint or restore of container {0} is already in progress")]
    InProgress(String),
    #[error("{0}")]
    DiskFull(String),
    /// A task of the container cannot be stopped for a checkpoint now; the container runs and
    /// a later attempt may succeed.
    #[error("{0}")]
    Blocked(String),
    /// A task of the container is one CRIU cannot checkpoint (stopped under the cgroup v1
    /// freezer, or traced); nothing was frozen. A checkpoint can be taken once it is not.
    #[error("{0}")]
    Unsupported(String),
    /// A checkpoint kept its container frozen past `frozen_limit_ms` and was abandoned; the
    /// container runs. An automatic checkpoint backs off.
    #[error("{0}")]
    Stalled(String),
    #[error("{0}")]
    Corrupt(String),
    #[error("{0}")]
    Checkpoint(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("OCI runtime {step} failed: {message}")]
    Runc { step: &'static str, message: String },
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

/// Wraps an `io::Error` with the step that failed.
pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for ttrpc::Error {
    /// containerd's Go errors carry their kind as a suffix ("…: not found"); so do ours, which
    /// keeps messages identical to runc-v2's where the cause is the same.
    fn from(e: Error) -> Self {
        let (code, kind) = match &e {
            Error::ContainerNotFound(_)
            | Error::ExecNotFound { .. }
            | Error::ProcessFinished
            | Error::CheckpointNotFound(_) => (Code::NOT_FOUND, Some("not found")),
            Error::InProgress(_) => (Code::FAILED_PRECONDITION, Some("failed precondition")),
            Error::DiskFull(_) => (Code::RESOURCE_EXHAUSTED, None),
            Error::Blocked(_) | Error::Stalled(_) => (Code::UNAVAILABLE, Some("unavailable")),
            Error::Corrupt(_) => (Code::DATA_LOSS, None),
            Error::Checkpoint(_) => (Code::UNKNOWN, None),
            Error::AlreadyExists(_) => (Code::ALREADY_EXISTS, Some("already exists")),
            Error::FailedPrecondition(_) | Error::Unsupported(_) => {
                (Code::FAILED_PRECONDITION, Some("failed precondition"))
            }
            Error::InvalidArgument(_) => (Code::INVALID_ARGUMENT, Some("invalid argument")),
            Error::Unimplemented(_) => (Code::UNIMPLEMENTED, Some("not implemented")),
            Error::Runc { .. } | Error::Io { .. } | Error::Shim { .. } => (Code::UNKNOWN, None),
        };
        let message = match kind {
            Some(kind) => format!("{e}: {kind}"),
            None => e.to_string(),
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, message))
    }
}

impl Error {
    /// The HTTP status of the control API for this error.
    pub fn http_status(&self) -> u16 {
        match self {
            Error::ContainerNotFound(_)
            | Error::ExecNotFound { .. }
            | Error::CheckpointNotFound(_) => 404,
            Error::InProgress(_)
            | Error::FailedPrecondition(_)
            | Error::Unsupported(_)
            | Error::ProcessFinished
            | Error::AlreadyExists(_) => 409,
            Error::Corrupt(_) => 422,
            Error::DiskFull(_) => 507,
            Error::Blocked(_) | Error::Stalled(_) => 503,
            Error::InvalidArgument(_) => 400,
            Error::Unimplemented(_) => 501,
            _ => 500,
        }
    }
}
