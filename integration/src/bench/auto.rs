//! `belayer-bench auto`: what automatic checkpoints cost an agent episode. The same 12-turn
//! episode (an action exec'd into the sandbox, then the LLM's think time: a fixed sequence of
//! 1–3 s sleeps) runs in a fresh sandbox under runc-v2 and under Belayer in automatic mode
//! (`io.belayer.checkpoint=auto`, `recover=auto`, the loop hinting `llm-start` as a gateway
//! does), interleaved runc, Belayer, Belayer, runc per round so that a machine drifting over the
//! run weighs on both sides alike, on one containerd, in one run. Stop points, both sides: an
//! exec is timed from `ctr task exec` sent to its exit status back; an episode from the first
//! action sent to the end of the last think time (the sandbox's set-up is not timed). Belayer's
//! automatic checkpoints are read back afterwards (`belayer inspect`: when each froze the
//! sandbox, for how long) and placed among the turns: in a think gap, or while an action was out.
//!
//! Checks (the claims of `docs/cli.md`'s automatic mode): every Belayer episode has at least 8
//! of its checkpoints begin in a gap; the execs summed take at most 25 % longer than runc-v2's
//! (a checkpoint frozen while an exec was sent would cost it hundreds of ms against tens), and
//! the episodes at most 2 % longer.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::bench::Common;
use crate::bench::ctrd::{BELAYER, RUNC, remove};
use crate::bench::record::Record;
use crate::bench::stats::{percentile, round3};
use crate::episode::{self, Sandbox};
use crate::{Containerd, Flavor};

/// Turns of the episode.
pub const TURNS: usize = 12;
/// The most the execs of an episode in automatic mode may take in all over runc-v2's.
pub const EXEC_OVERHEAD: f64 = 0.25;
/// The most the whole episode may take over runc-v2's (its think time is fixed sleeps).
pub const WALL_OVERHEAD: f64 = 0.02;
/// Automatic checkpoints each Belayer episode must begin in a think gap.
pub const IN_GAPS: usize = 8;

/// `belayer-bench auto`: needs root, containerd 2.x and the workspace's binaries.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Rounds, each runc-v2, Belayer, Belayer, runc-v2
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    #[command(flatten)]
    pub common: Common,
}

/// The LLM's think time before each turn: 1–3 s, the same sequence every run.
pub fn gaps() -> Vec<Duration> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..TURNS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            Duration::from_millis(1000 + x % 2000)
        })
        .collect()
}

pub fn action(turn: usize) -> String {
    format!(
        "python3 -c 'import json; json.dump({{\"turn\": {turn}}}, open(\"/work/turn{turn}.json\", \"w\"))' && echo {turn} >> /work/turns"
    )
}

/// Where one turn's time went: the action's exec, the hint call (run beside the think time,
/// but the turn waits for it), and the whole turn; when the exec was sent and answered, on the
/// wall clock (a checkpoint's instant is on it).
pub struct Turn {
    pub exec: Duration,
    pub hint: Duration,
    pub total: Duration,
    pub sent_unix_ms: u64,
    pub answered_unix_ms: u64,
}

/// Now, in milliseconds since the Unix epoch: the clock of a checkpoint's `created_unix_ms`.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Where a checkpoint began among the turns: in the gap after turn K's exec was answered (and
/// before turn K+1's was sent), while turn K's exec was out, or before the first; `after_ms`
/// after the answer, or after the send.
pub enum Placement {
    Before,
    Exec { turn: usize, after_ms: u64 },
    Gap { turn: usize, after_ms: u64 },
}

impl Placement {
    /// Where a checkpoint whose freeze began at `instant_ms` fell among `turns`.
    pub fn of(turns: &[Turn], instant_ms: u64) -> Self {
        let Some(k) = turns.iter().rposition(|t| t.sent_unix_ms <= instant_ms) else {
            return Self::Before;
        };
        let t = &turns[k];
        if instant_ms < t.answered_unix_ms {
            Self::Exec {
                turn: k + 1,
                after_ms: instant_ms - t.sent_unix_ms,
            }
        } else {
            Self::Gap {
                turn: k + 1,
                after_ms: instant_ms - t.answered_unix_ms,
            }
        }
    }
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Before => write!(f, "before"),
            Self::Exec { turn, after_ms } => write!(f, "exec {turn} +{after_ms} ms"),
            Self::Gap { turn, after_ms } => write!(f, "gap {turn} +{after_ms} ms"),
        }
    }
}

/// An automatic checkpoint of an episode: where it began, and how long it kept the sandbox
/// frozen.
pub struct Taken {
    pub id: String,
    pub at: Placement,
    pub frozen_ms: u64,
}

impl std::fmt::Debug for Taken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:?} (frozen {} ms)",
            self.id, self.at, self.frozen_ms
        )
    }
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exec {}ms hint {}ms turn {}ms",
            self.exec.as_millis(),
            self.hint.as_millis(),
            self.total.as_millis()
        )
    }
}

/// The machine's CPU time over a loop, all cores together: busy, and stolen by the hypervisor
/// (a virtual CPU with work that did not run). A slow half of the comparison with much steal was
/// slowed by the host, not by Belayer.
pub struct Cpu(pub Option<(f64, f64)>);

impl std::fmt::Debug for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some((busy, steal)) => write!(f, "machine busy {busy:.2} s, stolen {steal:.2} s"),
            None => write!(f, "machine CPU unknown (/proc/stat unreadable)"),
        }
    }
}

/// Runs turns `from..to` as an agent loop: action, then the LLM's think time. With `hints`, the
/// loop fires an `llm-start` hint as the generation starts, without waiting for it (as an LLM
/// gateway does). Returns the loop's wall time, each turn's, and the machine's CPU over it.
pub fn agent_loop(
    c: &Containerd,
    s: &Sandbox,
    hints: bool,
    turns: std::ops::Range<usize>,
) -> (Duration, Vec<Turn>, Cpu) {
    let gaps = gaps();
    let cpu_before = crate::machine_cpu_s();
    let start = Instant::now();
    let mut times = Vec::new();
    for t in turns {
        let turn_start = Instant::now();
        let sent_unix_ms = unix_ms();
        let out = s.exec(&action(t + 1), None);
        let answered_unix_ms = unix_ms();
        let exec = turn_start.elapsed();
        assert_eq!(out.code, 0, "turn {}: {out:?}", t + 1);
        let hint = std::thread::scope(|scope| {
            let hint = hints.then(|| {
                let ms = gaps[t].as_millis().to_string();
                scope.spawn(move || {
                    let sent = Instant::now();
                    c.belayer(&["hint", &s.id, "llm-start", "--expected-ms", &ms])
                        .ok();
                    sent.elapsed()
                })
            });
            std::thread::sleep(gaps[t]);
            hint.map(|h| h.join().expect("hint thread"))
                .unwrap_or_default()
        });
        times.push(Turn {
            exec,
            hint,
            total: turn_start.elapsed(),
            sent_unix_ms,
            answered_unix_ms,
        });
    }
    let wall = start.elapsed();
    let cpu = crate::machine_cpu_since(cpu_before);
    (wall, times, Cpu(cpu))
}

pub fn auto_sandbox<'a>(c: &'a Containerd, id: &str) -> Sandbox<'a> {
    let s = Sandbox::start_annotated(
        c,
        BELAYER,
        id,
        &[
            "io.belayer.checkpoint=auto",
            "io.belayer.recover=auto",
            "io.belayer.keep=100",
        ],
    );
    s.run(&episode::actions(64));
    s
}

/// One timed run of the 12-turn episode in a fresh sandbox: under runc-v2, or under Belayer in
/// automatic mode with the checkpoints it took.
pub struct Episode {
    pub auto: bool,
    pub wall: Duration,
    pub turns: Vec<Turn>,
    pub cpu: Cpu,
    pub taken: Vec<Taken>,
}

impl Episode {
    /// Sets up sandbox `loop-{runtime}-{n}` (untimed), runs the agent loop, removes it.
    pub fn run(c: &Containerd, auto: bool, n: usize) -> Self {
        let id = format!("loop-{}-{n}", if auto { "auto" } else { "runc" });
        let s = if auto {
            auto_sandbox(c, &id)
        } else {
            let s = Sandbox::start(c, RUNC, &id);
            s.run(&episode::actions(64));
            s
        };
        let checkpoints = || -> Vec<String> {
            let out = c.belayer(&["checkpoints", &id]).stdout;
            out.lines().map(str::to_string).collect()
        };
        let before = if auto { checkpoints() } else { Vec::new() };
        let (wall, turns, cpu) = agent_loop(c, &s, auto, 0..TURNS);
        let taken = if auto { checkpoints() } else { Vec::new() };
        let taken = taken
            .into_iter()
            .filter(|cp| !before.contains(cp))
            .map(|cp| {
                let info: serde_json::Value =
                    serde_json::from_str(&c.belayer(&["inspect", &id, &cp]).stdout)
                        .unwrap_or_default();
                let instant = info["created_unix_ms"].as_u64().unwrap_or_default();
                Taken {
                    at: Placement::of(&turns, instant),
                    frozen_ms: info["timings"]["frozen_us"].as_u64().unwrap_or_default() / 1000,
                    id: cp,
                }
            })
            .collect();
        remove(c, &id);
        Self {
            auto,
            wall,
            turns,
            cpu,
            taken,
        }
    }
}

impl std::fmt::Debug for Episode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let runtime = if self.auto { "belayer auto" } else { "runc-v2" };
        writeln!(
            f,
            "{runtime} {:?} ({:?}), {} checkpoints",
            self.wall,
            self.cpu,
            self.taken.len()
        )?;
        write!(f, "  {:?}", self.turns)?;
        if !self.taken.is_empty() {
            write!(f, "\n  checkpoints at {:?}", self.taken)?;
        }
        Ok(())
    }
}

impl Episode {
    /// The execs of the episode, summed.
    pub fn execs(&self) -> Duration {
        self.turns.iter().map(|t| t.exec).sum()
    }

    /// Its automatic checkpoints that began in a think gap.
    pub fn in_gaps(&self) -> usize {
        self.taken
            .iter()
            .filter(|t| matches!(t.at, Placement::Gap { .. }))
            .count()
    }
}

/// Runs the benchmark; `Ok(false)` when a check failed.
pub fn run(args: &Args) -> Result<bool, String> {
    let rec = Record::start("auto", &args.common.out("auto"))?;
    let c = Containerd::start(Flavor::V2);
    eprintln!(
        "belayer-bench auto: {} rounds of runc-v2, Belayer, Belayer, runc-v2; {TURNS} turns each",
        args.rounds
    );
    let mut episodes = Vec::new();
    for round in 0..args.rounds as usize {
        for (i, auto) in [false, true, true, false].into_iter().enumerate() {
            let e = Episode::run(&c, auto, round * 4 + i);
            eprintln!("{e:?}");
            episodes.push(e);
        }
    }
    let side = |auto: bool| episodes.iter().filter(move |e| e.auto == auto);
    let sum = |auto: bool, f: fn(&Episode) -> Duration| -> f64 {
        side(auto).map(f).sum::<Duration>().as_secs_f64()
    };
    let (runc_exec, auto_exec) = (sum(false, Episode::execs), sum(true, Episode::execs));
    let (runc_wall, auto_wall) = (sum(false, |e| e.wall), sum(true, |e| e.wall));
    let exec_overhead = auto_exec / runc_exec - 1.0;
    let wall_overhead = auto_wall / runc_wall - 1.0;
    let turn_ms = |auto: bool| -> Vec<f64> {
        side(auto)
            .flat_map(|e| e.turns.iter().map(|t| t.exec.as_secs_f64() * 1e3))
            .collect()
    };
    let pct = |xs: &[f64], p: f64| percentile(xs, p).unwrap_or(f64::NAN);
    let (runc_ms, auto_ms) = (turn_ms(false), turn_ms(true));
    let frozen: Vec<f64> = side(true)
        .flat_map(|e| e.taken.iter().map(|t| t.frozen_ms as f64))
        .collect();
    let taken: Vec<usize> = side(true).map(|e| e.taken.len()).collect();
    let in_gaps: Vec<usize> = side(true).map(Episode::in_gaps).collect();
    let checks = json!({
        format!("every Belayer episode has >= {IN_GAPS} checkpoints begin in a gap"):
            in_gaps.iter().all(|&n| n >= IN_GAPS),
        format!("execs summed at most {:.0} % over runc-v2's", EXEC_OVERHEAD * 100.0):
            exec_overhead <= EXEC_OVERHEAD,
        format!("episodes summed at most {:.0} % over runc-v2's", WALL_OVERHEAD * 100.0):
            wall_overhead <= WALL_OVERHEAD,
    });
    let results = json!({
        "rounds": args.rounds,
        "turns": TURNS,
        "sides": {
            "runc": "io.containerd.runc.v2, no checkpoints",
            "belayer": "io.containerd.belayer.v1 with io.belayer.checkpoint=auto, recover=auto, \
                        llm-start hinted each turn",
        },
        "stop_points": {
            "exec": "ctr task exec sent -> exit status back",
            "episode": "first action sent -> end of the last think time (set-up untimed)",
        },
        "execs_summed_s": {"runc": round3(runc_exec), "belayer": round3(auto_exec),
                           "overhead": round3(exec_overhead)},
        "episodes_summed_s": {"runc": round3(runc_wall), "belayer": round3(auto_wall),
                              "overhead": round3(wall_overhead)},
        "exec_ms": {
            "runc": {"p50": pct(&runc_ms, 50.0), "p99": pct(&runc_ms, 99.0)},
            "belayer": {"p50": pct(&auto_ms, 50.0), "p99": pct(&auto_ms, 99.0)},
        },
        "checkpoints": {"per_episode": taken, "in_gaps": in_gaps,
                        "frozen_ms_p50": pct(&frozen, 50.0), "frozen_ms_p99": pct(&frozen, 99.0)},
        "episodes": episodes.iter().map(|e| json!({
            "runtime": if e.auto { "belayer" } else { "runc" },
            "wall_s": round3(e.wall.as_secs_f64()),
            "execs_s": round3(e.execs().as_secs_f64()),
            "machine_busy_s": e.cpu.0.map(|(busy, _)| round3(busy)),
            "machine_stolen_s": e.cpu.0.map(|(_, steal)| round3(steal)),
            "checkpoints": e.taken.iter().map(|t| json!({
                "id": t.id, "at": format!("{:?}", t.at), "frozen_ms": t.frozen_ms,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "checks": checks,
    });
    let mut t = String::new();
    let _ = writeln!(
        t,
        "| {TURNS}-turn episode, {} runs a side | runc-v2 | Belayer auto | ratio |",
        2 * args.rounds
    );
    let _ = writeln!(t, "| --- | --- | --- | --- |");
    let _ = writeln!(
        t,
        "| execs summed (exec sent → exit status) | {runc_exec:.2} s | {auto_exec:.2} s | ×{:.3} |",
        auto_exec / runc_exec
    );
    let _ = writeln!(
        t,
        "| episodes summed (first action → last think time ends) | {runc_wall:.2} s | {auto_wall:.2} s | ×{:.4} |",
        auto_wall / runc_wall
    );
    for p in [50.0, 99.0] {
        let _ = writeln!(
            t,
            "| exec p{p:.0} | {:.0} ms | {:.0} ms | |",
            pct(&runc_ms, p),
            pct(&auto_ms, p)
        );
    }
    let _ = writeln!(
        t,
        "\nBelayer's automatic checkpoints per episode {taken:?}, begun in a think gap {in_gaps:?}; \
         frozen p50 {:.0} ms, p99 {:.0} ms",
        pct(&frozen, 50.0),
        pct(&frozen, 99.0)
    );
    let mut ok = true;
    for (what, passed) in checks.as_object().into_iter().flatten() {
        ok &= passed == true;
        let verdict = if passed == true { "ok" } else { "FAILED" };
        let _ = writeln!(t, "check {what}: {verdict}");
    }
    let summary = json!({
        "exec_overhead": round3(exec_overhead),
        "wall_overhead": round3(wall_overhead),
        "checks": checks,
    });
    rec.report(&t, results, None, summary)?;
    Ok(ok)
}
