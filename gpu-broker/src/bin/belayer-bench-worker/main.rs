//! `belayer-bench-worker` (run as `belayer-bench worker`): rollout-worker cold start against
//! shadow takeover, the KV rebuild cost curve, and a real SIGKILL test, in one run. Prints a table;
//! writes `worker-bench.json` and `rebuild.svg` into `--out DIR`; the last stdout line is the JSON
//! summary.

mod procs;
mod report;
mod svg;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use gpu_broker::client::Client;
use gpu_broker::wire::Role;
use gpu_broker::worker::jobs::Results;
use procs::{Proc, broker, find_bin};
use report::{KillTest, Rebuild, Report, median};

const USAGE: &str =
    "usage: belayer-bench-worker [--quick] [--out DIR] [--model GGUF] [--threads N]";
const LONG: Duration = Duration::from_secs(1800);

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

fn jobs(requests: usize, prompt: usize, new: usize, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--requests",
        &requests.to_string(),
        "--prompt-len",
        &prompt.to_string(),
        "--max-new",
        &new.to_string(),
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

/// Fresh broker, new worker process: spawn → ready (load, dequantize, allocate, warm up).
fn cold_start(c: &Ctx, i: usize) -> Result<(f64, f64)> {
    let d = c.fresh(&format!("cold-{i}"))?;
    let _b = broker(&c.broker, &d, "b", &[])?;
    let mut p = c.worker(&d, "primary", "p", &jobs(1, 8, 1, &[]))?;
    let ready = p.wait_event("ready", LONG)?;
    let load = p
        .event("cold_load")
        .map_or(0.0, |e| e["seconds"].as_f64().unwrap_or(0.0));
    ensure!(
        p.wait_exit(LONG)? == 0,
        "cold-start worker failed: {}",
        p.stderr_text()
    );
    Ok((t_of(&ready) - p.spawned_at, load))
}

/// SIGKILL a primary holding the lease; time until the pre-started shadow is ready to decode.
fn takeover(c: &Ctx, i: usize, broker_args: &[&str]) -> Result<(f64, u64)> {
    let d = c.fresh(&format!("takeover-{i}"))?;
    let _b = broker(&c.broker, &d, "b", broker_args)?;
    let j = jobs(1, 8, 64, &["--hang-after", "1"]);
    let mut p = c.worker(&d, "primary", "p", &j)?;
    let mut s = c.worker(&d, "shadow", "s", &jobs(1, 8, 64, &[]))?;
    s.wait_event("shadow_ready", LONG)?;
    p.wait_event("hanging", LONG)?;
    let t_kill = p.sigkill();
    let ready = s.wait_event("ready", LONG)?;
    let health = Client::connect(&d.join("broker.sock"), Role::Observer, 0)?
        .status()?
        .last_health_us;
    Ok((t_of(&ready) - t_kill, health))
}

fn kill_test(c: &Ctx, quick: bool) -> Result<KillTest> {
    let (n, prompt, new, after) = if quick {
        (4, 128, 16, 4)
    } else {
        (8, 256, 32, 8)
    };
    let j = jobs(n, prompt, new, &[]);
    let d = c.fresh("kill-baseline")?;
    let base = {
        let _b = broker(&c.broker, &d, "b", &[])?;
        let mut p = c.worker(&d, "primary", "base", &j)?;
        ensure!(
            p.wait_exit(LONG)? == 0,
            "baseline worker failed: {}",
            p.stderr_text()
        );
        read_results(&d.join("base.json"))?
    };
    let d = c.fresh("kill")?;
    let _b = broker(&c.broker, &d, "b", &[])?;
    let mut p = c.worker(&d, "primary", "p", &j)?;
    let mut s = c.worker(&d, "shadow", "s", &j)?;
    s.wait_event("shadow_ready", LONG)?;
    let obs = Client::connect(&d.join("broker.sock"), Role::Observer, 0)?;
    loop {
        if obs.log_get(1).is_ok_and(|l| l.generated.len() >= after) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let t_kill = p.sigkill();
    let ready = s.wait_event("ready", LONG)?;
    let rebuilt = s.wait_event("rebuilt", LONG)?;
    ensure!(
        s.wait_exit(LONG)? == 0,
        "shadow failed: {}",
        s.stderr_text()
    );
    let got = read_results(&d.join("s.json"))?;
    Ok(KillTest {
        requests: n,
        prompt_len: prompt,
        max_new: new,
        killed_after_tokens: after,
        takeover_s: t_of(&ready) - t_kill,
        rebuild_s: rebuilt["seconds"].as_f64().unwrap_or(0.0),
        rebuild_tokens: rebuilt["tokens"].as_u64().unwrap_or(0),
        tokens_identical: got == base,
    })
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

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
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

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELAYER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut quick = false;
    let mut out = PathBuf::from("bench-out/worker");
    let mut model = gpu_broker::worker::model_path();
    let mut threads = std::thread::available_parallelism().map_or(1, usize::from);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = args.next().context(USAGE)?.into(),
            "--model" => model = args.next().context(USAGE)?.into(),
            "--threads" => threads = args.next().context(USAGE)?.parse()?,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => bail!("unknown argument {a}\n{USAGE}"),
        }
    }
    ensure!(
        model.is_file(),
        "model file {} is missing: run gpu-broker/scripts/fetch-model",
        model.display()
    );
    std::fs::create_dir_all(&out)?;
    let c = Ctx {
        broker: find_bin("belayer-gpu-broker")?,
        worker: find_bin("belayer-worker")?,
        model,
        threads,
        dir: out.join("runs"),
    };
    let load_start = loadavg();
    let reps = 3;
    let mut cold = Vec::new();
    let mut loads = Vec::new();
    for i in 0..reps {
        let (s, l) = cold_start(&c, i)?;
        eprintln!("cold start {i}: {s:.3}s");
        cold.push(s);
        loads.push(l);
    }
    let mut take = Vec::new();
    let mut health = Vec::new();
    for i in 0..reps {
        let (s, h) = takeover(&c, i, &[])?;
        eprintln!("takeover {i}: {s:.4}s");
        take.push(s);
        health.push(h as f64);
    }
    let (take_ck, health_ck) = takeover(&c, 99, &["--checksum", "always"])?;
    let rebuild = rebuild_curve(&c, quick)?;
    let kill = kill_test(&c, quick)?;
    let cold_start_s = median(&cold);
    let takeover_s = median(&take);
    let r = Report {
        quick,
        threads,
        cpu: cpu_name(),
        shmem_thp: shmem_thp(),
        loadavg: [load_start, loadavg()],
        cold_start_s,
        cold_start_runs: cold,
        cold_load_s: median(&loads),
        takeover_s,
        takeover_runs: take,
        takeover_checksum_s: take_ck,
        health_check_us: median(&health) as u64,
        health_check_checksum_us: health_ck,
        speedup_takeover: cold_start_s / takeover_s.max(1e-9),
        rebuild,
        tokens_identical: kill.tokens_identical,
        kill_test: kill,
    };
    print!("{}", report::table(&r));
    let json = serde_json::to_string(&r)?;
    std::fs::write(
        out.join("worker-bench.json"),
        serde_json::to_string_pretty(&r)?,
    )?;
    std::fs::write(
        out.join("rebuild.svg"),
        svg::plot(&r.rebuild, r.cold_start_s, r.takeover_s),
    )?;
    let _ = std::fs::remove_dir_all(&c.dir);
    println!("{json}");
    Ok(())
}
