//! One sandbox's trajectory under faults: the reference episode's set-up (a background process
//! holding memory and a socket, a counter), then turns — each checks the append-only log holds
//! exactly the turns before it and appends its own — with LLM-like gaps, and the faults its
//! seeded stream draws. After every rewind (a recovery, an explicit restore) the log must be
//! what the journal position says, the memory digest intact and the counter one-instant
//! consistent; otherwise the trajectory is lost, with the fault that caused it.

mod inject;

use std::time::{Duration, Instant};

use super::rng::Rng;
use super::{Event, Outcome as FaultOutcome, Run, check};
use crate::episode::{self, Sandbox, is_contiguous};
use crate::{Containerd, Out};

const BELAYER: &str = "io.containerd.belayer.v1";
/// How long a recovery may take before the trajectory is reported lost.
const RECOVERY_LIMIT: Duration = Duration::from_secs(60);

/// How one trajectory ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The sandbox's containerd id.
    pub id: String,
    /// `chaos-N`, with `(docker)` when docker is its client.
    pub name: String,
    /// Turns the log holds at the end (or when lost).
    pub turns: u64,
    /// Turns executed successfully, re-executions after rewinds included.
    pub executed: u64,
    /// Rewinds (recoveries and explicit restores) checked.
    pub rewinds: u64,
    /// Why the trajectory was lost, naming the fault.
    pub lost: Option<String>,
}

impl Outcome {
    pub fn panicked(index: usize, msg: String) -> Self {
        Self {
            id: sandbox_id(index),
            name: sandbox_id(index),
            turns: 0,
            executed: 0,
            rewinds: 0,
            lost: Some(format!("the harness panicked: {msg}")),
        }
    }
}

pub fn sandbox_id(index: usize) -> String {
    format!("chaos-{index}")
}

/// Turn `k`'s script: the log must hold 1..k-1; append k; then work for a while (the window a
/// kill "during an action" aims at). `: chaos-turn=k;` marks it in the journal.
pub(crate) fn turn_script(k: u64) -> String {
    format!(
        ": chaos-turn={k}; n=$(cat /work/log 2>/dev/null | wc -l); \
         [ \"$n\" -eq {prev} ] || {{ echo \"log holds $n turns, expected {prev}\" >&2; exit 3; }}; \
         echo {k} >> /work/log && sleep 0.4 && echo {k} > /work/last",
        prev = k - 1
    )
}

struct Traj<'r, 'c> {
    run: &'r Run<'c>,
    s: Sandbox<'c>,
    /// What the record calls it: `chaos-N`, or `chaos-N (docker)`.
    name: String,
    /// The faults it draws: the run's, less those whose claim is containerd's alone when
    /// docker is its client ([`Kind::containerd_only`]).
    schedule: super::Schedule,
    rng: Rng,
    done: u64,
    executed: u64,
    rewinds: u64,
    /// Checkpoints this trajectory corrupted on purpose (excluded from verification).
    corrupted: Vec<String>,
    verified: std::collections::BTreeSet<String>,
}

/// Runs sandbox `index`'s trajectory until the run's deadline.
pub fn run(run: &Run, index: usize) -> Outcome {
    let cfg = run.cfg;
    let c = run.c;
    let id = sandbox_id(index);
    let keep = format!("io.belayer.keep={}", cfg.keep);
    let annotations = [
        "io.belayer.checkpoint=auto",
        "io.belayer.recover=auto",
        &keep,
    ];
    let mut schedule = cfg.schedule.clone();
    // The whole set-up — the container's start, its actions, its first checkpoint — under the
    // gate like a turn: a global fault drawn by a sandbox already at its turns must not land on
    // it (seed 605 lost three docker sandboxes to a `disk-full` at their first checkpoint; seed
    // 607 four whose `ctr run` met a `containerd-restart`: "connection reset by peer").
    let setup = run.gate.read().unwrap_or_else(|e| e.into_inner());
    let (s, name) = match run.docker_for(index) {
        Some(docker) => {
            schedule.kinds.retain(|k| !k.containerd_only());
            (
                Sandbox::start_docker(c, docker, BELAYER, &id, &annotations),
                format!("{id} (docker)"),
            )
        }
        None => (Sandbox::start_annotated(c, BELAYER, &id, &annotations), id),
    };
    let mut t = Traj {
        run,
        s,
        name,
        schedule,
        rng: Rng::for_sandbox(cfg.seed, index),
        done: 0,
        executed: 0,
        rewinds: 0,
        corrupted: Vec::new(),
        verified: Default::default(),
    };
    let lost = t.go(setup);
    Outcome {
        id: t.s.id.clone(),
        name: t.name.clone(),
        turns: t.done,
        executed: t.executed,
        rewinds: t.rewinds,
        lost,
    }
}

impl Traj<'_, '_> {
    fn c(&self) -> &Containerd {
        self.run.c
    }

    fn id(&self) -> &str {
        &self.s.id
    }

    fn belayer(&self, args: &[&str]) -> Out {
        self.c().belayer(args)
    }

    /// The whole trajectory, its set-up under `setup` (the gate, held until the first
    /// checkpoint); `Some(why)` when it was lost.
    fn go(&mut self, setup: std::sync::RwLockReadGuard<'_, ()>) -> Option<String> {
        for a in episode::actions(self.run.cfg.holder_mb) {
            let out = self.s.exec(&a.script, a.stdin.as_deref());
            if out.code != 0 {
                return Some(format!("set-up action {} failed: {out:?}", a.name));
            }
        }
        let base = self.belayer(&["checkpoint", self.id()]);
        drop(setup);
        if base.code != 0 {
            return Some(format!(
                "the first checkpoint failed: {}",
                base.stderr.trim()
            ));
        }
        self.watch_shim_fds();
        let deadline = self.run.start + self.run.cfg.duration;
        let mut quiet = 0;
        while Instant::now() < deadline {
            let gap = Duration::from_millis(self.rng.range(300, 1500));
            let drawn = self.schedule.draw(&mut self.rng);
            let fault = if quiet > 0 {
                quiet -= 1;
                None
            } else {
                drawn
            };
            // The model thinks; the gateway would send this hint.
            let ms = gap.as_millis().to_string();
            let _ = self.belayer(&["hint", self.id(), "llm-start", "--expected-ms", &ms]);
            std::thread::sleep(gap);
            // Held through the turn (or fault) and its checks; a global fault takes it whole.
            let gate = &self.run.gate;
            let _turn = (!fault.is_some_and(|k| k.global()))
                .then(|| gate.read().unwrap_or_else(|e| e.into_inner()));
            let result = match fault {
                None => self.turn().map(|_| ()),
                Some(kind) => {
                    quiet = self.run.cfg.schedule.spacing;
                    let turn = self.done + 1;
                    let at_s = self.run.elapsed_s();
                    let result = self.inject(kind);
                    let (outcome, detail) = match &result {
                        Ok(Injected::Yes(d)) => (FaultOutcome::Survived, d.clone()),
                        Ok(Injected::Missed(d)) => (FaultOutcome::Missed, d.clone()),
                        Err(Failure::Violated(d)) => (FaultOutcome::Violated, d.clone()),
                        Err(Failure::Lost(d)) => (FaultOutcome::Lost, d.clone()),
                    };
                    self.run.record(|j| {
                        j.events.push(Event {
                            sandbox: self.name.clone(),
                            turn,
                            kind,
                            outcome,
                            detail: detail.clone(),
                            at_s,
                        })
                    });
                    match result {
                        Err(Failure::Lost(d)) => Err(format!("{}: {d}", kind.name())),
                        _ => Ok(()),
                    }
                }
            };
            if let Err(why) = result {
                return Some(why);
            }
            if fault.is_some() || self.done.is_multiple_of(5) {
                self.check_store();
            }
        }
        None
    }

    /// Runs the next turn; `Err` (the trajectory is lost) when it fails.
    fn turn(&mut self) -> Result<(), String> {
        let k = self.done + 1;
        let t = Instant::now();
        let out = self.s.exec(&turn_script(k), None);
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if out.code == 0 {
            self.run.record(|j| j.turn_ms.push(ms));
        }
        if out.code != 0 {
            return Err(format!(
                "turn {k} failed with no fault injected: exit code {}, stderr {:?}, stdout {:?}",
                out.code,
                out.stderr.trim(),
                out.stdout.trim()
            ));
        }
        self.done = k;
        self.executed += 1;
        Ok(())
    }

    fn init_pid(&self) -> Option<i64> {
        self.c()
            .task_row(self.id())
            .first()
            .and_then(|p| p.parse().ok())
            .filter(|p| *p > 0)
    }

    fn recoveries(&self) -> usize {
        status(self.c(), self.id())["recoveries"]
            .as_array()
            .map_or(0, Vec::len)
    }

    /// SIGKILLs the init (`pid`); returns the kill instant.
    fn kill_init(&self, pid: i64) -> Result<Instant, Failure> {
        crate::sigkill(pid)
            .map(|_| Instant::now())
            .map_err(|e| Failure::Violated(format!("SIGKILL of init {pid}: {e}")))
    }

    /// Waits for the recovery after a kill at `killed`, then checks the rewind; records the
    /// latency (kill → the next action works).
    fn recovered(&mut self, before: usize, killed: Instant) -> Result<String, Failure> {
        let start = Instant::now();
        loop {
            if self.recoveries() > before
                && self.c().task_row(self.id()).get(1).map(String::as_str) == Some("RUNNING")
            {
                break;
            }
            if start.elapsed() > RECOVERY_LIMIT {
                let st = status(self.c(), self.id());
                return Err(Failure::Lost(format!(
                    "no recovery within {RECOVERY_LIMIT:?}: task {:?}, status {st}, shim log: {}",
                    self.c().task_row(self.id()),
                    self.c().log_lines(self.id(), 5)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let since = status(self.c(), self.id())["recoveries"]
            .as_array()
            .and_then(|r| r.last()?["at_unix_ms"].as_u64())
            .unwrap_or(0);
        let detail = self.rewound(since)?;
        let ms = killed.elapsed().as_millis() as u64;
        self.run.record(|j| j.recovery_ms.push(ms));
        Ok(format!("{detail}; kill → next action {ms} ms"))
    }

    /// After a rewind (a restore begun at `since_ms`, Unix ms): the log holds exactly the turns
    /// the journal says — those up to the position the restored checkpoint reflects, then those
    /// that ran in the restored sandbox (an exec sent as the init died waits for the recovery and
    /// runs there) — and the processes are intact. An exec that ran across the checkpoint instant
    /// is in no checkpoint (`uncaptured_execs`), but what it wrote before the freeze is: that
    /// turn may be in the log too.
    fn rewound(&mut self, since_ms: u64) -> Result<String, Failure> {
        self.rewinds += 1;
        let st = status(self.c(), self.id());
        let position = &st["position"];
        let (Some(cp), Some(k)) = (position["checkpoint"].as_str(), position["action"].as_u64())
        else {
            return Err(Failure::Lost(format!(
                "no journal position after the rewind: {st}"
            )));
        };
        let uncaptured: Vec<String> = check::manifest(self.c(), self.id(), cp)
            .ok()
            .and_then(|m| m["uncaptured_execs"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|u| u["exec_id"].as_str().map(str::to_string))
            .collect();
        let journal = self.belayer(&["journal", "--json", self.id()]);
        let entries: Vec<serde_json::Value> = journal
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let index = |e: &serde_json::Value| e["index"].as_u64().unwrap_or(u64::MAX);
        let ok = |e: &&serde_json::Value| e["exit_code"].as_u64() == Some(0);
        let at_position = entries
            .iter()
            .filter(|e| index(e) <= k)
            .filter(ok)
            .filter_map(turn_of)
            .next_back()
            .unwrap_or(0);
        let ran_after = entries
            .iter()
            .filter(|e| index(e) > k)
            .filter(|e| e["started_unix_ms"].as_u64().is_some_and(|s| s >= since_ms))
            .filter(ok)
            .filter_map(turn_of)
            .next_back();
        let expected = ran_after.unwrap_or(at_position);
        let across = entries
            .iter()
            .filter(|e| {
                e["exec_id"]
                    .as_str()
                    .is_some_and(|x| uncaptured.iter().any(|u| u == x))
            })
            .filter_map(turn_of)
            .max()
            .filter(|_| ran_after.is_none());
        let numbers = read_log(&self.s).map_err(Failure::Lost)?;
        let m = numbers.len() as u64;
        let consistent =
            (numbers.is_empty() || is_contiguous(&numbers)) && (m == expected || Some(m) == across);
        if !consistent {
            return Err(Failure::Lost(format!(
                "after the rewind to checkpoint {cp} (journal position {k}: {}), the log holds \
                 {m} turns {:?}…, the journal says {expected} (turn across the instant: {across:?})",
                position["reflects"],
                &numbers[numbers.len().saturating_sub(3)..]
            )));
        }
        self.processes_intact().map_err(Failure::Lost)?;
        self.done = m;
        Ok(format!(
            "rewound to checkpoint {cp}, turn {m} (journal position {k})"
        ))
    }

    /// The background process's memory digest is the one it started with, and the counter reads
    /// exactly 1..N and goes on.
    fn processes_intact(&self) -> Result<(), String> {
        let (now, at_start) = self.s.holder_digests();
        if now.is_empty() || now != at_start {
            return Err(format!(
                "the holder's memory changed: {now:?} vs {at_start:?}"
            ));
        }
        let first = self.s.counter();
        if !is_contiguous(&first) {
            return Err(format!(
                "the counter is not 1..N (memory and files disagree): …{:?}",
                &first[first.len().saturating_sub(3)..]
            ));
        }
        // It appends every 10 ms; on a loaded machine (12 sandboxes on 2 cores) its next turn
        // on a CPU can be far later than that.
        let grew = crate::bench::wait_until(Duration::from_secs(3), || {
            self.s.counter().len() > first.len()
        });
        if !grew {
            return Err(format!(
                "the counter stopped at {} for 3 s",
                first.last().copied().unwrap_or_default()
            ));
        }
        Ok(())
    }

    /// The sandbox runs the same init as before and its processes are intact.
    fn untouched(&self, pid: i64) -> Result<(), String> {
        let row = self.c().task_row(self.id());
        if row.first().map(String::as_str) != Some(&pid.to_string())
            || row.get(1).map(String::as_str) != Some("RUNNING")
        {
            return Err(format!("the sandbox changed: task {row:?}, init was {pid}"));
        }
        self.processes_intact()
    }

    /// Takes the open-fd count of the sandbox's shim as the start [`final_check`] compares
    /// with, when that shim is new to the run (the first, or one started after a `shim-kill`).
    fn watch_shim_fds(&self) {
        let Some(pid) = self.c().shim_of(self.id()) else {
            return;
        };
        let known = self
            .run
            .journal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .shim_fds
            .get(self.id())
            .is_some_and(|(p, _)| *p == pid);
        if !known {
            let fds = check::settled_fd_count(pid);
            self.run.record(|j| {
                j.shim_fds.insert(self.s.id.clone(), (pid, fds));
            });
        }
    }

    /// Every listed checkpoint verifies (but those corrupted on purpose); their frozen times are
    /// recorded; the store holds no more than the retention bound.
    fn check_store(&mut self) {
        self.watch_shim_fds();
        let listed = check::listed(self.c(), self.id());
        let mut bad = Vec::new();
        for cp in &listed {
            // A compaction swaps a checkpoint's dir for a new one: verified again then.
            let key = format!("{cp}@{:?}", check::manifest_stamp(self.c(), self.id(), cp));
            if self.corrupted.contains(cp) || self.verified.contains(&key) {
                continue;
            }
            match check::verify_settled(self.c(), self.id(), cp) {
                Ok(()) => {
                    self.verified.insert(key);
                    if let Some(us) = check::frozen_us(self.c(), self.id(), cp) {
                        let key = (self.s.id.clone(), cp.clone());
                        self.run.record(|j| {
                            j.frozen_us.insert(key, us);
                        });
                    }
                }
                Err(e) => bad.push(e),
            }
        }
        // A checkpoint removed meanwhile (retention) is no failure.
        let still = check::listed(self.c(), self.id());
        bad.retain(|e| {
            still
                .iter()
                .any(|cp| e.starts_with(&format!("checkpoint {cp} of")))
        });
        let disk = check::on_disk(self.c(), self.id());
        let on_disk = disk.len();
        let bound = self.retention_bound();
        let id = self.s.id.clone();
        let strict = self.run.cfg.retention_is_violation;
        let seen = (on_disk > bound).then(|| {
            let chains: Vec<String> = disk
                .iter()
                .map(|cp| {
                    let chain = check::manifest(self.c(), self.id(), cp)
                        .ok()
                        .map(|m| m["fs_chain"].to_string())
                        .unwrap_or_else(|| "?".into());
                    format!("{cp}:{chain}")
                })
                .collect();
            let st = status(self.c(), self.id());
            format!(
                "{id}: {on_disk} on disk over {bound} (keep {}, position {}, corrupted {:?}); \
                 on disk {}; listed {:?}",
                self.run.cfg.keep,
                st["position"]["checkpoint"],
                self.corrupted,
                chains.join(" "),
                still,
            )
        });
        self.run.record(|j| {
            if let Some(seen) = seen
                && j.over_retention_seen.len() < MAX_OVER_RETENTION_SEEN
            {
                j.over_retention_seen.push(seen);
            }
            for e in bad {
                j.violations
                    .push(format!("listed checkpoint does not verify: {e}"));
            }
            if on_disk > bound {
                j.over_retention.push(on_disk - bound);
                if strict {
                    j.violations.push(format!(
                        "{id}: {on_disk} checkpoints on disk, over the retention bound {bound}"
                    ));
                }
            }
        });
    }

    /// `keep`, plus the chain the running rootfs stacks on, plus one being written, plus those
    /// corrupted on purpose and not removable.
    fn retention_bound(&self) -> usize {
        let st = status(self.c(), self.id());
        let chain = st["position"]["checkpoint"]
            .as_str()
            .and_then(|cp| check::manifest(self.c(), self.id(), cp).ok())
            .and_then(|m| m["fs_chain"].as_array().map(Vec::len))
            .unwrap_or(0);
        self.run.cfg.keep as usize + chain + 1 + self.corrupted.len()
    }
}

/// Store checks over the retention bound whose detail a run keeps.
const MAX_OVER_RETENTION_SEEN: usize = 12;

/// The turn a journal entry ran (`: chaos-turn=K;`), if it is one.
fn turn_of(e: &serde_json::Value) -> Option<u64> {
    let args = e["args"].as_array()?;
    let script: Vec<&str> = args.iter().filter_map(|a| a.as_str()).collect();
    let rest = script.join(" ");
    let rest = rest.split_once(": chaos-turn=")?.1;
    rest.split(';').next()?.parse().ok()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The numbers of the trajectory's log, `/work/log`.
fn read_log(s: &Sandbox) -> Result<Vec<u64>, String> {
    let log = s.exec("cat /work/log 2>/dev/null; true", None);
    if log.code != 0 {
        return Err(format!("the log cannot be read: {log:?}"));
    }
    Ok(log
        .stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

enum Injected {
    Yes(String),
    Missed(String),
}

enum Failure {
    Violated(String),
    Lost(String),
}

/// The last check of a sandbox that ran to the end: its state and its checkpoints.
pub fn final_check(run: &Run, id: &str) {
    let s = Sandbox::attach(run.c, id);
    let mut problems = Vec::new();
    match read_log(&s) {
        Ok(n) if n.is_empty() || is_contiguous(&n) => {}
        Ok(n) => problems.push(format!("{id}: the log at the end is not 1..N: {n:?}")),
        Err(e) => problems.push(format!("{id}: {e}")),
    }
    let (now, start) = s.holder_digests();
    if now.is_empty() || now != start {
        problems.push(format!(
            "{id}: holder memory at the end {now:?} vs {start:?}"
        ));
    }
    for cp in check::listed(run.c, id) {
        if let Some(us) = check::frozen_us(run.c, id, &cp) {
            run.record(|j| {
                j.frozen_us.insert((id.to_string(), cp.clone()), us);
            });
        }
    }
    run.record(|j| j.violations.extend(problems));
    let start = run
        .journal
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .shim_fds
        .get(id)
        .copied();
    if let Some((pid, fds)) = start
        && run.c.shim_of(id) == Some(pid)
    {
        let now = check::settled_fd_count(pid);
        if now > fds + super::FD_SLACK {
            let checkpoints = check::listed(run.c, id).last().cloned().unwrap_or_default();
            run.record(|j| {
                j.fd_leaks.push(format!(
                    "shim {pid} of {id}: {now} open fds at the end against {fds} at its start \
                     (newest checkpoint {checkpoints}): {}",
                    check::fd_kinds(pid)
                ))
            });
        }
    }
}

fn status(c: &Containerd, id: &str) -> serde_json::Value {
    serde_json::from_str(&c.belayer(&["status", id]).stdout).unwrap_or_default()
}

/// Kills and removes container `id` (task and container), tolerating either being gone.
pub fn remove(c: &Containerd, id: &str) {
    let _ = c.ctr(&["tasks", "kill", "-s", "9", id]);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(20) {
        match c.task_row(id).get(1).map(String::as_str) {
            None | Some("STOPPED") => break,
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let _ = c.ctr(&["tasks", "rm", "-f", id]);
    let _ = c.ctr(&["containers", "rm", id]);
}
