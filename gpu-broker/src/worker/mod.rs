//! The reference rollout worker: attaches to the broker as primary or shadow, cold loads or maps
//! the weights, generates batched requests with a paged KV cache in the broker's arena, commits
//! every token, and on promotion rebuilds in-flight requests from the log.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::client::{Client, ClientError, RegionFd};
use crate::mapping::Mapping;
use crate::model::kv::{BLOCK, KvArena, KvGeom, pages_for};
use crate::model::llama::{Llama, Row};
use crate::wire::{RegionKind, Role};

pub mod engine;
pub mod events;
pub mod jobs;
pub mod measure;
mod run;
pub mod serve;
pub mod weights;

pub use run::run;

use jobs::JobSpec;
use weights::MappedWeights;

/// Default location of the reference model.
pub const DEFAULT_MODEL: &str = "/var/lib/belayer/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The model file named by `BELAYER_MODEL`, or the default.
pub fn model_path() -> PathBuf {
    std::env::var_os("BELAYER_MODEL").map_or_else(|| PathBuf::from(DEFAULT_MODEL), PathBuf::from)
}

/// A worker failure.
#[derive(Debug, Error)]
pub enum WorkerError {
    /// The GGUF file is absent.
    #[error("model file {0} is missing: run gpu-broker/scripts/fetch-model (or set BELAYER_MODEL)")]
    ModelMissing(String),
    /// The GGUF could not be parsed.
    #[error("cannot load the model")]
    Gguf(#[source] crate::model::gguf::GgufError),
    /// The layout metadata is unreadable.
    #[error("weights layout metadata is unreadable")]
    Layout(#[source] serde_json::Error),
    /// Mapping a region failed.
    #[error("cannot map the {0} region")]
    Map(&'static str, #[source] nix::errno::Errno),
    /// A broker call failed.
    #[error("broker call failed")]
    Client(#[source] ClientError),
    /// The broker fenced us: a successor holds the lease.
    #[error("fenced by the broker (stale epoch); a successor holds the lease")]
    Fenced(#[source] ClientError),
    /// The broker restarted: its state is gone.
    #[error("the broker restarted; its weights, KV arena and token log are gone ({0})")]
    BrokerRestarted(String),
    /// Inconsistent state.
    #[error("{0}")]
    Protocol(String),
    /// KV pages ran out.
    #[error(transparent)]
    NoPages(#[from] engine::NoPages),
    /// The serving socket cannot be bound.
    #[error("cannot listen on {0}")]
    Listen(String, #[source] std::io::Error),
    /// Writing results failed.
    #[error("cannot write results to {0}")]
    Results(String, #[source] std::io::Error),
}

/// Worker options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Broker socket.
    pub socket: PathBuf,
    /// GGUF path.
    pub model: PathBuf,
    /// Primary or shadow.
    pub role: Role,
    /// Requests to run.
    pub jobs: JobSpec,
    /// Where to write the results.
    pub out: Option<PathBuf>,
    /// Compute threads.
    pub threads: usize,
    /// Test hook: after this many decode steps, scribble on the weights and hang.
    pub scribble_after: Option<usize>,
    /// Test hook: after this many decode steps, hang (to be killed or stopped).
    pub hang_after: Option<usize>,
}

fn map_kv(regions: &[RegionFd], geom: KvGeom) -> Result<Mapping, WorkerError> {
    let r = regions
        .iter()
        .find(|r| r.info.kind == RegionKind::Kv)
        .ok_or_else(|| WorkerError::Protocol("manifest has no KV arena".into()))?;
    if r.info.page_bytes != geom.page_bytes() as u64 {
        return Err(WorkerError::Protocol("KV page size mismatch".into()));
    }
    Mapping::new(&r.fd, r.info.bytes as usize, true).map_err(|e| WorkerError::Map("KV", e))
}

fn kv_view(m: &mut Mapping) -> KvArenaData<'_> {
    let n = m.len() / 4;
    // SAFETY: the arena mapping is page-aligned, writable and n f32s long; this worker only
    // touches the pages its grant gave it (other holders' pages are quarantined by the broker).
    unsafe { std::slice::from_raw_parts_mut(m.as_ptr().cast::<f32>(), n) }
}

type KvArenaData<'a> = &'a mut [f32];

/// Warm-up: one forward of a few tokens on one page (fills caches, spins up threads).
fn warm_up(model: &Llama<'_>, kv: &mut KvArena<'_>, page: u32) {
    let rows: Vec<Row> = (0..8)
        .map(|p| Row {
            seq: 0,
            pos: p,
            token: 1 + p as u32,
            logits: p == 7,
        })
        .collect();
    let _ = model.forward(kv, &[vec![page]], &rows);
}

fn geom_of(w: &MappedWeights) -> KvGeom {
    KvGeom {
        layers: w.layout.config.n_layers,
        kv_dim: w.layout.config.kv_dim(),
    }
}

fn pages_wanted(spec: &JobSpec) -> u32 {
    (spec.requests * pages_for(spec.max_seq()) + 1) as u32
}

/// Page size for the model: from mapped weights, or from the GGUF (which is then kept open for
/// the cold load, so the file is read once).
fn page_bytes_of(
    w: Option<&MappedWeights>,
    model: &std::path::Path,
) -> Result<(u64, Option<crate::model::gguf::Gguf>), WorkerError> {
    if let Some(w) = w {
        return Ok((geom_of(w).page_bytes() as u64, None));
    }
    if !model.is_file() {
        return Err(WorkerError::ModelMissing(model.display().to_string()));
    }
    let g = crate::model::gguf::Gguf::open(model).map_err(WorkerError::Gguf)?;
    let c = crate::model::layout::LlamaConfig::from_gguf(&g).map_err(WorkerError::Gguf)?;
    Ok(((c.n_layers * 2 * BLOCK * c.kv_dim() * 4) as u64, Some(g)))
}

fn broker_err(client: &Client, opts: &Options, e: ClientError) -> WorkerError {
    if e.is_stale_epoch() {
        return WorkerError::Fenced(e);
    }
    if e.is_broker_restart() {
        // Ask again with the instance we knew: a restarted broker says so explicitly. A broker
        // being restarted may take a moment to listen again.
        let mut last = String::new();
        for _ in 0..50 {
            match Client::connect(&opts.socket, Role::Observer, client.instance) {
                Err(ClientError::Refused { message, .. }) => {
                    return WorkerError::BrokerRestarted(message);
                }
                Err(e) => last = format!("cannot reconnect: {e}"),
                Ok(_) => return WorkerError::Client(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        return WorkerError::BrokerRestarted(last);
    }
    WorkerError::Client(e)
}
