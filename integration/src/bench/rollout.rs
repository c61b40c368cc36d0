//! `belayer-bench rollout`: concurrent sandboxes run multi-turn episodes against the reference
//! rollout worker (SmolLM2-135M through the GPU broker) while sandbox inits and the worker are
//! SIGKILLed on a seeded schedule — with Belayer (automatic checkpoints, in-place recovery, shadow
//! worker takeover) and without (runc-v2, cold worker restart), against a failure-free baseline.

pub mod actions;
pub mod agent;
pub mod args;
pub mod faults;
pub mod report;
pub mod suite;
pub mod workers;

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gpu_broker::worker::events::now;
use gpu_broker::worker::serve::protocol::GenClient;
use serde::Serialize;

use crate::containerd::Containerd;
use crate::episode::Sandbox;
use agent::Trajectory;
use args::Args;
use faults::Schedule;
use workers::{Failover, Workers};

/// The three runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Mode {
    /// No failures, no Belayer: runc-v2 sandboxes, the serving worker alone.
    Baseline,
    /// The failure schedule with Belayer: automatic checkpoints + recovery, broker + shadow.
    Belayer,
    /// The failure schedule without Belayer: runc-v2, a killed worker restarts cold, a failed
    /// action ends its trajectory.
    Plain,
    /// The failure schedule without Belayer, as frameworks handle it: runc-v2, a killed worker
    /// restarts cold, a failed trajectory runs again from its start in a fresh container.
    Replay,
}

impl Mode {
    /// Every run, in the order the suite runs them.
    pub const ALL: [Mode; 4] = [Mode::Baseline, Mode::Belayer, Mode::Replay, Mode::Plain];

    pub fn label(self) -> &'static str {
        match self {
            Mode::Baseline => "baseline: no failures, no Belayer (runc-v2)",
            Mode::Belayer => "failures, with Belayer",
            Mode::Plain => {
                "failures, without Belayer (runc-v2, cold worker restart, a failed trajectory is lost)"
            }
            Mode::Replay => {
                "failures, replay from the start in a fresh runc container (cold worker restart)"
            }
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Mode::Baseline => "rb",
            Mode::Belayer => "rx",
            Mode::Plain => "rn",
            Mode::Replay => "rr",
        }
    }

    fn runtime(self) -> &'static str {
        match self {
            Mode::Belayer => "io.containerd.belayer.v1",
            _ => "io.containerd.runc.v2",
        }
    }
}

/// One run's results.
#[derive(Clone, Debug, Serialize)]
pub struct Run {
    pub mode: Mode,
    pub label: &'static str,
    pub runtime: &'static str,
    /// Sandboxes started, set up (and with Belayer a first checkpoint taken).
    pub setup_s: f64,
    /// All trajectories from the first generation to the last final check.
    pub episodes_s: f64,
    pub wall_s: f64,
    pub trajectories: Vec<Trajectory>,
    pub worker_failovers: Vec<Failover>,
    /// Worker kills that did not fire because every trajectory had ended.
    pub worker_kills_skipped: usize,
}

impl Run {
    pub fn completed(&self) -> usize {
        self.trajectories.iter().filter(|t| t.verified).count()
    }

    pub fn lost(&self) -> usize {
        self.trajectories.len() - self.completed()
    }
}

/// Longest context a trajectory reaches, plus room.
fn max_seq(args: &Args) -> usize {
    let task = (0..args.sandboxes)
        .map(|t| actions::tokens(&actions::task(args.seed, t)).len())
        .max()
        .unwrap_or(0);
    task + args.turns * (args.max_new as usize + 24) + 16
}

fn start_sandbox(c: &Containerd, mode: Mode, id: &str) -> Result<(), String> {
    let annotations: &[&str] = match mode {
        Mode::Belayer => &["io.belayer.checkpoint=auto", "io.belayer.recover=auto"],
        _ => &[],
    };
    Sandbox::start_annotated(c, mode.runtime(), id, annotations);
    agent::setup(c, id)?;
    if mode == Mode::Belayer {
        // A first checkpoint, so a kill before the first automatic one is recoverable too (an
        // automatic one under way after the setup exec is waited for).
        let out = c.belayer(&["checkpoint", id]);
        if out.code != 0 {
            return Err(format!("first checkpoint of {id}: {}", out.stderr.trim()));
        }
    }
    Ok(())
}

/// Fires the schedule's worker kills as the run reaches them.
fn inject_worker_kills(
    w: &mut Workers,
    sched: &Schedule,
    generations: &AtomicUsize,
    agents_done: &AtomicUsize,
    agents: usize,
    run_start: f64,
) -> Result<(Vec<Failover>, usize), String> {
    let mut out = Vec::new();
    let mut skipped = 0;
    for k in &sched.worker {
        while generations.load(Ordering::SeqCst) < k.after_generations
            && agents_done.load(Ordering::SeqCst) < agents
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(k.delay_ms));
        if agents_done.load(Ordering::SeqCst) >= agents {
            skipped += 1;
            continue;
        }
        out.push(w.kill_primary(run_start)?);
    }
    Ok((out, skipped))
}

/// Runs every trajectory of `mode` once (the schedule applies unless `Baseline`).
pub fn run(
    c: &Containerd,
    bin_dir: &Path,
    args: &Args,
    mode: Mode,
    sched: &Schedule,
    dir: &Path,
) -> Result<Run, String> {
    let none = Schedule::default();
    let sched = if mode == Mode::Baseline { &none } else { sched };
    let belayer = mode == Mode::Belayer;
    eprintln!("belayer-bench rollout: {} …", mode.label());
    let mut w = Workers::start(
        &dir.join(mode.tag()),
        bin_dir,
        belayer,
        args.sandboxes,
        max_seq(args),
    )?;
    let ids: Vec<String> = (0..args.sandboxes)
        .map(|t| format!("{}-{t}", mode.tag()))
        .collect();

    let start = Instant::now();
    let setup: Vec<Result<(), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = ids
            .iter()
            .map(|id| s.spawn(move || start_sandbox(c, mode, id)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("setup panicked".into())))
            .collect()
    });
    setup.into_iter().collect::<Result<Vec<()>, String>>()?;
    let setup_s = start.elapsed().as_secs_f64();

    let episodes = Instant::now();
    let run_start = now();
    let generations = AtomicUsize::new(0);
    let agents_done = AtomicUsize::new(0);
    let ctx = agent::Ctx {
        c,
        belayer,
        replay: mode == Mode::Replay,
        llm: GenClient::new(&w.serve_path(), Duration::from_secs(300)),
        seed: args.seed,
        turns: args.turns,
        max_new: args.max_new,
        kills: &sched.sandbox,
        generations: &generations,
        run_start,
    };
    let injected = Mutex::new(Ok((Vec::new(), 0)));
    let trajectories: Vec<Trajectory> = std::thread::scope(|s| {
        let hs: Vec<_> = ids
            .iter()
            .enumerate()
            .map(|(t, id)| {
                let (ctx, done) = (&ctx, &agents_done);
                s.spawn(move || {
                    let r = agent::run(ctx, t, id);
                    done.fetch_add(1, Ordering::SeqCst);
                    r
                })
            })
            .collect();
        let (w, g, d, inj) = (&mut w, &generations, &agents_done, &injected);
        s.spawn(move || {
            let r = inject_worker_kills(w, sched, g, d, args.sandboxes, run_start);
            *inj.lock().unwrap_or_else(|p| p.into_inner()) = r;
        });
        hs.into_iter()
            .enumerate()
            .map(|(t, h)| {
                h.join().unwrap_or_else(|_| Trajectory {
                    traj: t,
                    lost: Some("agent thread panicked".into()),
                    ..Trajectory::default()
                })
            })
            .collect()
    });
    let episodes_s = episodes.elapsed().as_secs_f64();
    let (worker_failovers, worker_kills_skipped) =
        injected.into_inner().unwrap_or_else(|p| p.into_inner())?;
    c.reset();
    Ok(Run {
        mode,
        label: mode.label(),
        runtime: mode.runtime(),
        setup_s,
        episodes_s,
        wall_s: setup_s + episodes_s,
        trajectories,
        worker_failovers,
        worker_kills_skipped,
    })
}
