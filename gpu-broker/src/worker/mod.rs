//! The reference rollout worker: attaches to the broker as primary or shadow, cold loads or maps
//! the weights, generates batched requests with a paged KV cache in the broker's arena, commits
//! every token, and on promotion rebuilds in-flight requests from the log.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;
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
pub mod weights;

use engine::{Engine, Req};
use events::emit;
use jobs::{JobSpec, Results};
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

/// Runs a worker to completion. Returns the results it wrote.
pub fn run(opts: &Options) -> Result<Results, WorkerError> {
    let client = Client::connect(&opts.socket, opts.role, 0).map_err(WorkerError::Client)?;
    emit(
        "attached",
        json!({ "role": format!("{:?}", opts.role), "instance": format!("{:016x}", client.instance) }),
    );
    let threads = opts.threads.max(1);

    // Shadow: map published weights read-only and warm up now, then wait for promotion.
    let mut weights: Option<MappedWeights> = None;
    if opts.role == Role::Shadow {
        loop {
            let regions = client
                .manifest()
                .map_err(|e| broker_err(&client, opts, e))?;
            if let Some(r) = weights::published(&regions) {
                let w = MappedWeights::map(r)?;
                let model = Llama::new(&w.layout, w.floats(), threads)
                    .map_err(|e| WorkerError::Protocol(e.to_string()))?;
                let geom = geom_of(&w);
                let mut local = vec![0f32; geom.page_floats()];
                warm_up(
                    &model,
                    &mut KvArena {
                        data: &mut local,
                        geom,
                    },
                    0,
                );
                drop(model);
                weights = Some(w);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        emit("shadow_ready", json!({}));
    }

    let (page_bytes, mut gguf) = page_bytes_of(weights.as_ref(), &opts.model)?;
    let grant = client
        .acquire(page_bytes, pages_wanted(&opts.jobs))
        .map_err(|e| broker_err(&client, opts, e))?;
    let t_grant = Instant::now();
    emit(
        "granted",
        json!({ "epoch": grant.epoch, "takeover": grant.takeover, "weights_ok": grant.weights_ok }),
    );
    let _hb = client.start_heartbeat(Duration::from_millis(u64::from(grant.lease_ms / 4).max(20)));

    let mut regions = client
        .manifest()
        .map_err(|e| broker_err(&client, opts, e))?;
    let reuse = grant.weights_ok
        && weights::published(&regions).is_some_and(|r| {
            weights
                .as_ref()
                .is_none_or(|w| w.checksum == r.info.checksum)
        });
    let mut cold = false;
    let w = match (reuse, weights.take()) {
        (true, Some(w)) => w,
        (true, None) => MappedWeights::map(
            weights::published(&regions)
                .ok_or_else(|| WorkerError::Protocol("weights vanished".into()))?,
        )?,
        (false, _) => {
            let (w, s) = weights::cold_load(&client, &opts.model, gguf.take(), threads).map_err(
                |e| match e {
                    WorkerError::Client(c) => broker_err(&client, opts, c),
                    e => e,
                },
            )?;
            cold = true;
            emit("cold_load", json!({ "seconds": s }));
            regions = client
                .manifest()
                .map_err(|e| broker_err(&client, opts, e))?;
            w
        }
    };
    let model = Llama::new(&w.layout, w.floats(), threads)
        .map_err(|e| WorkerError::Protocol(e.to_string()))?;
    let geom = geom_of(&w);
    let mut kv_map = map_kv(&regions, geom)?;
    let mut engine = Engine::new(geom, &grant.pages);
    let scratch = engine
        .take_page()
        .ok_or_else(|| WorkerError::Protocol("empty grant".into()))?;
    if opts.role == Role::Primary || cold {
        warm_up(
            &model,
            &mut KvArena {
                data: kv_view(&mut kv_map),
                geom,
            },
            scratch,
        );
    }

    // The log is the source of truth; admission is idempotent, so a successor re-admits safely.
    let jobs = opts.jobs.jobs(w.layout.config.vocab);
    for j in &jobs {
        let rng = engine::initial_rng(&j.params, j.id);
        client
            .admit(j.id, j.params, rng, j.prompt.clone())
            .map_err(|e| broker_err(&client, opts, e))?;
    }
    let ids = client.log_ids().map_err(|e| broker_err(&client, opts, e))?;
    let mut inflight_tokens = 0;
    for (id, finished) in &ids {
        if *finished {
            continue;
        }
        let l = client
            .log_get(*id)
            .map_err(|e| broker_err(&client, opts, e))?;
        let r = Req::from_log(&l);
        inflight_tokens += r.tokens.len();
        engine.add(r)?;
    }
    emit(
        "ready",
        json!({ "since_grant_s": t_grant.elapsed().as_secs_f64(), "cold": cold, "takeover": grant.takeover, "inflight": engine.reqs.len() }),
    );

    let mut kv = KvArena {
        data: kv_view(&mut kv_map),
        geom,
    };
    if grant.takeover {
        let t = Instant::now();
        let rows = engine.rebuild(&model, &mut kv);
        emit(
            "rebuilt",
            json!({ "requests": engine.reqs.len(), "tokens": inflight_tokens, "rows": rows, "seconds": t.elapsed().as_secs_f64() }),
        );
    }

    let mut steps = 0usize;
    while !engine.done() {
        let (entries, _) = engine.step(&model, &mut kv);
        client
            .commit(entries)
            .map_err(|e| broker_err(&client, opts, e))?;
        steps += 1;
        if opts.scribble_after == Some(steps) {
            let r = weights::scribble(&regions);
            emit(
                "scribbled",
                json!({ "ok": r.is_ok(), "error": r.err().map(|e| format!("{e}: {:?}", std::error::Error::source(&e))) }),
            );
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        if opts.hang_after == Some(steps) {
            emit("hanging", json!({ "steps": steps }));
            // Sleep in small slices; a SIGSTOP/SIGCONT or SIGKILL comes from outside.
            let until = Instant::now() + Duration::from_secs(600);
            while Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
                if _hb.fenced() {
                    break;
                }
            }
            // A zombie that wakes up tries to commit and is refused (stale epoch).
            let (entries, _) = engine.step(&model, &mut kv);
            client
                .commit(entries)
                .map_err(|e| broker_err(&client, opts, e))?;
        }
    }

    let mut results = Results {
        requests: Vec::new(),
    };
    for j in &jobs {
        let l = client
            .log_get(j.id)
            .map_err(|e| broker_err(&client, opts, e))?;
        results.requests.push((j.id, l.generated));
    }
    if let Some(p) = &opts.out {
        let s = serde_json::to_vec(&results).unwrap_or_default();
        std::fs::write(p, s).map_err(|e| WorkerError::Results(p.display().to_string(), e))?;
    }
    drop(_hb);
    client.release().map_err(|e| broker_err(&client, opts, e))?;
    emit("done", json!({ "steps": steps }));
    Ok(results)
}
