//! The worker's life: (shadow) map weights and wait; acquire; reuse or cold load the weights; map
//! the KV arena; admit or reload requests from the log; rebuild after a takeover; decode and
//! commit every token; write results; release.

use std::time::{Duration, Instant};

use serde_json::json;

use super::engine::{self, Engine, Req};
use super::events::emit;
use super::jobs::{Job, Results};
use super::weights::{self, MappedWeights};
use super::{
    Options, WorkerError, broker_err, geom_of, kv_view, map_kv, page_bytes_of, pages_wanted,
    warm_up,
};
use crate::client::{Client, ClientError, Grant, Heartbeat, RegionFd};
use crate::model::kv::KvArena;
use crate::model::llama::Llama;
use crate::wire::Role;

pub(super) struct Session<'a> {
    pub(super) client: Client,
    pub(super) opts: &'a Options,
    pub(super) threads: usize,
}

impl Session<'_> {
    pub(super) fn b(&self, e: ClientError) -> WorkerError {
        broker_err(&self.client, self.opts, e)
    }

    fn manifest(&self) -> Result<Vec<RegionFd>, WorkerError> {
        self.client.manifest().map_err(|e| self.b(e))
    }

    /// Shadow: map the published weights read-only and warm up, before any failure.
    pub(super) fn prepare_shadow(&self) -> Result<MappedWeights, WorkerError> {
        loop {
            let regions = self.manifest()?;
            if let Some(r) = weights::published(&regions) {
                let w = MappedWeights::map(r)?;
                let model = Llama::new(&w.layout, w.floats(), self.threads)
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
                emit("shadow_ready", json!({}));
                return Ok(w);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Reuses the mapped (or published) weights when the grant says they passed the health
    /// checks; cold loads otherwise. Returns the weights, the manifest and whether it cold loaded.
    pub(super) fn obtain_weights(
        &self,
        grant: &Grant,
        mapped: Option<MappedWeights>,
        gguf: Option<crate::model::gguf::Gguf>,
    ) -> Result<(MappedWeights, Vec<RegionFd>, bool), WorkerError> {
        let regions = self.manifest()?;
        let published = weights::published(&regions);
        let reuse = grant.weights_ok
            && published.is_some_and(|r| {
                mapped
                    .as_ref()
                    .is_none_or(|w| w.checksum == r.info.checksum)
            });
        match (reuse, mapped, published) {
            (true, Some(w), _) => Ok((w, regions, false)),
            (true, None, Some(r)) => {
                let w = MappedWeights::map(r)?;
                Ok((w, regions, false))
            }
            _ => {
                let (w, s) = weights::cold_load(&self.client, &self.opts.model, gguf, self.threads)
                    .map_err(|e| match e {
                        WorkerError::Client(c) => self.b(c),
                        e => e,
                    })?;
                emit("cold_load", json!({ "seconds": s }));
                Ok((w, self.manifest()?, true))
            }
        }
    }

    /// Admits this worker's jobs (idempotent) and loads every unfinished request from the log,
    /// which is the source of truth. Returns the jobs and the in-flight token count.
    fn load_requests(
        &self,
        engine: &mut Engine,
        vocab: usize,
    ) -> Result<(Vec<Job>, usize), WorkerError> {
        let jobs = self.opts.jobs.jobs(vocab);
        for j in &jobs {
            let rng = engine::initial_rng(&j.params, j.id);
            self.client
                .admit(j.id, j.params, rng, j.prompt.clone())
                .map_err(|e| self.b(e))?;
        }
        let mut tokens = 0;
        for (id, finished) in self.client.log_ids().map_err(|e| self.b(e))? {
            if finished {
                continue;
            }
            let r = Req::from_log(&self.client.log_get(id).map_err(|e| self.b(e))?);
            tokens += r.tokens.len();
            engine.add(r)?;
        }
        Ok((jobs, tokens))
    }

    /// Decodes until every request is finished, committing each step. Test hooks may stop here.
    fn generate(
        &self,
        engine: &mut Engine,
        model: &Llama<'_>,
        kv: &mut KvArena<'_>,
        regions: &[RegionFd],
        hb: &Heartbeat,
    ) -> Result<usize, WorkerError> {
        let mut steps = 0usize;
        while !engine.done() {
            let (entries, _) = engine.step(model, kv);
            self.client.commit(entries).map_err(|e| self.b(e))?;
            steps += 1;
            if self.opts.scribble_after == Some(steps) {
                let r = weights::scribble(regions);
                let err = r
                    .err()
                    .map(|e| format!("{e}: {:?}", std::error::Error::source(&e)));
                emit("scribbled", json!({ "ok": err.is_none(), "error": err }));
                loop {
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            if self.opts.hang_after == Some(steps) {
                emit("hanging", json!({ "steps": steps }));
                // A SIGSTOP/SIGCONT or SIGKILL comes from outside.
                let until = Instant::now() + Duration::from_secs(600);
                while Instant::now() < until && !hb.fenced() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                // A zombie that wakes up tries to commit and is refused (stale epoch).
                let (entries, _) = engine.step(model, kv);
                self.client.commit(entries).map_err(|e| self.b(e))?;
            }
        }
        Ok(steps)
    }

    /// Reads every job's tokens from the log and writes the results file.
    fn finish(&self, jobs: &[Job]) -> Result<Results, WorkerError> {
        let mut results = Results {
            requests: Vec::new(),
        };
        for j in jobs {
            let l = self.client.log_get(j.id).map_err(|e| self.b(e))?;
            results.requests.push((j.id, l.generated));
        }
        if let Some(p) = &self.opts.out {
            let s = serde_json::to_vec(&results).unwrap_or_default();
            std::fs::write(p, s).map_err(|e| WorkerError::Results(p.display().to_string(), e))?;
        }
        Ok(results)
    }
}

/// What a worker holds once it has the lease: the grant, its heartbeat, the weights (reused or
/// cold loaded) and the manifest.
pub(super) struct Attached {
    pub(super) grant: Grant,
    pub(super) t_grant: Instant,
    pub(super) hb: Heartbeat,
    pub(super) weights: MappedWeights,
    pub(super) regions: Vec<RegionFd>,
    pub(super) cold: bool,
}

impl<'a> Session<'a> {
    /// Connects to the broker in `opts.role` and says so on stdout (`attached`, with `fields`).
    pub(super) fn connect(
        opts: &'a Options,
        fields: serde_json::Value,
    ) -> Result<Self, WorkerError> {
        let client = Client::connect(&opts.socket, opts.role, 0).map_err(WorkerError::Client)?;
        let mut ev = json!({ "role": format!("{:?}", opts.role),
                             "instance": format!("{:016x}", client.instance) });
        if let (Some(o), serde_json::Value::Object(f)) = (ev.as_object_mut(), fields) {
            o.extend(f);
        }
        emit("attached", ev);
        Ok(Self {
            client,
            opts,
            threads: opts.threads.max(1),
        })
    }

    /// (Shadow: maps the weights and waits for promotion.) Acquires the lease for `pages` KV
    /// pages, starts the heartbeat, and reuses or cold loads the weights.
    pub(super) fn attach(
        &self,
        pages: impl FnOnce(&Options) -> u32,
    ) -> Result<Attached, WorkerError> {
        let mapped = match self.opts.role {
            Role::Shadow => Some(self.prepare_shadow()?),
            _ => None,
        };
        let (page_bytes, gguf) = page_bytes_of(mapped.as_ref(), &self.opts.model)?;
        let grant = self
            .client
            .acquire(page_bytes, pages(self.opts))
            .map_err(|e| self.b(e))?;
        let t_grant = Instant::now();
        emit(
            "granted",
            json!({ "epoch": grant.epoch, "takeover": grant.takeover, "weights_ok": grant.weights_ok }),
        );
        let hb = self
            .client
            .start_heartbeat(Duration::from_millis(u64::from(grant.lease_ms / 4).max(20)));
        let (weights, regions, cold) = self.obtain_weights(&grant, mapped, gguf)?;
        Ok(Attached {
            grant,
            t_grant,
            hb,
            weights,
            regions,
            cold,
        })
    }
}

/// Runs a worker to completion. Returns the results it wrote.
pub fn run(opts: &Options) -> Result<Results, WorkerError> {
    let se = Session::connect(opts, json!({}))?;
    let Attached {
        grant,
        t_grant,
        hb,
        weights: w,
        regions,
        cold,
    } = se.attach(|o| pages_wanted(&o.jobs))?;
    let model = Llama::new(&w.layout, w.floats(), se.threads)
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
    let (jobs, inflight_tokens) = se.load_requests(&mut engine, w.layout.config.vocab)?;
    emit(
        "ready",
        json!({ "since_grant_s": t_grant.elapsed().as_secs_f64(), "cold": cold,
                "takeover": grant.takeover, "inflight": engine.reqs.len() }),
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
            json!({ "requests": engine.reqs.len(), "tokens": inflight_tokens, "rows": rows,
                    "seconds": t.elapsed().as_secs_f64() }),
        );
    }
    let steps = se.generate(&mut engine, &model, &mut kv, &regions, &hb)?;
    let results = se.finish(&jobs)?;
    drop(hb);
    se.client.release().map_err(|e| se.b(e))?;
    emit("done", json!({ "steps": steps }));
    Ok(results)
}
