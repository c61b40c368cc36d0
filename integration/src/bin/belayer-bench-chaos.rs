//! `belayer-bench chaos`: the seeded fault-injection soak (`belayer_integration::chaos`). N
//! sandboxes with automatic checkpoints and recovery run agent-like trajectories while a seeded
//! schedule kills inits and CRIU, races explicit requests against the automatic ones and
//! corrupts checkpoints; prints faults survived per kind, trajectories lost, recovery latency,
//! frozen time, the seed and the command that reproduces the run, and a JSON last line.

use std::process::ExitCode;
use std::time::Duration;

use belayer_integration::chaos::{self, Config, Kind};
use belayer_integration::{Containerd, Flavor};

const USAGE: &str = "usage: belayer-bench chaos [--sandboxes N] [--minutes M] [--seed S] [--kinds A,B,…] [--rate P] [--holder-mb MB] [--events]\n\n  \
    --sandboxes N  sandboxes side by side (default 12)\n  \
    --minutes M    how long the trajectories run (default 30; fractions allowed)\n  \
    --seed S       the schedule's seed (default: from the clock, printed)\n  \
    --kinds A,B    fault kinds drawn (default all: init-kill-gap, init-kill-action,\n                 \
    init-kill-checkpoint, criu-kill-dump, race-checkpoint, race-restore, race-fork,\n                 \
    race-rm, corrupt-newest)\n  \
    --rate P       probability that a turn carries a fault (default 0.2)\n  \
    --holder-mb MB memory each sandbox's background process holds (default 32)\n  \
    --events       print every fault and what came of it";

struct Args {
    cfg: Config,
    events: bool,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut cfg = Config::new(12, Duration::from_secs(30 * 60), chaos::rng::fresh_seed());
    let mut events = false;
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--sandboxes" => cfg.sandboxes = number(&flag, &value()?)?,
            "--minutes" => {
                let v = value()?;
                let m: f64 = v
                    .parse()
                    .map_err(|_| format!("--minutes: {v:?} is no number"))?;
                cfg.duration = Duration::from_secs_f64(m * 60.0);
            }
            "--seed" => cfg.seed = number(&flag, &value()?)?,
            "--kinds" => {
                cfg.schedule.kinds = value()?
                    .split(',')
                    .map(|k| Kind::parse(k).ok_or(format!("--kinds: unknown kind {k:?}")))
                    .collect::<Result<_, _>>()?
            }
            "--rate" => {
                let v = value()?;
                cfg.schedule.rate = v
                    .parse()
                    .map_err(|_| format!("--rate: {v:?} is no number"))?
            }
            "--holder-mb" => cfg.holder_mb = number(&flag, &value()?)?,
            "--events" => events = true,
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    let bin_dir = std::env::var("BELAYER_BIN_DIR").unwrap_or_default();
    let kinds: Vec<&str> = cfg.schedule.kinds.iter().map(|k| k.name()).collect();
    cfg.command = format!(
        "{}belayer-bench chaos --sandboxes {} --minutes {} --seed {} --kinds {} --rate {} --holder-mb {}",
        if bin_dir.is_empty() {
            String::new()
        } else {
            format!("BELAYER_BIN_DIR={bin_dir} ")
        },
        cfg.sandboxes,
        cfg.duration.as_secs_f64() / 60.0,
        cfg.seed,
        kinds.join(","),
        cfg.schedule.rate,
        cfg.holder_mb
    );
    Ok(Some(Args { cfg, events }))
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: {v:?} is no count"))
}

fn main() -> ExitCode {
    let parsed = parse(std::env::args().skip(1));
    belayer_integration::bench::run_main("belayer-bench-chaos", USAGE, parsed, || Ok(()), bench)
}

fn bench(args: &Args) -> Result<bool, String> {
    eprintln!(
        "chaos: seed {} — reproduce with: {}",
        args.cfg.seed, args.cfg.command
    );
    let c = Containerd::start(Flavor::V2);
    let report = chaos::run(&c, &args.cfg);
    if args.events {
        report.print_events();
    }
    report.print();
    Ok(report.passed())
}
