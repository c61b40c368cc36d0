//! The generation engine: per-request state, KV block tables, prefill (also the rebuild path),
//! batched decode steps and sampling.

use crate::model::kv::{KvArena, KvGeom, pages_for};
use crate::model::llama::{Llama, Row};
use crate::model::sampler;
use crate::wire::{CommitEntry, RequestLog, SamplingParams};

/// One in-flight request.
#[derive(Debug, Clone)]
pub struct Req {
    /// Request id.
    pub id: u64,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
    /// Positions whose K/V are in the cache.
    pub kv_len: usize,
    /// RNG state after the last generated token.
    pub rng: u64,
    /// KV pages (block table).
    pub table: Vec<u32>,
}

impl Req {
    /// From a log entry.
    pub fn from_log(l: &RequestLog) -> Self {
        let mut tokens = l.prompt.clone();
        tokens.extend_from_slice(&l.generated);
        Self {
            id: l.request_id,
            params: l.params,
            prompt_len: l.prompt.len(),
            tokens,
            kv_len: 0,
            rng: l.sampler_state,
            table: Vec::new(),
        }
    }

    /// Generated so far.
    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Whether the budget is used up.
    pub fn finished(&self) -> bool {
        self.generated() >= self.params.max_new_tokens as usize
    }
}

/// The engine's state.
pub struct Engine {
    /// Active requests.
    pub reqs: Vec<Req>,
    free: Vec<u32>,
    geom: KvGeom,
}

/// Not enough KV pages for a request.
#[derive(Debug, thiserror::Error)]
#[error("request {0} needs {1} KV pages, {2} are free")]
pub struct NoPages(pub u64, pub usize, pub usize);

impl Engine {
    /// An engine owning the pages of `runs`.
    pub fn new(geom: KvGeom, runs: &[(u32, u32)]) -> Self {
        let free = runs.iter().flat_map(|&(a, c)| a..a + c).rev().collect();
        Self {
            reqs: Vec::new(),
            free,
            geom,
        }
    }

    /// Page geometry.
    pub fn geom(&self) -> KvGeom {
        self.geom
    }

    /// Takes one page out of the pool (warm-up scratch).
    pub fn take_page(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// Adds a request, reserving pages for its whole budget.
    pub fn add(&mut self, mut r: Req) -> Result<(), NoPages> {
        let need = pages_for(r.prompt_len + r.params.max_new_tokens as usize);
        if need > self.free.len() {
            return Err(NoPages(r.id, need, self.free.len()));
        }
        r.table = self.free.split_off(self.free.len() - need);
        self.reqs.push(r);
        Ok(())
    }

    /// One forward over every unfinished request: all positions not yet in the cache (a prefill
    /// after admission or takeover, one token when decoding), then one sampled token each.
    /// Returns the commit entries and the number of rows processed.
    pub fn step(&mut self, model: &Llama<'_>, kv: &mut KvArena<'_>) -> (Vec<CommitEntry>, usize) {
        let active: Vec<usize> = (0..self.reqs.len())
            .filter(|&i| !self.reqs[i].finished())
            .collect();
        let tables: Vec<Vec<u32>> = self.reqs.iter().map(|r| r.table.clone()).collect();
        let mut rows = Vec::new();
        for &i in &active {
            let r = &self.reqs[i];
            let n = r.tokens.len();
            for pos in r.kv_len..n {
                rows.push(Row {
                    seq: i,
                    pos,
                    token: r.tokens[pos],
                    logits: pos == n - 1,
                });
            }
        }
        if rows.is_empty() {
            return (Vec::new(), 0);
        }
        let logits = model.forward(kv, &tables, &rows);
        let mut entries = Vec::with_capacity(active.len());
        for (&i, l) in active.iter().zip(&logits) {
            let r = &mut self.reqs[i];
            r.kv_len = r.tokens.len();
            let pos = r.generated() as u32;
            let t = sampler::sample(l, &r.params, &mut r.rng);
            r.tokens.push(t);
            entries.push(CommitEntry {
                request_id: r.id,
                pos,
                tokens: vec![t],
                sampler_state: r.rng,
                finished: r.finished(),
            });
        }
        (entries, rows.len())
    }

    /// Prefills the cache for every request's current tokens except the last (which the next
    /// `step` feeds). This is the rebuild after a takeover; returns the positions processed.
    pub fn rebuild(&mut self, model: &Llama<'_>, kv: &mut KvArena<'_>) -> usize {
        let tables: Vec<Vec<u32>> = self.reqs.iter().map(|r| r.table.clone()).collect();
        let mut rows = Vec::new();
        for (i, r) in self.reqs.iter().enumerate() {
            if r.finished() {
                continue;
            }
            for pos in r.kv_len..r.tokens.len().saturating_sub(1) {
                rows.push(Row {
                    seq: i,
                    pos,
                    token: r.tokens[pos],
                    logits: false,
                });
            }
        }
        model.forward(kv, &tables, &rows);
        for r in &mut self.reqs {
            if !r.finished() {
                r.kv_len = r.tokens.len().saturating_sub(1);
            }
        }
        rows.len()
    }

    /// Whether every request is finished.
    pub fn done(&self) -> bool {
        self.reqs.iter().all(Req::finished)
    }

    /// Whether request `id` is in the engine.
    pub fn contains(&self, id: u64) -> bool {
        self.reqs.iter().any(|r| r.id == id)
    }

    /// Removes the finished requests and returns their pages to the pool (serving mode, where
    /// requests come and go).
    pub fn take_finished(&mut self) -> Vec<Req> {
        let (done, live): (Vec<Req>, Vec<Req>) = std::mem::take(&mut self.reqs)
            .into_iter()
            .partition(Req::finished);
        self.reqs = live;
        for r in &done {
            self.free.extend(r.table.iter().rev());
        }
        done
    }
}

/// Initial RNG state of a new request.
pub fn initial_rng(p: &SamplingParams, id: u64) -> u64 {
    sampler::initial_state(p.seed, id)
}
