//! One process of a container (its init or an exec): status, pid, streams and exit.

use std::time::Duration;

use containerd_shim::protos::api::Status;
use containerd_shim::protos::protobuf::well_known_types::timestamp::Timestamp;
use tokio::sync::watch;

use crate::stdio::{ProcessIo, StdioPaths};

/// How long an exited process's output may take to drain before its exit is reported anyway.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// A process's exit as containerd reports it.
#[derive(Clone, Debug)]
pub struct Exit {
    pub status: u32,
    pub at: Timestamp,
}

/// Lifecycle of one process. Containerd's `Status` with our own `Paused` bookkeeping.
pub struct Process {
    pub exec_id: String,
    pub pid: u32,
    pub paths: StdioPaths,
    pub status: Status,
    pub io: Option<ProcessIo>,
    exit_tx: watch::Sender<Option<Exit>>,
    /// For an exec not yet started: its OCI process spec (JSON).
    pub spec: Option<Vec<u8>>,
}

impl Process {
    pub fn new(exec_id: &str, paths: StdioPaths) -> Self {
        let (exit_tx, _) = watch::channel(None);
        Self {
            exec_id: exec_id.to_string(),
            pid: 0,
            paths,
            status: Status::CREATED,
            io: None,
            exit_tx,
            spec: None,
        }
    }

    pub fn exit(&self) -> Option<Exit> {
        self.exit_tx.borrow().clone()
    }

    /// A receiver that sees the exit once it happened.
    pub fn subscribe(&self) -> watch::Receiver<Option<Exit>> {
        self.exit_tx.subscribe()
    }

    pub fn set_exited(&mut self, exit: Exit) {
        self.status = Status::STOPPED;
        self.exit_tx.send_replace(Some(exit));
    }

    /// Forgets an exit: the process was restored from a checkpoint.
    pub fn clear_exit(&mut self) {
        self.exit_tx.send_replace(None);
    }

    pub fn is_running(&self) -> bool {
        matches!(
            self.status,
            Status::RUNNING | Status::PAUSED | Status::PAUSING
        )
    }
}

/// Waits until `rx` carries an exit.
pub async fn wait_exit(mut rx: watch::Receiver<Option<Exit>>) -> Option<Exit> {
    rx.wait_for(Option::is_some)
        .await
        .ok()
        .and_then(|e| e.clone())
}

/// Now, as a protobuf timestamp.
pub fn now() -> Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
        ..Default::default()
    }
}

/// Go's zero `time.Time` (0001-01-01), which runc-v2 reports for a process that has not exited.
pub fn zero_time() -> Timestamp {
    Timestamp {
        seconds: -62_135_596_800,
        nanos: 0,
        ..Default::default()
    }
}
