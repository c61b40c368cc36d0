//! Client library for workers and tools: one connection, synchronous request/reply, safe to share
//! between a worker's main thread and its heartbeat thread.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::seqpacket::{Conn, SocketError};
use crate::wire::{
    CommitEntry, ErrorCode, Msg, RegionInfo, RequestLog, Role, SamplingParams, Status,
};

/// A client-side failure.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Cannot reach the broker.
    #[error("cannot connect to the broker at {path}")]
    Connect {
        /// Socket path.
        path: String,
        /// Cause.
        #[source]
        source: SocketError,
    },
    /// The broker closed the connection: it exited, restarted, or dropped us for a violation.
    #[error(
        "the broker closed the connection (it exited or restarted, or refused our last message); \
         its weights, KV arena and token log may be gone"
    )]
    BrokerGone,
    /// Socket failure.
    #[error("broker socket failure")]
    Socket(#[source] SocketError),
    /// The broker refused the request.
    #[error("broker refused: {message} ({code:?})")]
    Refused {
        /// Code.
        code: ErrorCode,
        /// The broker's explanation.
        message: String,
    },
    /// The broker answered with an unexpected message.
    #[error("unexpected reply from the broker: {0}")]
    Unexpected(String),
}

impl ClientError {
    /// Whether the broker refused a request as inconsistent with its state: for a log lookup,
    /// an id it does not hold (never admitted, or finished long enough ago to be let go).
    pub fn is_bad_request(&self) -> bool {
        matches!(
            self,
            ClientError::Refused {
                code: ErrorCode::BadRequest,
                ..
            }
        )
    }

    /// Whether this is an epoch refusal (we were fenced).
    pub fn is_stale_epoch(&self) -> bool {
        matches!(
            self,
            ClientError::Refused {
                code: ErrorCode::StaleEpoch | ErrorCode::NotPrimary,
                ..
            }
        )
    }

    /// Whether the broker we knew is gone or was replaced.
    pub fn is_broker_restart(&self) -> bool {
        matches!(
            self,
            ClientError::BrokerGone
                | ClientError::Refused {
                    code: ErrorCode::BrokerRestarted,
                    ..
                }
        )
    }
}

impl From<SocketError> for ClientError {
    fn from(e: SocketError) -> Self {
        match e {
            SocketError::Closed => ClientError::BrokerGone,
            e => ClientError::Socket(e),
        }
    }
}

/// A lease grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Epoch to carry in every later message.
    pub epoch: u64,
    /// Lease duration in ms.
    pub lease_ms: u32,
    /// KV page runs.
    pub pages: Vec<(u32, u32)>,
    /// Weights in the manifest are fit for reuse.
    pub weights_ok: bool,
    /// Follows a failure: continue the log's in-flight requests.
    pub takeover: bool,
}

/// A region description with its fd.
#[derive(Debug)]
pub struct RegionFd {
    /// Description.
    pub info: RegionInfo,
    /// Shareable handle.
    pub fd: OwnedFd,
}

/// A connection to the broker.
#[derive(Debug, Clone)]
pub struct Client {
    conn: Arc<Mutex<Conn>>,
    /// Broker instance id from the hello.
    pub instance: u64,
    /// Our connection id.
    pub worker_id: u32,
    /// Our pid as the broker saw it.
    pub pid: u32,
    epoch: Arc<AtomicU64>,
}

impl Client {
    /// Connects and says hello. `known_instance` is the broker instance this worker was attached
    /// to before (0 for none): a restarted broker refuses it with a clear error.
    pub fn connect(path: &Path, role: Role, known_instance: u64) -> Result<Self, ClientError> {
        let conn = Conn::connect(path).map_err(|source| ClientError::Connect {
            path: path.display().to_string(),
            source,
        })?;
        let c = Self {
            conn: Arc::new(Mutex::new(conn)),
            instance: 0,
            worker_id: 0,
            pid: 0,
            epoch: Arc::new(AtomicU64::new(0)),
        };
        match c
            .call(&Msg::Hello {
                role,
                known_instance,
            })?
            .0
        {
            Msg::HelloOk {
                instance,
                worker_id,
                pid,
                ..
            } => Ok(Self {
                instance,
                worker_id,
                pid,
                ..c
            }),
            m => Err(ClientError::Unexpected(format!("{m:?}"))),
        }
    }

    /// Sends one message and waits for its reply (refusals become errors).
    pub fn call(&self, m: &Msg) -> Result<(Msg, Vec<OwnedFd>), ClientError> {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let sent = conn.send(m, &[]);
        let (r, fds) = match sent.and_then(|()| conn.recv()) {
            Ok(r) => r,
            // A broker that refused this connection at accept (uid, peer cap) left its reason
            // before closing: report that, not a bare closed socket. (Our hello, unread when it
            // closed, makes the first read fail with ECONNRESET; the reason is read after it.
            // The peer is gone, so this read cannot block.)
            Err(SocketError::Closed) => match conn.recv() {
                Ok((Msg::Error { code, message }, _)) => {
                    return Err(ClientError::Refused { code, message });
                }
                _ => return Err(ClientError::BrokerGone),
            },
            Err(e) => return Err(e.into()),
        };
        match r {
            Msg::Error { code, message } => Err(ClientError::Refused { code, message }),
            r => Ok((r, fds)),
        }
    }

    fn expect_ok(&self, m: &Msg) -> Result<u64, ClientError> {
        match self.call(m)?.0 {
            Msg::Ok { epoch } => Ok(epoch),
            m => Err(ClientError::Unexpected(format!("{m:?}"))),
        }
    }

    /// The epoch of our current grant (0 before one).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Regions and their fds.
    pub fn manifest(&self) -> Result<Vec<RegionFd>, ClientError> {
        let (m, fds) = self.call(&Msg::ManifestReq)?;
        pair_regions(m, fds)
    }

    /// Asks for the lease. A shadow blocks here until it is promoted.
    pub fn acquire(&self, page_bytes: u64, pages: u32) -> Result<Grant, ClientError> {
        match self.call(&Msg::Acquire { page_bytes, pages })?.0 {
            Msg::Grant {
                epoch,
                lease_ms,
                pages,
                weights_ok,
                takeover,
            } => {
                self.epoch.store(epoch, Ordering::SeqCst);
                Ok(Grant {
                    epoch,
                    lease_ms,
                    pages,
                    weights_ok,
                    takeover,
                })
            }
            m => Err(ClientError::Unexpected(format!("{m:?}"))),
        }
    }

    /// Creates the weights region (cold path) and returns its fd.
    pub fn alloc_weights(&self, version: u64, bytes: u64) -> Result<RegionFd, ClientError> {
        let (m, fds) = self.call(&Msg::AllocWeights {
            epoch: self.epoch(),
            version,
            bytes,
        })?;
        pair_regions(m, fds)?
            .pop()
            .ok_or_else(|| ClientError::Unexpected("no weights region".into()))
    }

    /// Publishes the written weights (unmap any writable mapping first).
    pub fn publish(&self, version: u64, checksum: u64, meta: Vec<u8>) -> Result<(), ClientError> {
        self.expect_ok(&Msg::Publish {
            epoch: self.epoch(),
            version,
            checksum,
            meta,
        })
        .map(drop)
    }

    /// Renews the lease.
    pub fn heartbeat(&self) -> Result<(), ClientError> {
        self.expect_ok(&Msg::Heartbeat {
            epoch: self.epoch(),
        })
        .map(drop)
    }

    /// Admits a request into the log.
    pub fn admit(
        &self,
        request_id: u64,
        params: SamplingParams,
        sampler_state: u64,
        prompt: Vec<u32>,
    ) -> Result<(), ClientError> {
        self.expect_ok(&Msg::Admit {
            epoch: self.epoch(),
            request_id,
            params,
            sampler_state,
            prompt,
        })
        .map(drop)
    }

    /// Appends tokens to the log.
    pub fn commit(&self, entries: Vec<CommitEntry>) -> Result<(), ClientError> {
        self.expect_ok(&Msg::Commit {
            epoch: self.epoch(),
            entries,
        })
        .map(drop)
    }

    /// Commit with an explicit epoch (tests: a zombie's stale epoch).
    pub fn commit_at(&self, epoch: u64, entries: Vec<CommitEntry>) -> Result<(), ClientError> {
        self.expect_ok(&Msg::Commit { epoch, entries }).map(drop)
    }

    /// Request ids in the log with their finished flags.
    pub fn log_ids(&self) -> Result<Vec<(u64, bool)>, ClientError> {
        match self.call(&Msg::LogList)?.0 {
            Msg::LogIds { ids } => Ok(ids),
            m => Err(ClientError::Unexpected(format!("{m:?}"))),
        }
    }

    /// One request's log.
    pub fn log_get(&self, request_id: u64) -> Result<RequestLog, ClientError> {
        match self.call(&Msg::LogGet { request_id })?.0 {
            Msg::LogEntry(l) => Ok(l),
            m => Err(ClientError::Unexpected(format!("{m:?}"))),
        }
    }

    /// Gives the lease back.
    pub fn release(&self) -> Result<(), ClientError> {
        self.expect_ok(&Msg::Release {
            epoch: self.epoch(),
        })
        .map(drop)
    }

    /// Asks the broker to fence the current primary; returns the new epoch.
    pub fn fence(&self) -> Result<u64, ClientError> {
        self.expect_ok(&Msg::Fence)
    }

    /// Status snapshot.
    pub fn status(&self) -> Result<Status, ClientError> {
        match self.call(&Msg::StatusReq)?.0 {
            Msg::StatusReply(s) => Ok(s),
            m => Err(ClientError::Unexpected(format!("{m:?}"))),
        }
    }

    /// Starts a thread that renews the lease every `every`; it stops when the handle drops or the
    /// broker refuses (then `fenced()` turns true).
    pub fn start_heartbeat(&self, every: Duration) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let fenced = Arc::new(AtomicBool::new(false));
        let (c, s, f) = (self.clone(), stop.clone(), fenced.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                std::thread::sleep(every);
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Err(e) = c.heartbeat() {
                    tracing::warn!(error = %e, "heartbeat refused");
                    f.store(true, Ordering::SeqCst);
                    break;
                }
            }
        });
        Heartbeat {
            stop,
            fenced,
            thread: Some(thread),
        }
    }
}

/// A running heartbeat thread.
#[derive(Debug)]
pub struct Heartbeat {
    stop: Arc<AtomicBool>,
    fenced: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Whether a heartbeat was refused.
    pub fn fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn pair_regions(m: Msg, fds: Vec<OwnedFd>) -> Result<Vec<RegionFd>, ClientError> {
    match m {
        Msg::Manifest { regions } if regions.len() == fds.len() => Ok(regions
            .into_iter()
            .zip(fds)
            .map(|(info, fd)| RegionFd { info, fd })
            .collect()),
        m => Err(ClientError::Unexpected(format!(
            "manifest with mismatched fds: {m:?}"
        ))),
    }
}
