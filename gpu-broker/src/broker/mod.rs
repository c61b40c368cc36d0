//! The broker: owns the weight region, the paged KV arena and the token log; grants one lease at a
//! time under an epoch; on a primary's death confirms it is gone, runs health checks, bumps the
//! epoch and promotes a waiting shadow.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{Backend, Region};
use crate::pidfd::PidFd;
use crate::seqpacket::Conn;
use crate::wire::{KvBlock, Role, Status};

mod failover;
mod handlers;
pub mod log;
pub mod pages;
mod regions;
mod server;
#[cfg(test)]
mod tests;

pub use server::{ServeError, serve};

/// When the weights' checksum is recomputed at a takeover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumPolicy {
    /// Every takeover.
    Always,
    /// Only when the region is not write-sealed by the kernel (CUDA, or `seal_weights = false`).
    Unsealed,
}

/// Broker configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Socket path.
    pub socket: PathBuf,
    /// Lease duration: a primary silent for longer is fenced.
    pub lease: Duration,
    /// KV arena size in bytes (created at the first grant).
    pub kv_bytes: u64,
    /// Seal published weights against writes (host backend).
    pub seal_weights: bool,
    /// When to recompute the weights checksum at a takeover.
    pub checksum: ChecksumPolicy,
    /// How long to wait for a lost primary's pidfd to report its exit.
    pub confirm_timeout: Duration,
    /// Finished requests the token log keeps for resends.
    pub log_retention: log::Retention,
    /// Who may connect and as what (`SO_PEERCRED`), the socket's mode, the peer cap.
    pub access: Access,
    /// How long a dead primary's KV pages are kept for its successor to adopt blocks from,
    /// unless the successor says it is done sooner.
    pub kv_adopt_keep: Duration,
}

/// Who may use the broker. Checked by the broker itself, whatever the umask or the directory the
/// socket is in: the socket file is created 0600 (0660 with `group`), each peer's uid is read with
/// `SO_PEERCRED` at accept, and an operator's at its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Uids allowed to connect. Default: root and the broker's own uid.
    pub uids: Vec<u32>,
    /// Uids allowed to say hello as [`Role::Operator`] (and so to fence). Default: root and the
    /// broker's own uid.
    pub operator_uids: Vec<u32>,
    /// Group the socket file is shared with (mode 0660); `None`: mode 0600.
    pub group: Option<u32>,
    /// Most connections served at once; more are refused with `NoCapacity` at accept.
    pub max_peers: usize,
}

impl Default for Access {
    fn default() -> Self {
        let me = nix::unistd::geteuid().as_raw();
        let mut uids = vec![0];
        if me != 0 {
            uids.push(me);
        }
        Self {
            uids: uids.clone(),
            operator_uids: uids,
            group: None,
            max_peers: 256,
        }
    }
}

impl Access {
    /// The socket file's mode.
    pub fn socket_mode(&self) -> u32 {
        if self.group.is_some() { 0o660 } else { 0o600 }
    }
}

impl Config {
    /// Defaults for a socket path.
    pub fn new(socket: PathBuf) -> Self {
        Self {
            socket,
            lease: Duration::from_secs(10),
            kv_bytes: 2 << 30,
            seal_weights: true,
            checksum: ChecksumPolicy::Unsealed,
            confirm_timeout: Duration::from_millis(500),
            log_retention: log::Retention::default(),
            access: Access::default(),
            kv_adopt_keep: Duration::from_secs(60),
        }
    }
}

struct Peer {
    conn: Conn,
    /// Shared with the zombie entry a fence makes of it, so a later loss can still confirm death.
    pidfd: Option<Arc<PidFd>>,
    pid: i32,
    /// The peer's uid at connect time (`SO_PEERCRED`).
    uid: u32,
    role: Option<Role>,
}

struct Lease {
    peer: u32,
    epoch: u64,
    pages: Vec<(u32, u32)>,
    deadline: Instant,
    /// The holder's full KV blocks by block index (`KvNote`), at most [`MAX_KV_NOTES`].
    kv_notes: BTreeMap<u32, KvBlock>,
}

/// Most KV block records one lease keeps (a vLLM has one per block of its KV cache).
const MAX_KV_NOTES: usize = 1 << 20;

/// A confirmed-dead primary's KV pages and block records, kept out of the free pool so its
/// successor can verify and copy blocks from them.
struct Adoptable {
    pages: Vec<(u32, u32)>,
    page_bytes: u64,
    blocks: BTreeMap<u32, KvBlock>,
    until: Instant,
}

struct Zombie {
    pidfd: Arc<PidFd>,
    pages: Vec<(u32, u32)>,
}

struct Weights {
    region: Box<dyn Region>,
    /// A read-only handle (once published, where the backend has one), for every peer but the
    /// lease holder.
    read_only: Option<std::os::fd::OwnedFd>,
    version: u64,
    checksum: u64,
    published: bool,
    meta: Vec<u8>,
}

struct Kv {
    region: Box<dyn Region>,
    page_bytes: u64,
    pages: pages::Pages,
}

/// A shadow's pending acquire.
struct Waiting {
    peer: u32,
    pages: u32,
    page_bytes: u64,
}

/// Broker state. I/O lives in `server`; this holds the decisions.
pub struct Broker {
    cfg: Config,
    instance: u64,
    epoch: u64,
    backend: Box<dyn Backend>,
    peers: BTreeMap<u32, Peer>,
    next_peer: u32,
    lease: Option<Lease>,
    zombies: Vec<Zombie>,
    shadows: VecDeque<Waiting>,
    weights: Option<Weights>,
    kv: Option<Kv>,
    adoptable: Option<Adoptable>,
    log: log::TokenLog,
    /// A failure happened and no one has taken over yet.
    orphaned: bool,
    /// Weights passed the last health check (or no failure happened since publication).
    weights_ok: bool,
    takeovers: u32,
    weights_refused: u32,
    last_health_us: u64,
}

fn random_instance() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into the buffer we own.
    let r = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    let v = u64::from_le_bytes(b);
    if r == 8 && v != 0 {
        v
    } else {
        (std::process::id() as u64) << 32 | 1
    }
}

impl Broker {
    /// A broker with no regions yet.
    pub fn new(cfg: Config, backend: Box<dyn Backend>) -> Self {
        let log = log::TokenLog::new(cfg.log_retention);
        Self {
            cfg,
            instance: random_instance(),
            epoch: 0,
            backend,
            peers: BTreeMap::new(),
            next_peer: 1,
            lease: None,
            zombies: Vec::new(),
            shadows: VecDeque::new(),
            weights: None,
            kv: None,
            adoptable: None,
            log,
            orphaned: false,
            weights_ok: true,
            takeovers: 0,
            weights_refused: 0,
            last_health_us: 0,
        }
    }

    /// This process's instance id.
    pub fn instance(&self) -> u64 {
        self.instance
    }

    fn status(&self) -> Status {
        Status {
            instance: self.instance,
            epoch: self.epoch,
            primary_pid: self
                .lease
                .as_ref()
                .and_then(|l| self.peers.get(&l.peer))
                .map_or(0, |p| p.pid as u32),
            shadows_waiting: self.shadows.len() as u32,
            weights_ready: self.weights.as_ref().is_some_and(|w| w.published) && self.weights_ok,
            takeovers: self.takeovers,
            weights_refused: self.weights_refused,
            requests: self.log.len() as u32,
            inflight: self.log.inflight() as u32,
            last_health_us: self.last_health_us,
            kv_free_pages: self.kv.as_ref().map_or(0, |k| k.pages.free_count()),
        }
    }
}
