//! Serving mode (`belayer-worker --serve PATH`): the worker answers generation requests from
//! clients over a Unix socket (JSON lines, see [`protocol`]), batching whatever is in flight into
//! one forward per step and committing every token to the broker's log, as in batch mode.
//!
//! Failover: a shadow started with `--serve` maps the weights and waits for promotion; promoted,
//! it loads every unfinished request from the log, takes over the *same* socket path (bound under
//! a temporary name and renamed over it) and rebuilds the KV of those requests by one prefill.
//! Clients whose connection to the dead primary broke reconnect to the path and send their
//! request again under the same id: the new primary attaches them to the continuing request, or
//! answers from the log if it already finished.

pub mod protocol;

mod listen;

use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::json;

use super::engine::{self, Engine, Req};
use super::events::emit;
use super::run::Session;
use super::{Options, WorkerError, geom_of, kv_view, map_kv, warm_up};
use crate::client::Heartbeat;
use crate::model::kv::{KvArena, pages_for};
use crate::model::llama::Llama;
use crate::wire::{MAX_TOKENS, Role, SamplingParams};
use listen::Incoming;
use protocol::{GenReply, GenRequest};

/// Serving limits.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The socket clients connect to.
    pub listen: PathBuf,
    /// Requests decoded together at most (KV pages are granted for this many).
    pub max_batch: usize,
    /// Longest prompt + generation of one request.
    pub max_seq: usize,
}

/// Why a request is refused before it is admitted (sent back as its reply's `error`).
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// Nothing to generate from, or nothing to generate.
    #[error("empty prompt or max_new = 0")]
    Empty,
    /// Prompt and generation do not fit one sequence of this worker.
    #[error("prompt {prompt} + max_new {max_new} exceeds this worker's --max-seq {max_seq}")]
    OverMaxSeq {
        prompt: usize,
        max_new: u32,
        max_seq: usize,
    },
    /// The prompt is longer than the broker's token log takes.
    #[error("prompt {prompt} exceeds the most tokens a request carries ({MAX_TOKENS})")]
    OverMaxTokens { prompt: usize },
}

/// The engine thread's bookkeeping around [`Engine`].
struct Server<'a> {
    se: &'a Session<'a>,
    so: &'a ServeOptions,
    epoch: u64,
    engine: Engine,
    /// Admitted, waiting for KV pages or a batch slot.
    pending: VecDeque<Req>,
    /// Connections waiting for each request.
    waiters: HashMap<u64, Vec<UnixStream>>,
}

impl Server<'_> {
    fn reply(&self, id: u64, tokens: Vec<u32>, error: Option<String>, from_log: bool) -> GenReply {
        GenReply {
            id,
            tokens,
            error,
            worker_pid: std::process::id(),
            epoch: self.epoch,
            from_log,
        }
    }

    /// Answers every connection waiting for `id`.
    fn answer(&mut self, id: u64, tokens: Vec<u32>) {
        let r = self.reply(id, tokens, None, false);
        for mut c in self.waiters.remove(&id).unwrap_or_default() {
            listen::reply(&mut c, &r);
        }
    }

    fn check(&self, r: &GenRequest) -> Result<(), Refusal> {
        if r.prompt.is_empty() || r.max_new == 0 {
            return Err(Refusal::Empty);
        }
        if r.prompt.len() + r.max_new as usize > self.so.max_seq {
            return Err(Refusal::OverMaxSeq {
                prompt: r.prompt.len(),
                max_new: r.max_new,
                max_seq: self.so.max_seq,
            });
        }
        if r.prompt.len() > MAX_TOKENS {
            return Err(Refusal::OverMaxTokens {
                prompt: r.prompt.len(),
            });
        }
        Ok(())
    }

    /// A request arrived: attach it to the same id in flight, answer it from the log, or admit it.
    fn intake(&mut self, inc: Incoming) -> Result<(), WorkerError> {
        let Incoming { req, mut conn } = inc;
        let id = req.id;
        if let Err(why) = self.check(&req) {
            let why = Some(why.to_string());
            listen::reply(&mut conn, &self.reply(id, Vec::new(), why, false));
            return Ok(());
        }
        if self.engine.contains(id) || self.pending.iter().any(|r| r.id == id) {
            self.waiters.entry(id).or_default().push(conn);
            return Ok(());
        }
        // Finished in the log (here or by a worker before this one): answered from there. The
        // broker keeps only the newest finished requests; one it let go is admitted anew.
        match self.se.client.log_get(id) {
            Ok(l) if l.finished => {
                let r = if l.prompt == req.prompt {
                    self.reply(id, l.generated, None, true)
                } else {
                    let why = format!("request id {id} was used for another prompt");
                    self.reply(id, Vec::new(), Some(why), false)
                };
                listen::reply(&mut conn, &r);
                return Ok(());
            }
            // Logged, unfinished and not here: continue it from the log, as at a takeover.
            Ok(l) => {
                self.pending.push_back(Req::from_log(&l));
                self.waiters.entry(id).or_default().push(conn);
                return Ok(());
            }
            Err(e) if e.is_bad_request() => {}
            Err(e) => return Err(self.se.b(e)),
        }
        let params = SamplingParams {
            temperature: req.temperature,
            top_k: req.top_k,
            seed: req.seed,
            max_new_tokens: req.max_new,
        };
        let rng = engine::initial_rng(&params, id);
        match self.se.client.admit(id, params, rng, req.prompt.clone()) {
            Ok(()) => {}
            Err(e) if e.is_stale_epoch() || e.is_broker_restart() => return Err(self.se.b(e)),
            Err(e) => {
                listen::reply(
                    &mut conn,
                    &self.reply(id, Vec::new(), Some(e.to_string()), false),
                );
                return Ok(());
            }
        }
        self.pending.push_back(Req {
            id,
            params,
            prompt_len: req.prompt.len(),
            tokens: req.prompt,
            kv_len: 0,
            rng,
            table: Vec::new(),
        });
        self.waiters.entry(id).or_default().push(conn);
        Ok(())
    }

    /// Moves pending requests into the engine while batch slots and pages last.
    fn fill(&mut self) {
        while self.engine.reqs.len() < self.so.max_batch {
            let Some(r) = self.pending.pop_front() else {
                break;
            };
            if let Err(engine::NoPages(..)) = self.engine.add(r.clone()) {
                self.pending.push_front(r);
                break;
            }
        }
    }

    /// One batched step; answers what finished.
    fn step(&mut self, model: &Llama<'_>, kv: &mut KvArena<'_>) -> Result<(), WorkerError> {
        let (entries, _rows) = self.engine.step(model, kv);
        if entries.is_empty() {
            return Ok(());
        }
        self.se.client.commit(entries).map_err(|e| self.se.b(e))?;
        for r in self.engine.take_finished() {
            let generated = r.tokens[r.prompt_len..].to_vec();
            self.answer(r.id, generated);
        }
        Ok(())
    }

    /// Serves until the broker fences us or an error occurs.
    fn run(
        &mut self,
        rx: &Receiver<Incoming>,
        model: &Llama<'_>,
        kv: &mut KvArena<'_>,
        hb: &Heartbeat,
    ) -> Result<(), WorkerError> {
        loop {
            let busy = !self.engine.reqs.is_empty() || !self.pending.is_empty();
            let first = if busy {
                rx.try_recv().ok()
            } else {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(i) => Some(i),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => {
                        return Err(WorkerError::Protocol("the serving socket closed".into()));
                    }
                }
            };
            for inc in first
                .into_iter()
                .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            {
                self.intake(inc)?;
            }
            self.fill();
            self.step(model, kv)?;
            if hb.fenced() {
                // The next commit would be refused too; say so with the broker's own answer.
                self.se.client.heartbeat().map_err(|e| self.se.b(e))?;
            }
        }
    }
}

/// Runs a serving worker (primary, or shadow until promoted) until it is fenced or killed.
pub fn serve(opts: &Options, so: &ServeOptions) -> Result<(), WorkerError> {
    let se = Session::connect(opts, json!({ "serve": so.listen.display().to_string() }))?;
    let a = se.attach(|_| (so.max_batch * pages_for(so.max_seq) + 1) as u32)?;
    let (grant, w, cold) = (&a.grant, &a.weights, a.cold);
    let model = Llama::new(&w.layout, w.floats(), se.threads)
        .map_err(|e| WorkerError::Protocol(e.to_string()))?;
    let geom = geom_of(w);
    let mut kv_map = map_kv(&a.regions, geom)?;
    let mut server = Server {
        se: &se,
        so,
        epoch: grant.epoch,
        engine: Engine::new(geom, &grant.pages),
        pending: VecDeque::new(),
        waiters: HashMap::new(),
    };
    let scratch = server
        .engine
        .take_page()
        .ok_or_else(|| WorkerError::Protocol("empty grant".into()))?;
    if opts.role == Role::Primary || cold {
        let mut kv = KvArena {
            data: kv_view(&mut kv_map),
            geom,
        };
        warm_up(&model, &mut kv, scratch);
    }
    // The log is the source of truth: finished requests are answered from it, unfinished ones
    // (a dead primary's) continue here.
    let mut inflight_tokens = 0;
    for (id, finished) in se.client.log_ids().map_err(|e| se.b(e))? {
        if finished {
            continue;
        }
        let r = Req::from_log(&se.client.log_get(id).map_err(|e| se.b(e))?);
        inflight_tokens += r.tokens.len();
        server.pending.push_back(r);
    }
    server.fill();
    let listener = listen::bind(&so.listen)
        .map_err(|e| WorkerError::Listen(so.listen.display().to_string(), e))?;
    let (tx, rx) = mpsc::channel();
    let epoch = grant.epoch;
    std::thread::spawn(move || listen::accept_loop(listener, tx, epoch));
    emit(
        "serving",
        json!({ "since_grant_s": a.t_grant.elapsed().as_secs_f64(), "cold": cold,
                "takeover": grant.takeover, "inflight": server.engine.reqs.len() + server.pending.len(),
                "path": so.listen.display().to_string() }),
    );
    let mut kv = KvArena {
        data: kv_view(&mut kv_map),
        geom,
    };
    if grant.takeover {
        let t = Instant::now();
        let rows = server.engine.rebuild(&model, &mut kv);
        emit(
            "rebuilt",
            json!({ "requests": server.engine.reqs.len(), "tokens": inflight_tokens, "rows": rows,
                    "seconds": t.elapsed().as_secs_f64() }),
        );
    }
    server.run(&rx, &model, &mut kv, &a.hb)
}
