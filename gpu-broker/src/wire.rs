//! Wire format of the broker protocol: versioned, size-bounded frames, one per `SOCK_SEQPACKET`
//! message. Decoding never trusts a length it has not checked against the frame.

use thiserror::Error;

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"BLGB";
/// Protocol version; a frame with another version is refused before its body is read.
pub const VERSION: u16 = 1;
/// Largest frame either side sends or accepts (header included).
pub const MAX_FRAME: usize = 64 * 1024;
/// Header: magic, version (u16), kind (u16), body length (u32).
pub const HEADER_LEN: usize = 12;
/// Most tokens one message may carry (keeps every frame under [`MAX_FRAME`]).
pub const MAX_TOKENS: usize = 12 * 1024;
/// Largest opaque metadata blob (the weight layout) a region may carry.
pub const MAX_META: usize = 48 * 1024;

/// Why a frame could not be decoded. Any of these drops the connection that sent it.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame is shorter than its header.
    #[error("frame of {0} bytes is shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:02x?}")]
    Magic([u8; 4]),
    /// The peer speaks another protocol version.
    #[error("protocol version {found} is not supported (this side speaks {VERSION})")]
    Version {
        /// Version in the frame.
        found: u16,
    },
    /// The frame is larger than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte bound")]
    TooLarge(usize),
    /// The header's body length disagrees with the frame.
    #[error("header says {declared} body bytes, frame has {actual}")]
    Length {
        /// Length in the header.
        declared: usize,
        /// Bytes actually present.
        actual: usize,
    },
    /// Unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u16),
    /// The body ended before a field was complete.
    #[error("body truncated while reading {0}")]
    Truncated(&'static str),
    /// A field holds a value outside its range.
    #[error("field {0} is out of range")]
    Range(&'static str),
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

/// Role a connection declares in its hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Wants the lease and generates.
    Primary,
    /// Pre-started; waits to be promoted.
    Shadow,
    /// Tooling: status and log reads. Never holds a lease, never gets the KV arena, cannot
    /// fence.
    Observer,
    /// An operator's tool: an observer that may also fence the primary. Only peers whose uid
    /// the broker lists as operators (its own and root by default) may say hello as one.
    Operator,
}

/// Kind of broker-owned region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// Model weights (one version at a time); read-only once published.
    Weights,
    /// Paged KV arena.
    Kv,
}

/// Refusal codes carried by [`Msg::Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    /// The grant or commit carries an epoch that is no longer current.
    StaleEpoch,
    /// The sender does not hold the lease.
    NotPrimary,
    /// The worker knew another broker instance: the broker restarted and its state is gone.
    BrokerRestarted,
    /// Request inconsistent with broker state (wrong position, unknown request, ...).
    BadRequest,
    /// Not enough KV pages or memory.
    NoCapacity,
    /// Backend failure inside the broker.
    Backend,
    /// The peer's uid or role may not do this (`SO_PEERCRED` checked at accept and hello).
    Forbidden,
}

/// Sampling parameters of a request, logged at admission.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: u32,
    /// Seed of the request's RNG.
    pub seed: u64,
    /// Tokens to generate.
    pub max_new_tokens: u32,
}

/// One region as described in a manifest; its fd travels in the same message, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionInfo {
    /// Weights or KV.
    pub kind: RegionKind,
    /// Size in bytes.
    pub bytes: u64,
    /// Weight version tag (0 for KV).
    pub version: u64,
    /// Checksum recorded at publication (0 while unpublished, and for KV).
    pub checksum: u64,
    /// Whether the region is published (weights) and fit for reuse.
    pub published: bool,
    /// KV page size in bytes (0 for weights).
    pub page_bytes: u64,
    /// Opaque metadata (the weight layout).
    pub meta: Vec<u8>,
}

/// One entry of a commit: tokens appended to one request's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitEntry {
    /// Request id.
    pub request_id: u64,
    /// Number of generated tokens the log must already hold (idempotence and ordering check).
    pub pos: u32,
    /// New tokens.
    pub tokens: Vec<u32>,
    /// Sampler/RNG state after the last of these tokens.
    pub sampler_state: u64,
    /// The request is complete after these tokens.
    pub finished: bool,
}

/// A full KV block the lease holder wrote: which prefix it holds and a checksum of its bytes.
/// Recorded as the block fills; a successor adopts the block after the holder's confirmed death
/// only if the checksum still matches (the broker never reads KV bytes itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBlock {
    /// The engine's block index inside the holder's KV pages.
    pub block: u32,
    /// Hash of every token up to the end of this block (a chain over the blocks before it).
    pub prefix: [u8; 16],
    /// Checksum of the block's bytes in every layer.
    pub checksum: u64,
}

/// A request's log as the broker holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestLog {
    /// Request id.
    pub request_id: u64,
    /// Sampling parameters from admission.
    pub params: SamplingParams,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Tokens generated so far.
    pub generated: Vec<u32>,
    /// Sampler state after the last generated token (the initial state before any).
    pub sampler_state: u64,
    /// Whether the request is finished.
    pub finished: bool,
}

/// Broker status snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// Random id of this broker process.
    pub instance: u64,
    /// Current epoch.
    pub epoch: u64,
    /// Pid of the lease holder, 0 if none.
    pub primary_pid: u32,
    /// Shadows waiting for promotion.
    pub shadows_waiting: u32,
    /// Whether published weights are available for reuse.
    pub weights_ready: bool,
    /// Takeovers performed.
    pub takeovers: u32,
    /// Times weights were refused at a health check.
    pub weights_refused: u32,
    /// Requests in the log / unfinished ones.
    pub requests: u32,
    /// Unfinished requests.
    pub inflight: u32,
    /// Duration of the last health check in microseconds.
    pub last_health_us: u64,
    /// Free KV pages.
    pub kv_free_pages: u32,
}

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    /// Worker → broker: first message of a connection.
    Hello {
        /// Declared role.
        role: Role,
        /// Broker instance the worker was attached to before (0 if none).
        known_instance: u64,
    },
    /// Broker → worker: hello accepted.
    HelloOk {
        /// This broker's instance id.
        instance: u64,
        /// Connection id.
        worker_id: u32,
        /// Current epoch.
        epoch: u64,
        /// Peer pid as the kernel reported it.
        pid: u32,
    },
    /// Worker → broker: ask for region descriptions and fds.
    ManifestReq,
    /// Broker → worker: regions (fds attached in order).
    Manifest {
        /// Regions whose fds follow.
        regions: Vec<RegionInfo>,
    },
    /// Worker → broker: ask for the lease (a shadow's acquire is answered at promotion).
    Acquire {
        /// KV page size the worker uses (fixes the arena's page size on first use).
        page_bytes: u64,
        /// Pages wanted.
        pages: u32,
    },
    /// Broker → worker: lease granted.
    Grant {
        /// Epoch every later commit must carry.
        epoch: u64,
        /// Lease duration; heartbeats must come sooner.
        lease_ms: u32,
        /// Granted KV pages as (first, count) runs.
        pages: Vec<(u32, u32)>,
        /// Published weights passed the health checks and may be reused.
        weights_ok: bool,
        /// This grant follows a failure: in-flight requests are in the log.
        takeover: bool,
    },
    /// Worker → broker: create the weights region (the cold path).
    AllocWeights {
        /// Epoch of the caller's grant.
        epoch: u64,
        /// Weight version tag.
        version: u64,
        /// Size in bytes.
        bytes: u64,
    },
    /// Worker → broker: the weights are written (and unmapped writable); seal and record them.
    Publish {
        /// Epoch of the caller's grant.
        epoch: u64,
        /// Weight version tag.
        version: u64,
        /// Checksum the worker computed over what it wrote.
        checksum: u64,
        /// Layout metadata for later workers.
        meta: Vec<u8>,
    },
    /// Worker → broker: lease renewal.
    Heartbeat {
        /// Epoch of the caller's grant.
        epoch: u64,
    },
    /// Worker → broker: admit a request into the log.
    Admit {
        /// Epoch of the caller's grant.
        epoch: u64,
        /// Request id.
        request_id: u64,
        /// Sampling parameters.
        params: SamplingParams,
        /// Initial sampler state.
        sampler_state: u64,
        /// Prompt tokens.
        prompt: Vec<u32>,
    },
    /// Worker → broker: append tokens to request logs.
    Commit {
        /// Epoch of the caller's grant.
        epoch: u64,
        /// One entry per request.
        entries: Vec<CommitEntry>,
    },
    /// Worker → broker: list request ids in the log.
    LogList,
    /// Broker → worker: request ids with their finished flags.
    LogIds {
        /// (request id, finished).
        ids: Vec<(u64, bool)>,
    },
    /// Worker → broker: read one request's log.
    LogGet {
        /// Request id.
        request_id: u64,
    },
    /// Broker → worker: one request's log.
    LogEntry(RequestLog),
    /// Worker → broker: give the lease back (work done).
    Release {
        /// Epoch of the caller's grant.
        epoch: u64,
    },
    /// Lease holder → broker: record full KV blocks (the latest record of a block index wins).
    KvNote {
        /// Epoch of the caller's grant.
        epoch: u64,
        /// The blocks.
        blocks: Vec<KvBlock>,
    },
    /// Lease holder → broker: the KV blocks a confirmed-dead predecessor left, from block index
    /// `from` on.
    KvAdoptReq {
        /// Epoch of the caller's grant.
        epoch: u64,
        /// First block index wanted (paging through long lists).
        from: u32,
    },
    /// Broker → lease holder: the predecessor's KV pages (kept out of the free pool until
    /// [`Msg::KvAdoptDone`]) and its block records; no pages when nothing may be adopted.
    KvAdoptable {
        /// The predecessor's page size.
        page_bytes: u64,
        /// The predecessor's KV pages as (first, count) runs.
        pages: Vec<(u32, u32)>,
        /// Records with block index ≥ `from`, ascending, at most [`MAX_KV_BLOCKS`].
        blocks: Vec<KvBlock>,
        /// More records follow: ask again from the last block index + 1.
        more: bool,
    },
    /// Lease holder → broker: adoption over; the predecessor's pages return to the pool.
    KvAdoptDone {
        /// Epoch of the caller's grant.
        epoch: u64,
    },
    /// Anyone → broker: revoke the current lease (bump the epoch) and promote a shadow.
    Fence,
    /// Broker → client: generic success, with the current epoch.
    Ok {
        /// Current epoch.
        epoch: u64,
    },
    /// Client → broker: ask for a status snapshot.
    StatusReq,
    /// Broker → client: status snapshot.
    StatusReply(Status),
    /// Broker → client: refusal.
    Error {
        /// Machine-readable code.
        code: ErrorCode,
        /// Human-readable explanation.
        message: String,
    },
}

mod codec;

pub use codec::{MAX_KV_BLOCKS, MAX_LIST, decode, encode, frame_fits};
