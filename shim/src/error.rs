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
            Error::ContainerNotFound(_) | Error::ExecNotFound { .. } | Error::ProcessFinished => {
                (Code::NOT_FOUND, Some("not found"))
            }
            Error::AlreadyExists(_) => (Code::ALREADY_EXISTS, Some("already exists")),
            Error::FailedPrecondition(_) => {
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
