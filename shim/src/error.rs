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
    fn from(e: Error) -> Self {
        let code = match &e {
            Error::ContainerNotFound(_) | Error::ExecNotFound { .. } | Error::ProcessFinished => {
                Code::NOT_FOUND
            }
            Error::AlreadyExists(_) => Code::ALREADY_EXISTS,
            Error::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            Error::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            Error::Unimplemented(_) => Code::UNIMPLEMENTED,
            Error::Runc { .. } | Error::Io { .. } | Error::Shim { .. } => Code::UNKNOWN,
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, e.to_string()))
    }
}
