//! `belayer-bench worker`: the rollout worker's whole recovery. N in-flight requests with long
//! prompts; the worker is killed mid-generation. With Belayer a pre-started shadow takes over
//! the lease and rebuilds the KV cache from the broker's token log; without, a new process
//! starts cold and prefills the same requests again. Both are timed from the kill (or the new
//! process's spawn) to every request generating again, interleaved run by run. Also: promotion
//! alone, the weight checksum (integrity work only Belayer's cold load does), the rebuild cost
//! curve, and that the shadow's tokens equal an unkilled run's.

pub mod report;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use gpu_broker::client::Client;
use gpu_broker::wire::Role;
use gpu_broker::worker::jobs::Results;
use report::{Rebuild, Recovery, Report};

use crate::bench::Common;
use crate::bench::procs::{Proc, broker, find_bin};
use crate::bench::record::Record;
use crate::bench::stats::Samples;

const LONG: Duration = Duration::from_secs(1800);

/// `belayer-bench worker`: needs the model (gpu-broker/scripts/fetch-model) and the workspace's
/// belayer-gpu-broker and belayer-worker beside this binary or on PATH; not root.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Recoveries of each kind (cold start and takeover, interleaved)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// In-flight requests when the worker is killed
    #[arg(long, default_value_t = 8)]
    pub requests: usize,
    /// Prompt tokens of each request (request i adds (13 i) mod 32)
    #[arg(long, default_value_t = 256)]
    pub prompt_len: usize,
    /// Decode steps before the kill
    #[arg(long, default_value_t = 8)]
    pub kill_after: usize,
    /// Tokens each request generates in all
    #[arg(long, default_value_t = 16)]
    pub max_new: usize,
    /// Three rebuild points instead of six
    #[arg(long)]
    pub quick: bool,
    /// The GGUF model [default: gpu-broker's reference model]
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Worker threads [default: the machine's cores]
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub common: Common,
}

struct Ctx {
    broker: PathBuf,
    worker: PathBuf,
    model: PathBuf,
    threads: usize,
    dir: PathBuf,
}

impl Ctx {
    fn fresh(&self, tag: &str) -> Result<PathBuf> {
        let d = self.dir.join(tag);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    }

    fn worker(&self, d: &Path, role: &str, tag: &str, jobs: &[String]) -> Result<Proc> {
        let mut a: Vec<String> = vec![
            "--socket".into(),
            d.join("broker.sock").display().to_string(),
            "--role".into(),
            role.into(),
            "--model".into(),
            self.model.display().to_string(),
            "--threads".into(),
            self.threads.to_string(),
            "--out".into(),
            d.join(format!("{tag}.json")).display().to_string(),
        ];
        a.extend(jobs.iter().cloned());
        Proc::spawn(&self.worker, &a, d.join(format!("{tag}.err")))
    }
}

fn jobs(a: &Args, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--requests",
        &a.requests.to_string(),
        "--prompt-len",
        &a.prompt_len.to_string(),
        "--max-new",
        &a.max_new.to_string(),
        "--mode",
        "mixed",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn t_of(e: &serde_json::Value) -> f64 {
    e["t"].as_f64().unwrap_or(0.0)
}

/// Generated tokens per in-flight request, from the broker's log.
fn generated(obs: &Client) -> Result<BTreeMap<u64, usize>> {
    let mut m = BTreeMap::new();
    for (id, _) in obs.log_ids()? {
        m.insert(id, obs.log_get(id)?.generated.len());
    }
    Ok(m)
}

/// Polls the log every 5 ms until `n` requests each have more than `floor(id)` tokens; the
/// Unix time it first saw that.
fn wait_tokens(obs: &Client, n: usize, floor: impl Fn(u64) -> usize) -> Result<f64> {
    let end = Instant::now() + LONG;
    loop {
        let g = generated(obs)?;
        if g.len() >= n && g.iter().all(|(id, t)| *t > floor(*id)) {
            return Ok(gpu_broker::worker::events::now());
        }
        ensure!(Instant::now() < end, "requests did not generate in time");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn observer(d: &Path) -> Result<Client> {
    Ok(Client::connect(&d.join("broker.sock"), Role::Observer, 0)?)
}

/// Without Belayer: a new process (spawned now, the moment of the kill) cold loads the model
/// and prefills the same requests; timed to every request generating again and to every
/// request back at the kill's position.
fn cold_recovery(c: &Ctx, a: &Args, i: u32) -> Result<Recovery> {
    let d = c.fresh(&format!("cold-{i}"))?;
    let _b = broker(&c.broker, &d, "b", &[])?;
    let mut p = c.worker(&d, "primary", "p", &jobs(a, &[]))?;
    let ready = p.wait_event("ready", LONG)?;
    let obs = observer(&d)?;
    let again = wait_tokens(&obs, a.requests, |_| 0)?;
    let back = wait_tokens(&obs, a.requests, |_| a.kill_after.saturating_sub(1))?;
    let load = p
        .event("cold_load")
        .map_or(0.0, |e| e["seconds"].as_f64().unwrap_or(0.0));
    Ok(Recovery {
        ready_s: t_of(&ready) - p.spawned_at,
        rebuild_s: 0.0,
        generating_s: again - p.spawned_at,
        caught_up_s: back - p.spawned_at,
        cold_load_s: load,
        in_flight_tokens: 0,
    })
}

/// With Belayer: the primary stops after `kill_after` steps and is SIGKILLed; the pre-started
/// shadow is promoted, rebuilds the KV cache from the log and generates again. Returns the
/// recovery and the tokens the shadow ended with.
fn takeover_recovery(c: &Ctx, a: &Args, i: u32) -> Result<(Recovery, Results)> {
    let d = c.fresh(&format!("takeover-{i}"))?;
    let _b = broker(&c.broker, &d, "b", &[])?;
    let hang = a.kill_after.to_string();
    let mut p = c.worker(&d, "primary", "p", &jobs(a, &["--hang-after", &hang]))?;
    let mut s = c.worker(&d, "shadow", "s", &jobs(a, &[]))?;
    s.wait_event("shadow_ready", LONG)?;
    p.wait_event("hanging", LONG)?;
    let obs = observer(&d)?;
    let at_kill = generated(&obs)?;
    let t_kill = p.sigkill();
    let ready = s.wait_event("ready", LONG)?;
    let again = wait_tokens(&obs, a.requests, |id| {
        at_kill.get(&id).copied().unwrap_or(0)
    })?;
    let rebuilt = s.wait_event("rebuilt", LONG)?;
    ensure!(
        s.wait_exit(LONG)? == 0,
        "shadow failed: {}",
        s.stderr_text()
    );
    let r = Recovery {
        ready_s: t_of(&ready) - t_kill,
        rebuild_s: rebuilt["seconds"].as_f64().unwrap_or(0.0),
        generating_s: again - t_kill,
        caught_up_s: again - t_kill,
        cold_load_s: 0.0,
        in_flight_tokens: rebuilt["tokens"].as_u64().unwrap_or(0),
    };
    Ok((r, read_results(&d.join("s.json"))?))
}

/// The tokens of an unkilled run of the same jobs, and the weight checksum's time measured by
/// the broker's health check (`--checksum always`) on a promotion.
fn reference(c: &Ctx, a: &Args) -> Result<(Results, f64)> {
    let d = c.fresh("reference")?;
    let _b = broker(&c.broker, &d, "b", &["--checksum", "always"])?;
    let mut p = c.worker(&d, "primary", "base", &jobs(a, &[]))?;
    ensure!(
        p.wait_exit(LONG)? == 0,
        "reference worker failed: {}",
        p.stderr_text()
    );
    let base = read_results(&d.join("base.json"))?;
    // A promotion under `--checksum always` checksums every weight byte once.
    let d = c.fresh("checksum")?;
    let _b = broker(&c.broker, &d, "b", &["--checksum", "always"])?;
    let one = ["--requests", "1", "--prompt-len", "8", "--max-new", "4"].map(String::from);
    let mut p = c.worker(
        &d,
        "primary",
        "p",
        &[&one[..], &["--hang-after".into(), "1".into()]].concat(),
    )?;
    let mut s = c.worker(&d, "shadow", "s", &one)?;
    s.wait_event("shadow_ready", LONG)?;
    p.wait_event("hanging", LONG)?;
    p.sigkill();
    s.wait_event("ready", LONG)?;
    let us = observer(&d)?.status()?.last_health_us;
    Ok((base, us as f64 / 1e6))
}

fn read_results(p: &Path) -> Result<Results> {
    serde_json::from_slice(&std::fs::read(p).with_context(|| format!("reading {}", p.display()))?)
        .context("parsing worker results")
}

fn rebuild_curve(c: &Ctx, quick: bool) -> Result<Vec<Rebuild>> {
    let points: Vec<(usize, usize)> = if quick {
        vec![(1, 256), (8, 256), (1, 1024)]
    } else {
        vec![
            (1, 256),
            (1, 1024),
            (8, 256),
            (8, 1024),
            (32, 256),
            (32, 1024),
        ]
    };
    let d = c.fresh("rebuild")?;
    let _b = broker(&c.broker, &d, "b", &["--kv-mib", "2048"])?;
    let secs = gpu_broker::worker::measure::rebuild_times(
        &d.join("broker.sock"),
        &c.model,
        c.threads,
        &points,
    )
    .context("measuring rebuild")?;
    Ok(points
        .iter()
        .zip(secs)
        .map(|(&(requests, tokens), seconds)| Rebuild {
            requests,
            tokens,
            seconds,
        })
        .collect())
}

fn shmem_thp() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
        .ok()
        .and_then(|s| {
            s.split('[')
                .nth(1)
                .and_then(|t| t.split(']').next())
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Runs the suite; `Ok(false)` when the shadow's tokens differ from the unkilled run's.
pub fn run(args: &Args) -> Result<bool, String> {
    suite(args).map_err(|e| format!("{e:#}"))
}

fn suite(a: &Args) -> Result<bool> {
    ensure!(
        a.kill_after < a.max_new,
        "--kill-after must be below --max-new"
    );
    let rec = Record::start("worker", &a.common.out("worker")).map_err(anyhow::Error::msg)?;
    let model = a
        .model
        .clone()
        .unwrap_or_else(gpu_broker::worker::model_path);
    ensure!(
        model.is_file(),
        "model file {} is missing: run gpu-broker/scripts/fetch-model",
        model.display()
    );
    let c = Ctx {
        broker: find_bin("belayer-gpu-broker")?,
        worker: find_bin("belayer-worker")?,
        model,
        threads: a
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
        dir: rec.out.join("runs"),
    };
    let (base, checksum_s) = reference(&c, a)?;
    let mut samples = Samples::default();
    let mut identical = true;
    for i in 0..a.runs {
        // Interleaved, and alternating which goes first.
        let mut sides = [true, false];
        if i % 2 == 1 {
            sides.reverse();
        }
        for cold in sides {
            if cold {
                let r = cold_recovery(&c, a, i)?;
                eprintln!(
                    "cold start {i}: generating again after {:.2}s",
                    r.generating_s
                );
                r.push(&mut samples, "cold");
            } else {
                let (r, got) = takeover_recovery(&c, a, i)?;
                eprintln!(
                    "takeover {i}: generating again after {:.2}s",
                    r.generating_s
                );
                r.push(&mut samples, "takeover");
                identical &= got == base;
            }
        }
    }
    let rebuild = rebuild_curve(&c, a.quick)?;
    let _ = std::fs::remove_dir_all(&c.dir);
    let r = Report {
        requests: a.requests,
        prompt_len: a.prompt_len,
        kill_after: a.kill_after,
        max_new: a.max_new,
        threads: c.threads,
        shmem_thp: shmem_thp(),
        weight_checksum_s: checksum_s,
        samples,
        rebuild,
        tokens_identical: identical,
    };
    rec.report(&r.table(), r.results(), Some(r.plot()), r.summary())
        .map_err(anyhow::Error::msg)?;
    Ok(identical)
}
