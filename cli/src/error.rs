//! The CLI's errors and the exit codes they map to.
//!
//! | exit | meaning | control API status |
//! | --- | --- | --- |
//! | 0 | success | 200 |
//! | 1 | any other failure | 500 and others |
//! | 2 | bad command line (clap) | |
//! | 3 | no such container or checkpoint | 404 |
//! | 4 | conflict: another checkpoint or restore under way, the container is not running, or has no Belayer task | 409 |
//! | 5 | the checkpoint is corrupt or of an unknown format | 422 |
//! | 6 | try again later: a task could not be stopped now, or the checkpoint was abandoned at its frozen bound | 503 |
//! | 7 | the store's disk is full | 507 |
//! | 8 | invalid argument | 400 |

use std::path::PathBuf;
use std::process::ExitCode;

use containerd_client::tonic;
use criu_bridge::store::StoreError;

/// Every failure of a `belayer` command; printed as one line, `belayer: ` and the error with its
/// sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A shim's control API answered with an error `status`.
    #[error("{message}")]
    Api { status: u16, message: String },
    #[error("container {id} not found in namespace {namespace}")]
    ContainerNotFound { id: String, namespace: String },
    #[error(
        "container {0} has no running Belayer task (not started, or not run with runtime io.containerd.belayer.v1)"
    )]
    NoTask(String),
    #[error("container {0} has no checkpoints")]
    NoCheckpoints(String),
    #[error(
        "container {id} runs with runtime {runtime:?}, not {}",
        belayer_api::RUNTIME_ID
    )]
    OtherRuntime { id: String, runtime: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    CheckpointId(#[from] belayer_api::InvalidCheckpointId),
    #[error(transparent)]
    Settings(#[from] belayer_api::settings::SettingsError),
    #[error("cannot connect to containerd at {}", address.display())]
    Connect {
        address: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// containerd refused `step` (`create task c1`, `update container c1`, ...).
    #[error("{step}: {}", status.message())]
    Containerd { step: String, status: tonic::Status },
    /// `belayer push --kube` of a container CRI does not serve (not a Kubernetes container).
    #[error(
        "container {id} is not a Kubernetes (CRI) container: containerd's CRI plugin does not know it ({})",
        status.message()
    )]
    NotKube { id: String, status: tonic::Status },
    /// `belayer push --kube` of a container whose records make no Kubernetes checkpoint image.
    #[error("container {id}: containerd's records make no Kubernetes checkpoint image")]
    KubeRecords {
        id: String,
        #[source]
        source: belayer_registry::error::CriArchiveError,
    },
    /// A container record's spec cannot be read or written.
    #[error("spec of {id}")]
    Spec {
        id: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("container {0} has no spec")]
    NoSpec(String),
    #[error("cannot reach the shim of {container} at {}", socket.display())]
    Unreachable {
        container: String,
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control socket")]
    ControlIo(#[source] std::io::Error),
    #[error("control socket")]
    Http(#[source] hyper::Error),
    #[error("control socket: cannot build the request")]
    Request(#[source] hyper::http::Error),
    #[error("control socket: unreadable answer")]
    Unreadable(#[source] serde_json::Error),
    #[error("print the answer")]
    Print(#[source] serde_json::Error),
    #[error("control socket: no answer within {0:?}")]
    TimedOut(std::time::Duration),
    #[error("{0} thread panicked")]
    Panicked(&'static str),
    #[error(transparent)]
    Gateway(#[from] crate::gateway::GatewayError),
    /// A registry step of `belayer push` or `pull` failed; `what` names the verb and reference.
    #[error("{what}")]
    Registry {
        what: String,
        #[source]
        source: belayer_registry::Error,
    },
    /// A pull's private directory in the store cannot be made.
    #[error("pull: prepare {}", path.display())]
    PullStaging {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `belayer pull --into` names a container that already has a task.
    #[error(
        "container {0} already has a task: pull --into restores into a container created without one (ctr container create)"
    )]
    HasTask(String),
    /// `belayer pull --into` names a container without an image snapshot to restore onto.
    #[error(
        "container {0} has no image snapshot: create it from the checkpointed container's image (ctr container create IMAGE ID)"
    )]
    NoSnapshot(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Exit codes (see the module docs).
pub const NOT_FOUND: u8 = 3;
pub const CONFLICT: u8 = 4;
pub const CORRUPT: u8 = 5;
pub const RETRY: u8 = 6;
pub const DISK_FULL: u8 = 7;
pub const INVALID: u8 = 8;
pub const OTHER: u8 = 1;

/// The exit code of a control API status.
pub fn exit_code_of_status(status: u16) -> u8 {
    match status {
        404 => NOT_FOUND,
        409 => CONFLICT,
        422 => CORRUPT,
        503 => RETRY,
        507 => DISK_FULL,
        400 => INVALID,
        _ => OTHER,
    }
}

impl Error {
    /// The control API's HTTP status this error stands for (the shim's own, or the one the same
    /// cause gets there).
    pub fn status(&self) -> u16 {
        match self {
            Error::Api { status, .. } => *status,
            Error::ContainerNotFound { .. } | Error::NoCheckpoints(_) => 404,
            Error::NoTask(_) | Error::OtherRuntime { .. } => 409,
            Error::Store(e) => store_status(e),
            Error::CheckpointId(_) => 400,
            Error::Containerd { status, .. } => match status.code() {
                tonic::Code::NotFound => 404,
                tonic::Code::AlreadyExists | tonic::Code::FailedPrecondition => 409,
                tonic::Code::InvalidArgument => 400,
                tonic::Code::Unavailable => 503,
                _ => 500,
            },
            Error::Gateway(e) if e.is_invalid_argument() => 400,
            Error::Registry { source, .. } => registry_status(source),
            Error::HasTask(_) | Error::NoSnapshot(_) => 409,
            Error::NotKube { .. } | Error::KubeRecords { .. } => 400,
            _ => 500,
        }
    }

    /// The process's exit code for this error (see the module docs).
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(exit_code_of_status(self.status()))
    }
}

/// The control API's status for a registry error (the shim answers the same for a push).
fn registry_status(e: &belayer_registry::Error) -> u16 {
    use belayer_registry::Error as R;
    match e {
        R::Reference { .. } | R::ReferenceDigest { .. } | R::Refused { .. } => 400,
        R::Unauthorized { .. } | R::Credentials { .. } | R::Token { .. } => 409,
        R::Transport { .. } => 503,
        R::PullManifest { status: 404, .. } | R::PullBlob { status: 404, .. } => 404,
        // Content that is not what its digest or manifest says: a corrupt checkpoint.
        R::BlobDigest { .. }
        | R::BlobSize { .. }
        | R::BadManifest { .. }
        | R::Layout { .. }
        | R::Archive { .. } => 422,
        // An archive that is not one Kubernetes wrote, or a hostile one.
        R::CriArchive { .. } | R::KubeExport { .. } => 400,
        _ => 500,
    }
}

/// The control API's status for a store error (the shim answers the same).
fn store_status(e: &StoreError) -> u16 {
    match e {
        StoreError::NotFound { .. } => 404,
        StoreError::InChain { .. } | StoreError::UsedAsLower { .. } | StoreError::InUse { .. } => {
            409
        }
        StoreError::InProgress { .. } => 409,
        StoreError::DiskFull { .. } => 507,
        StoreError::Format(_) => 422,
        _ => 500,
    }
}

pub use belayer_api::report::one_line;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_api_statuses_map_to_documented_exit_codes() {
        let api = |status| Error::Api {
            status,
            message: String::new(),
        };
        for (status, code) in [
            (404, 3),
            (409, 4),
            (422, 5),
            (503, 6),
            (507, 7),
            (400, 8),
            (500, 1),
            (501, 1),
        ] {
            assert_eq!(exit_code_of_status(api(status).status()), code, "{status}");
        }
    }

    #[test]
    fn local_errors_get_the_status_the_shim_would_answer() {
        let not_found = Error::ContainerNotFound {
            id: "c".into(),
            namespace: "default".into(),
        };
        assert_eq!(not_found.status(), 404);
        assert_eq!(Error::NoTask("c".into()).status(), 409);
        let id = belayer_api::parse_checkpoint_id("x").unwrap_err();
        assert_eq!(Error::from(id).status(), 400);
        let refused = Error::Containerd {
            step: "create task c".into(),
            status: tonic::Status::already_exists("task c already exists"),
        };
        assert_eq!(refused.status(), 409);
        assert_eq!(refused.to_string(), "create task c: task c already exists");
    }

    #[test]
    fn one_line_keeps_each_source_once() {
        let e = Error::Unreachable {
            container: "c".into(),
            socket: "/run/x.sock".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such\nfile"),
        };
        assert_eq!(
            one_line(&e),
            "cannot reach the shim of c at /run/x.sock: no such; file"
        );
    }
}
