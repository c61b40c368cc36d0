//! A seeded fault-injection soak (issue 24): N Debian + Python sandboxes under automatic
//! checkpoints and recovery run agent-like trajectories while a seeded schedule injects faults
//! into them, overlapping across sandboxes; invariants are checked after every fault and at the
//! end, and the figures come out as a table and one JSON line. `belayer-bench chaos` and
//! `tests/chaos.rs` run it.

pub mod baseline;
pub mod check;
pub mod fault;
pub mod report;
pub mod rng;
pub mod trajectory;
pub mod worker;

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Containerd;
pub use fault::{Kind, Schedule};
pub use report::Report;

/// One soak run's parameters.
#[derive(Clone, Debug)]
pub struct Config {
    pub sandboxes: usize,
    pub duration: Duration,
    pub seed: u64,
    /// Memory the background process of each sandbox holds, MB.
    pub holder_mb: u32,
    /// `io.belayer.keep`: automatic checkpoints kept per sandbox.
    pub keep: u32,
    pub schedule: Schedule,
    /// Whether more checkpoints on disk than the retention bound fails the run (else it is only
    /// reported): see `tests/chaos.rs` for why the test does not.
    pub retention_is_violation: bool,
    /// The command line that reproduces this run (printed with every failure).
    pub command: String,
    /// The mount point of the private tmpfs that holds the store (`belayer-bench chaos
    /// --store-mb`), which `disk-full` fills; without it the kind is never injected.
    pub store_fs: Option<std::path::PathBuf>,
    /// Then run the same trajectories under runc-v2 without faults ([`baseline`]).
    pub baseline: bool,
    /// Every this-many-th sandbox (the last of each group) has docker as its client — `docker
    /// run --runtime io.containerd.belayer.v1 --annotation …` and `docker exec`, on a dockerd
    /// over the same containerd — the others `ctr` and the control API; 0: none.
    pub docker_every: usize,
}

impl Config {
    /// Defaults for `sandboxes` sandboxes over `duration`: every kind, a fault on a fifth of
    /// the turns, two fault-free turns after each.
    pub fn new(sandboxes: usize, duration: Duration, seed: u64) -> Self {
        Self {
            sandboxes,
            duration,
            seed,
            holder_mb: 32,
            keep: 3,
            schedule: Schedule {
                kinds: Kind::ALL.to_vec(),
                rate: 0.2,
                spacing: 2,
            },
            retention_is_violation: true,
            command: String::new(),
            store_fs: None,
            baseline: false,
            docker_every: 3,
        }
    }
}

/// What one fault did.
#[derive(Clone, Debug)]
pub struct Event {
    pub sandbox: String,
    pub turn: u64,
    pub kind: Kind,
    pub outcome: Outcome,
    pub detail: String,
    /// Seconds into the run.
    pub at_s: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Injected, and everything Belayer claims for it held.
    Survived,
    /// Injected, and a claim failed; the trajectory went on.
    Violated,
    /// Injected, and the trajectory is lost.
    Lost,
    /// Its window closed before it could be injected (a checkpoint ended before CRIU was seen).
    Missed,
}

/// What the sandboxes' workers record, shared.
#[derive(Default)]
pub struct Journal {
    pub events: Vec<Event>,
    /// Kill → the next action works, ms.
    pub recovery_ms: Vec<u64>,
    /// `worker-kill`: the primary's kill → the shadow generating again, ms.
    pub worker_takeover_ms: Vec<u64>,
    /// (sandbox, checkpoint) → frozen µs, for every checkpoint the soak saw listed.
    pub frozen_us: std::collections::BTreeMap<(String, String), u64>,
    /// Invariant failures not tied to one injected fault.
    pub violations: Vec<String>,
    /// Forks made (removed as soon as checked), for the leak check.
    pub forks: Vec<String>,
    /// Store checks that found more checkpoints on disk than the retention bound: how many more.
    pub over_retention: Vec<usize>,
    /// The first of those checks, each with what was on disk (checkpoint: its filesystem chain),
    /// what the bound was made of and what was listed: what tells a cause.
    pub over_retention_seen: Vec<String>,
    /// Each fault-free turn's exec, ms (the overhead figure's Belayer side).
    pub turn_ms: Vec<f64>,
    /// Sandbox → (its shim's pid, that shim's open fds once the set-up was checkpointed, or
    /// once a new shim was first seen): what [`trajectory::final_check`] compares with.
    pub shim_fds: std::collections::BTreeMap<String, (u32, usize)>,
    /// Shims holding more fds at the end than at their start (beyond [`FD_SLACK`]).
    pub fd_leaks: Vec<String>,
}

/// Open fds a shim may gain over a run without counting as a leak (its event and control
/// connections come and go); one leaked per checkpoint or exec passes it within a minute.
pub const FD_SLACK: usize = 16;

/// The shared state of a run.
pub struct Run<'a> {
    pub c: &'a Containerd,
    pub cfg: &'a Config,
    pub start: Instant,
    pub journal: Mutex<Journal>,
    /// Held shared by each trajectory through a turn or a fault and its checks, and exclusively
    /// by a fault that touches every sandbox at once ([`Kind::global`]): no turn is sent while
    /// containerd is down.
    pub gate: std::sync::RwLock<()>,
    /// The containerd processes the soak started again (the last one runs): its to stop.
    pub daemons: Mutex<Vec<std::process::Child>>,
    /// The pid of the containerd running now.
    pub daemon_pid: std::sync::atomic::AtomicU32,
    /// The rollout worker group `worker-kill` hits, when the schedule has it.
    pub worker: Option<worker::Group>,
    /// The dockerd of the sandboxes docker drives ([`Config::docker_every`]).
    pub docker: Option<crate::docker::Docker>,
}

impl Run<'_> {
    /// The dockerd that is sandbox `index`'s client, if docker is.
    pub fn docker_for(&self, index: usize) -> Option<&crate::docker::Docker> {
        let every = self.cfg.docker_every;
        (every > 0 && index % every == every - 1)
            .then_some(self.docker.as_ref())
            .flatten()
    }

    /// After containerd came back: how long until the run's dockerd ran an exec in one of its
    /// running containers again (it reconnects to the new containerd on its own; meanwhile a
    /// `docker exec` fails, exit 126 with nothing said, seen here), up to 60 s; `None` without
    /// docker sandboxes. `Err`: what the last try answered.
    pub fn docker_back(&self) -> Option<Result<Duration, String>> {
        let docker = self.docker.as_ref()?;
        let start = Instant::now();
        let running = docker.docker(&["ps", "-q", "--no-trunc"]).stdout;
        let id = running.lines().next()?.trim().to_string();
        loop {
            let out = docker.docker(&["exec", &id, "true"]);
            if out.code == 0 {
                return Some(Ok(start.elapsed()));
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Some(Err(format!(
                    "docker exec {id} true still fails after {:?}: exit {}, {:?}",
                    start.elapsed(),
                    out.code,
                    out.stderr.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn elapsed_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub fn record(&self, f: impl FnOnce(&mut Journal)) {
        f(&mut self.journal.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Runs the soak against `c` (a containerd with the Belayer shim) and returns its figures; fails
/// only when the schedule has `worker-kill` and the rollout worker group cannot start.
pub fn run(c: &Containerd, cfg: &Config) -> Result<Report, worker::StartError> {
    let worker = if cfg.schedule.kinds.contains(&Kind::WorkerKill) {
        let g = worker::Group::start(&c.dir.join("rollout-worker"))?;
        eprintln!(
            "chaos: rollout worker group (broker, primary, shadow) up in {:.1} s",
            g.started_in.as_secs_f64()
        );
        Some(g)
    } else {
        None
    };
    let docker = (cfg.docker_every > 0 && cfg.sandboxes >= cfg.docker_every).then(|| {
        let d = crate::docker::Docker::start_in_namespace(c);
        eprintln!(
            "chaos: dockerd up (containerd namespace {}), the client of one sandbox in {}",
            c.ns, cfg.docker_every
        );
        d
    });
    let mut run = Run {
        c,
        cfg,
        start: Instant::now(),
        journal: Mutex::new(Journal::default()),
        gate: std::sync::RwLock::new(()),
        daemons: Mutex::new(Vec::new()),
        daemon_pid: std::sync::atomic::AtomicU32::new(c.pid()),
        worker,
        docker,
    };
    let load_before = loadavg();
    let cpu_before = crate::machine_cpu_s();
    let results: Vec<trajectory::Outcome> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..cfg.sandboxes)
            .map(|i| {
                let run = &run;
                let handle = scope.spawn(move || trajectory::run(run, i));
                (i, handle)
            })
            .collect();
        workers
            .into_iter()
            .map(|(i, h)| {
                h.join().unwrap_or_else(|panic| {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "panic".into());
                    trajectory::Outcome::panicked(i, msg)
                })
            })
            .collect()
    });
    let ids: Vec<String> = results.iter().map(|r| r.id.clone()).collect();
    // The end: every sandbox still running is checked once more, then all go.
    for r in &results {
        if r.lost.is_none() {
            trajectory::final_check(&run, &r.id);
        }
    }
    for id in ids
        .iter()
        .chain(run.journal.lock().unwrap().forks.clone().iter())
    {
        trajectory::remove(c, id);
    }
    // Docker's containers leave its records too, and dockerd stops before the leak check.
    drop(run.docker.take());
    let mut leaks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        leaks = check::leaks(c, &ids);
        if leaks.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    leaks.extend(run.journal.lock().unwrap().fd_leaks.clone());
    if let Some(w) = &run.worker {
        leaks.extend(w.stop());
    }
    let wall = run.start.elapsed();
    let load_after = loadavg();
    let cpu = crate::machine_cpu_since(cpu_before);
    // On the containerd running now (a restarted one, if any), before it is stopped.
    let baseline = cfg.baseline.then(|| {
        eprintln!("chaos: the same trajectories under runc-v2, without faults");
        baseline::run(c, cfg)
    });
    stop_daemons(run.daemons.into_inner().unwrap_or_else(|e| e.into_inner()));
    let journal = run.journal.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut report = Report::new(
        cfg,
        wall,
        results,
        journal,
        leaks,
        load_before,
        load_after,
        cpu,
    );
    report.baseline = baseline;
    Ok(report)
}

/// The 1-minute load average.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Stops the containerd processes the soak started again (SIGTERM, then SIGKILL after 10 s) and
/// reaps them, before the [`Containerd`] handle removes their directory.
fn stop_daemons(daemons: Vec<std::process::Child>) {
    for mut d in daemons {
        let _ = crate::signal(i64::from(d.id()), libc::SIGTERM);
        let start = Instant::now();
        while d.try_wait().ok().flatten().is_none() {
            if start.elapsed() > Duration::from_secs(10) {
                let _ = d.kill();
                let _ = d.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
