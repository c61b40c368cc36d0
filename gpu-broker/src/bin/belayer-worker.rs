//! `belayer-worker`: the reference rollout worker (a thin adapter over `gpu_broker::worker`).
//! Batch mode runs `--requests N` synthetic prompts; `--serve PATH` answers clients on a Unix
//! socket instead (JSON lines, `gpu_broker::worker::serve::protocol`) until fenced or killed.
//! Exit codes: 0 done, 1 error, 3 broker restarted, 75 fenced (stale epoch).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use gpu_broker::wire::Role;
use gpu_broker::worker::jobs::{JobSpec, Mode};
use gpu_broker::worker::serve::{ServeOptions, serve};
use gpu_broker::worker::{Options, WorkerError, model_path, run};

const USAGE: &str = "usage: belayer-worker --socket PATH [--role primary|shadow] [--model GGUF] \
[--requests N] [--prompt-len N] [--max-new N] [--mode greedy|seeded|mixed] [--seed N] [--out FILE] \
[--threads N] [--scribble-after STEPS] [--hang-after STEPS]
       belayer-worker --socket PATH --serve SOCKET [--role primary|shadow] [--model GGUF] [--threads N] \
[--max-batch N] [--max-seq N]";

fn parse() -> Result<(Options, Option<ServeOptions>)> {
    let mut o = Options {
        socket: PathBuf::new(),
        model: model_path(),
        role: Role::Primary,
        jobs: JobSpec {
            requests: 4,
            prompt_len: 64,
            max_new: 32,
            mode: Mode::Mixed,
            seed: 1,
        },
        out: None,
        threads: std::thread::available_parallelism().map_or(1, usize::from),
        scribble_after: None,
        hang_after: None,
    };
    let mut serve_path: Option<PathBuf> = None;
    let (mut max_batch, mut max_seq) = (16usize, 1024usize);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--socket" => o.socket = val()?.into(),
            "--model" => o.model = val()?.into(),
            "--role" => {
                o.role = match val()?.as_str() {
                    "primary" => Role::Primary,
                    "shadow" => Role::Shadow,
                    r => bail!("--role {r}: expected primary or shadow"),
                }
            }
            "--requests" => o.jobs.requests = val()?.parse()?,
            "--prompt-len" => o.jobs.prompt_len = val()?.parse()?,
            "--max-new" => o.jobs.max_new = val()?.parse()?,
            "--seed" => o.jobs.seed = val()?.parse()?,
            "--mode" => {
                o.jobs.mode = match val()?.as_str() {
                    "greedy" => Mode::Greedy,
                    "seeded" => Mode::Seeded,
                    "mixed" => Mode::Mixed,
                    m => bail!("--mode {m}: expected greedy, seeded or mixed"),
                }
            }
            "--out" => o.out = Some(val()?.into()),
            "--threads" => o.threads = val()?.parse()?,
            "--scribble-after" => o.scribble_after = Some(val()?.parse()?),
            "--hang-after" => o.hang_after = Some(val()?.parse()?),
            "--serve" => serve_path = Some(val()?.into()),
            "--max-batch" => max_batch = val()?.parse()?,
            "--max-seq" => max_seq = val()?.parse()?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {a}\n{USAGE}"),
        }
    }
    if o.socket.as_os_str().is_empty() {
        bail!("--socket is required\n{USAGE}");
    }
    let serve = serve_path.map(|listen| ServeOptions {
        listen,
        max_batch: max_batch.max(1),
        max_seq: max_seq.max(2),
    });
    Ok((o, serve))
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELAYER_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let (opts, serving) = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("belayer-worker: {e:#}");
            return ExitCode::from(2);
        }
    };
    let result = match &serving {
        Some(so) => serve(&opts, so),
        None => run(&opts).map(drop),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = match &e {
                WorkerError::Fenced(_) => 75,
                WorkerError::BrokerRestarted(_) => 3,
                _ => 1,
            };
            eprintln!("belayer-worker: {:#}", anyhow::Error::new(e));
            ExitCode::from(code)
        }
    }
}
