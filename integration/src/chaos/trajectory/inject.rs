//! The injection of each fault kind into one trajectory's sandbox, and what is checked right
//! after it.

use std::time::{Duration, Instant};

use super::{Failure, Injected, Traj, read_log, remove, status, turn_script, unix_ms};
use crate::Out;
use crate::bench::wait_until;
use crate::chaos::check;
use crate::chaos::fault::{self, Kind};
use crate::episode::{Sandbox, is_contiguous};

/// containerd's exit status of a task killed by SIGTRAP (128 + 5).
const SIGTRAP_EXIT: u64 = 128 + libc::SIGTRAP as u64;

/// The whole of [`crate::chaos::Run::gate`], held by a global fault.
type Gate<'a> = std::sync::RwLockWriteGuard<'a, ()>;

/// How long a restore (and the CRIU in it) is waited for.
const RESTORE_WAIT: Duration = Duration::from_secs(30);
/// How long `runc restore` may go on once its CRIU is killed.
const RUNC_WAIT: Duration = Duration::from_secs(20);

/// What an operator does for a `runc restore` (pid `runc`) that waits on after its CRIU died:
/// SIGKILLs the CRIU forks it still has (the half-restored tasks, which hold CRIU's RPC socket
/// open), so that runc sees the socket close. Says what it found and whether runc ended.
fn unstick(runc: u32) -> String {
    let forks: Vec<fault::Proc> = fault::processes()
        .into_iter()
        .filter(|p| p.ppid == runc && p.comm == "criu")
        .collect();
    for p in &forks {
        let _ = crate::sigkill(i64::from(p.pid));
    }
    let ended = wait_until(Duration::from_secs(10), || fault::gone(runc));
    format!(
        "{:?}; SIGKILLed by the soak, after which runc {}{}",
        forks
            .iter()
            .map(|p| format!("{} {:?}", p.pid, p.cmdline.trim()))
            .collect::<Vec<_>>(),
        if ended { "ended" } else { "still waited" },
        if ended {
            String::new()
        } else {
            format!("; its tree then: {}", fault::describe_tree(runc))
        }
    )
}

/// `belayer rm` of every checkpoint of removed container `id`, newest first (a later one may
/// stack on an earlier one's layer).
fn drop_checkpoints(c: &crate::Containerd, id: &str) -> Result<(), String> {
    let mut listed = check::listed(c, id);
    while let Some(cp) = listed.pop() {
        let out = c.belayer(&["rm", id, &cp]);
        if out.code != 0 {
            return Err(format!(
                "belayer rm {id} {cp} after the fork was removed: {}",
                out.stderr.trim()
            ));
        }
    }
    Ok(())
}

/// Where a sandbox came to after a restore that was interfered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settled {
    Recovered,
    Running,
    Stopped,
}

impl Traj<'_, '_> {
    pub(super) fn inject(&mut self, kind: Kind) -> Result<Injected, Failure> {
        // A global fault holds every other trajectory between turns from here.
        let run = self.run;
        let all = kind
            .global()
            .then(|| run.gate.write().unwrap_or_else(|e| e.into_inner()));
        let Some(pid) = self.init_pid() else {
            return Err(Failure::Lost(format!(
                "no running init before the fault: {:?}",
                self.c().task_row(self.id())
            )));
        };
        // A kill whose recovery would be the third from the newest checkpoint in 60 s is a
        // crash loop, which stops the task by design: a checkpoint first, as an automatic one
        // would have been (the kinds that may recover twice, or not at all, do this themselves).
        let spared = if matches!(
            kind,
            Kind::InitKillGap
                | Kind::InitKillAction
                | Kind::InitKillCheckpoint
                | Kind::CriuKillRestore
        ) {
            match self.spare_crash_loop(1) {
                Ok(spared) => spared,
                Err(why) => return Ok(Injected::Missed(why)),
            }
        } else {
            String::new()
        };
        let result = match kind {
            Kind::InitKillGap => self.kill_in_gap(pid),
            Kind::InitKillAction => self.kill_in_action(pid),
            Kind::InitKillCheckpoint => self.kill_in_checkpoint(pid),
            Kind::CriuKillDump => self.kill_criu(pid),
            Kind::RaceCheckpoint => self.race_checkpoint(),
            Kind::RaceRestore => self.race_restore(),
            Kind::RaceFork => self.race_fork(pid),
            Kind::RaceRm => self.race_rm(),
            Kind::Corrupt => self.corrupt(pid),
            Kind::ShimKill => self.kill_shim(),
            Kind::CriuKillRestore => self.kill_restoring_criu(pid),
            Kind::InitKillRestore => self.kill_restored_init(pid),
            Kind::LazyPagesKill => self.kill_lazy_fill(),
            Kind::ContainerdRestart => self.restart_containerd(pid, all),
            Kind::DiskFull => self.fill_disk(pid, all),
            Kind::WorkerKill => self.kill_worker(),
        };
        match result {
            Ok(Injected::Yes(d)) if !spared.is_empty() => Ok(Injected::Yes(spared + &d)),
            r => r,
        }
    }

    /// SIGKILLs the rollout worker's primary mid-generation (one injection at a time across
    /// sandboxes; the sandbox is not touched): the shadow must take over and the request end
    /// with an unkilled run's tokens ([`crate::chaos::worker`]).
    fn kill_worker(&mut self) -> Result<Injected, Failure> {
        use crate::chaos::worker::Injection;
        let Some(group) = &self.run.worker else {
            return Err(Failure::Violated(
                "worker-kill drawn but no rollout worker group was started".into(),
            ));
        };
        match group.inject() {
            Injection::Survived {
                detail,
                takeover_ms,
            } => {
                self.run.record(|j| j.worker_takeover_ms.push(takeover_ms));
                Ok(Injected::Yes(detail))
            }
            Injection::Missed(d) => Ok(Injected::Missed(d)),
            Injection::Violated(d) => Err(Failure::Violated(d)),
        }
    }

    /// SIGKILLs the CRIU restoring the sandbox, 0–60 ms after it is seen: in an explicit
    /// `belayer restore` of the newest checkpoint, or in the automatic recovery after an init
    /// kill. The restore must fail with an error naming it (or have completed); the sandbox must
    /// then be recovered, or be restored by the framework's next `belayer restore` — never run
    /// on half-restored — at the journal position; the checkpoint must still verify.
    fn kill_restoring_criu(&mut self, pid: i64) -> Result<Injected, Failure> {
        let explicit = self.rng.chance(0.5);
        let delay = Duration::from_millis(self.rng.range(0, 60));
        let Some(newest) = check::listed(self.c(), self.id()).pop() else {
            return Ok(Injected::Missed("no checkpoint listed".into()));
        };
        let before = self.recoveries();
        let since = unix_ms();
        if !explicit {
            self.kill_init(pid)?;
        }
        let (c, id) = (self.c(), self.id().to_string());
        let (out, killed, hung) = std::thread::scope(|scope| {
            let restore = explicit.then(|| scope.spawn(|| c.belayer(&["restore", &id])));
            let start = Instant::now();
            let mut killed = None;
            while start.elapsed() < RESTORE_WAIT
                && !restore.as_ref().is_some_and(|r| r.is_finished())
            {
                if let Some(criu) = fault::restoring_criu(&id) {
                    std::thread::sleep(delay);
                    let runc = fault::parent_of(criu);
                    killed = Some(crate::sigkill(criu).map(|()| (criu, runc, Instant::now())));
                    // `runc restore` must end (in error) now; a restore that waits on for CRIU
                    // holds the container (its status, kill, delete) as long.
                    let hung = !wait_until(RUNC_WAIT, || fault::gone(runc));
                    if hung {
                        return (None, killed, Some(unstick(runc)));
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            (restore.and_then(|r| r.join().ok()), killed, None)
        });
        if let Some(left) = hung {
            let (criu, runc) = match killed {
                Some(Ok((criu, runc, _))) => (criu, runc),
                _ => (0, 0),
            };
            let log = self.restore_scratch(&newest).join("restore.log");
            let last = std::fs::read_to_string(&log)
                .ok()
                .and_then(|l| l.lines().last().map(|l| l.trim().to_string()))
                .unwrap_or_default();
            return Err(Failure::Lost(format!(
                "CRIU {criu} killed in {} of {newest} (restore.log's last line: {last:?}): `runc \
                 restore` (pid {runc}) still waited {RUNC_WAIT:?} later, holding the container \
                 (its status and kill hang), on the CRIU forks it left: {left}",
                if explicit {
                    "belayer restore"
                } else {
                    "the recovery"
                }
            )));
        }
        let how = if explicit {
            "belayer restore"
        } else {
            "the recovery"
        };
        let Some(Ok((criu, _, killed))) = killed else {
            // The restore went by unseen: what it did must still hold.
            let detail = if explicit {
                match &out {
                    Some(o) if o.code == 0 => self.rewound(since)?,
                    o => {
                        return Err(Failure::Lost(format!(
                            "belayer restore with no fault failed: {o:?}"
                        )));
                    }
                }
            } else {
                self.recovered(before, Instant::now())?
            };
            return Ok(Injected::Missed(format!(
                "no restoring CRIU caught in {how} ({killed:?}); {detail}"
            )));
        };
        let said = match &out {
            None if explicit => "panicked".to_string(),
            None => String::new(),
            Some(o) if o.code == 0 => format!("succeeded: {}", o.stdout.trim()),
            Some(o) => o.stderr.trim().to_string(),
        };
        if let Some(o) = &out
            && o.code != 0
            && !o.stderr.to_lowercase().contains("restor")
        {
            return Err(Failure::Violated(format!(
                "unclear error from belayer restore with CRIU {criu} killed: {:?}",
                o.stderr
            )));
        }
        // What the sandbox came to: recovered (or restored, when the restore had completed),
        // or stopped, waiting for the framework.
        let settled = self.settle(before, RESTORE_WAIT);
        let detail = match settled {
            Settled::Recovered => self.recovered(before, killed)?,
            Settled::Running if out.as_ref().is_some_and(|o| o.code == 0) => {
                let d = self.rewound(since)?;
                let ms = killed.elapsed().as_millis() as u64;
                self.run.record(|j| j.recovery_ms.push(ms));
                d
            }
            other => {
                // A running task whose restore failed would be half-restored: its processes
                // must not pass for the checkpoint's.
                let row = self.c().task_row(self.id());
                let half = (other == Settled::Running).then(|| {
                    format!(
                        "{how} failed ({said}) and yet the task runs: {row:?}; status {}",
                        status(self.c(), self.id())
                    )
                });
                let retry_since = unix_ms();
                let again = self.belayer(&["restore", self.id()]);
                if again.code != 0 {
                    return Err(Failure::Lost(format!(
                        "after CRIU {criu} was killed in {how} ({said}; task {row:?}), the \
                         framework's belayer restore failed: {}; shim log: {}",
                        again.stderr.trim(),
                        self.c().log_lines(self.id(), 5)
                    )));
                }
                let d = self.rewound(retry_since)?;
                if let Some(half) = half {
                    return Err(Failure::Violated(format!(
                        "{half}; belayer restore again: {d}"
                    )));
                }
                let ms = killed.elapsed().as_millis() as u64;
                self.run.record(|j| j.recovery_ms.push(ms));
                format!("task {row:?}; belayer restore again: {d}")
            }
        };
        check::verify_settled(self.c(), self.id(), &newest)
            .map_err(|e| Failure::Violated(format!("after the kill: {e}")))?;
        self.no_strays().map_err(|e| {
            Failure::Violated(format!(
                "after CRIU {criu} was killed in {how} ({said}): {e}; {detail}"
            ))
        })?;
        Ok(Injected::Yes(format!(
            "CRIU {criu} killed in {how} of {newest} ({said}); {detail}"
        )))
    }

    /// No process in the container's cgroup but the init's tree and the execs: a restore that
    /// failed half-way must not leave a copy of the container's processes running beside the
    /// restored ones. Those found are killed (so that the run goes on) and named.
    fn no_strays(&self) -> Result<(), String> {
        let Some(init) = self.init_pid() else {
            return Ok(());
        };
        let shims = crate::leaks::pids_with_args(&["-id", self.id()]);
        let [shim] = shims[..] else {
            return Ok(());
        };
        let strays = fault::strays(init, shim, &self.c().cgroup_root());
        if strays.is_empty() {
            return Ok(());
        }
        let named: Vec<String> = strays
            .iter()
            .map(|p| format!("{} ({}, parent {})", p.pid, p.comm, p.ppid))
            .collect();
        for p in &strays {
            let _ = crate::sigkill(i64::from(p.pid));
        }
        Err(format!(
            "processes left in the container's cgroup outside its init {init}'s tree (killed by \
             the soak): {}",
            named.join(", ")
        ))
    }

    /// SIGKILLs the init a restore has just brought back, 0–300 ms after the restore: one of
    /// an explicit `belayer restore` of the newest checkpoint, or of the automatic recovery after
    /// an init kill (even odds; see [`Traj::spare_crash_loop`]). The sandbox must be recovered
    /// again, at the journal position.
    fn kill_restored_init(&mut self, pid: i64) -> Result<Injected, Failure> {
        let recovery = self.rng.chance(0.5);
        let delay = Duration::from_millis(self.rng.range(0, 300));
        let fresh = match self.spare_crash_loop(if recovery { 2 } else { 1 }) {
            Ok(fresh) => fresh,
            Err(why) => return Ok(Injected::Missed(why)),
        };
        let how = if recovery {
            let before = self.recoveries();
            let killed = self.kill_init(pid)?;
            let back = wait_until(RESTORE_WAIT, || {
                self.recoveries() > before
                    && self.c().task_row(self.id()).get(1).map(String::as_str) == Some("RUNNING")
            });
            if !back {
                return Err(Failure::Lost(format!(
                    "no recovery within {RESTORE_WAIT:?} of the first kill ({} ms ago): task {:?}, \
                     shim log: {}",
                    killed.elapsed().as_millis(),
                    self.c().task_row(self.id()),
                    self.c().log_lines(self.id(), 5)
                )));
            }
            "the recovery"
        } else {
            let out = self.belayer(&["restore", self.id()]);
            if out.code != 0 {
                return Err(Failure::Lost(format!(
                    "belayer restore with no fault failed: {}",
                    out.stderr.trim()
                )));
            }
            "belayer restore"
        };
        let Some(restored) = self.init_pid() else {
            return Err(Failure::Lost(format!(
                "no init after {how}: task {:?}",
                self.c().task_row(self.id())
            )));
        };
        std::thread::sleep(delay);
        let before = self.recoveries();
        let killed = self.kill_init(restored)?;
        self.recovered(before, killed).map(|d| {
            Injected::Yes(format!(
                "{fresh}init {restored} of {how} killed {} ms after it; {d}",
                delay.as_millis()
            ))
        })
    }

    /// A `belayer restore` of the newest checkpoint — lazy, as the shim restores where the
    /// kernel allows — then the lazy-pages daemon still filling its memory stopped (SIGSTOP, so
    /// that it cannot finish meanwhile) and SIGKILLed, as in `tests/checkpoint.rs`: the shim must
    /// end the container rather than let it run on with holes in its memory, say why
    /// (`fill_failure`, or its log, naming lazy-pages), and the recovery bring it back at the
    /// journal position. Missed when the fill had ended before the daemon was caught.
    fn kill_lazy_fill(&mut self) -> Result<Injected, Failure> {
        let fresh = match self.spare_crash_loop(1) {
            Ok(fresh) => fresh,
            Err(why) => return Ok(Injected::Missed(why)),
        };
        let since = unix_ms();
        let out = self.belayer(&["restore", self.id()]);
        if out.code != 0 {
            return Err(Failure::Lost(format!(
                "belayer restore with no fault failed: {}",
                out.stderr.trim()
            )));
        }
        let cp = status(self.c(), self.id())["position"]["checkpoint"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let pid_file = self.restore_scratch(&cp).join("lazy-pages.pid");
        let daemon = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .filter(|d| {
                !fault::gone(*d)
                    && std::fs::read(format!("/proc/{d}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("lazy-pages"))
            })
            .filter(|d| crate::signal(i64::from(*d), libc::SIGSTOP).is_ok() && !fault::gone(*d));
        let Some(daemon) = daemon else {
            let d = self.rewound(since)?;
            return Ok(Injected::Missed(format!(
                "{fresh}the lazy fill of checkpoint {cp} had ended ({}); {d}",
                if pid_file.exists() {
                    "its daemon was gone"
                } else {
                    "no lazy-pages.pid: not a lazy restore"
                }
            )));
        };
        let init = self.init_pid();
        let before = self.recoveries();
        let killed = crate::sigkill(i64::from(daemon))
            .map(|()| Instant::now())
            .map_err(|e| Failure::Violated(format!("SIGKILL of lazy-pages {daemon}: {e}")))?;
        let d = self.recovered(before, killed)?;
        let said = status(self.c(), self.id())["fill_failure"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| self.c().log_lines(&format!("lazy-pages (pid {daemon})"), 1));
        if !said.contains("lazy-pages") {
            return Err(Failure::Violated(format!(
                "lazy-pages {daemon} of the restore from {cp} killed mid-fill: recovered, but \
                 neither the status nor the shim's log says why the init ({init:?}) ended; {d}"
            )));
        }
        Ok(Injected::Yes(format!(
            "{fresh}lazy-pages {daemon} of the restore from {cp} killed mid-fill; init {init:?} \
             ended: {said:?}; {d}"
        )))
    }

    /// Where the shim keeps CRIU's scratch of a restore from checkpoint `cp` (restore.log, the
    /// lazy-pages daemon's pid file): the task's work dir.
    fn restore_scratch(&self, cp: &str) -> std::path::PathBuf {
        self.c()
            .task_work_dir(self.id())
            .join(format!("restore-{cp}"))
    }

    /// containerd SIGKILLed (a crash) or stopped with SIGTERM (even odds) and started again on
    /// the same root, state and socket, with every trajectory held between turns meanwhile:
    /// every sandbox's task must be listed again with the same pid and status, this sandbox's
    /// init must have run on with its processes intact, and a checkpoint and a recovery (the init
    /// SIGKILLed) must work after it.
    fn restart_containerd(&mut self, pid: i64, all: Option<Gate>) -> Result<Injected, Failure> {
        use std::sync::atomic::Ordering;
        let crash = self.rng.chance(0.5);
        let before = self.c().ctr(&["tasks", "ls"]).stdout;
        let old = self.run.daemon_pid.load(Ordering::SeqCst);
        let down = Instant::now();
        if crash {
            self.c().kill_daemon(old);
        } else {
            let _ = crate::signal(i64::from(old), libc::SIGTERM);
            if !wait_until(Duration::from_secs(10), || fault::gone(old)) {
                self.c().kill_daemon(old);
            }
        }
        let stayed = !fault::gone(pid as u32);
        let child = self
            .c()
            .spawn_again()
            .map_err(|e| Failure::Lost(format!("containerd {old} did not come up again: {e}")))?;
        let up_ms = down.elapsed().as_millis();
        let new = child.id();
        self.run.daemon_pid.store(new, Ordering::SeqCst);
        self.run
            .daemons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child);
        let after = self.c().ctr(&["tasks", "ls"]).stdout;
        // docker's sandboxes wait for their dockerd to reconnect (docker's behaviour, said in the
        // record), the gate still held whole.
        let docker = self.run.docker_back();
        // The others go on; this trajectory's own checks hold the gate as a turn does, so that
        // no other global fault lands in them.
        drop(all);
        let run = self.run;
        let _turn = run.gate.read().unwrap_or_else(|e| e.into_inner());
        // The rows, in any order (containerd lists them as it loads them again).
        let rows = |list: &str| {
            let mut rows: Vec<String> = list.lines().map(str::to_string).collect();
            rows.sort();
            rows
        };
        let (before, after) = (rows(&before), rows(&after));
        // A STOPPED task is a trajectory lost earlier (its recovery refused, a crash loop):
        // whether containerd lists it again is not this fault's claim, and is said, not failed.
        let (before, stopped): (Vec<String>, Vec<String>) =
            before.into_iter().partition(|r| !r.contains(" STOPPED"));
        let after: Vec<String> = after
            .into_iter()
            .filter(|r| !r.contains(" STOPPED"))
            .collect();
        let stopped = if stopped.is_empty() {
            String::new()
        } else {
            format!(" (stopped before: {stopped:?})")
        };
        let mut how = format!(
            "containerd {old} {}, up again as {new} in {up_ms} ms",
            if crash { "SIGKILLed" } else { "stopped" }
        );
        match docker {
            Some(Ok(took)) => how.push_str(&format!(
                ", dockerd ran execs again {} ms later",
                took.as_millis()
            )),
            Some(Err(why)) => {
                return Err(Failure::Violated(format!(
                    "{how}: dockerd did not reconnect: {why}"
                )));
            }
            None => {}
        }
        if !stayed {
            return Err(Failure::Violated(format!(
                "{how}: the init {pid} died while containerd was down"
            )));
        }
        if before != after {
            return Err(Failure::Violated(format!(
                "{how}: the task list changed: {before:?} → {after:?}"
            )));
        }
        // An exec, as the next turn would send (its error kept: `untouched` reads only output).
        let probe = self.s.exec("cat /work/holder.ready", None);
        if probe.code != 0 || probe.stdout.trim().is_empty() {
            return Err(Failure::Violated(format!(
                "{how}: the first exec after it failed: exit {}, {:?}",
                probe.code,
                probe.stderr.trim()
            )));
        }
        self.untouched(pid)
            .map_err(|e| Failure::Violated(format!("{how}: {e}")))?;
        let cp = self.belayer(&["checkpoint", self.id()]);
        if cp.code != 0 && !accepted_refusal(&cp.stderr) {
            return Err(Failure::Violated(format!(
                "{how}: the checkpoint after it failed: {}",
                cp.stderr.trim()
            )));
        }
        let said = if cp.code == 0 {
            format!("checkpoint {}", cp.stdout.trim())
        } else {
            format!("checkpoint refused: {}", cp.stderr.trim())
        };
        let fresh = match self.spare_crash_loop(1) {
            Ok(fresh) => fresh,
            Err(why) => return Ok(Injected::Yes(format!("{how}; {said}; no kill: {why}"))),
        };
        let before = self.recoveries();
        let killed = self.kill_init(pid)?;
        let d = self.recovered(before, killed).map_err(|f| match f {
            // What the exec that failed said, for the record.
            Failure::Lost(d) | Failure::Violated(d) => {
                let probe = self.s.exec("cat /work/holder.ready", None);
                Failure::Lost(format!(
                    "{how}; {said}; the recovery after it: {d} (an exec now: exit {}, {:?})",
                    probe.code,
                    probe.stderr.trim()
                ))
            }
        })?;
        Ok(Injected::Yes(format!(
            "{how}; tasks unchanged{stopped}; {said}; {fresh}then the init killed: {d}"
        )))
    }

    /// The store's filesystem — a tmpfs of the soak's own, never the machine's — filled to the
    /// last byte with every trajectory held between turns, a `belayer checkpoint` asked for,
    /// then the space freed: the checkpoint must fail with an error saying the disk is full, the
    /// sandbox run on untouched, nothing partial be listed or left staged, and the next
    /// checkpoint, on the freed disk, work.
    fn fill_disk(&mut self, pid: i64, all: Option<Gate>) -> Result<Injected, Failure> {
        let Some(fs) = self.run.cfg.store_fs.clone() else {
            return Ok(Injected::Missed(
                "the store is on no private filesystem (--store-mb)".into(),
            ));
        };
        if !fault::private_tmpfs(&fs) {
            return Err(Failure::Violated(format!(
                "refused to fill {}: not a tmpfs the soak mounted",
                fs.display()
            )));
        }
        let listed = check::listed(self.c(), self.id());
        let file = fs.join("chaos-fill");
        let filled = fault::fill(&file);
        let out = self.belayer(&["checkpoint", self.id()]);
        let during = check::listed(self.c(), self.id());
        let staged: Vec<String> = check::staging_dirs(self.c())
            .into_iter()
            .filter(|d| d.starts_with(&format!("{}/", self.id())))
            .collect();
        let _ = std::fs::remove_file(&file);
        drop(all);
        let run = self.run;
        let _turn = run.gate.read().unwrap_or_else(|e| e.into_inner());
        let filled =
            filled.map_err(|e| Failure::Violated(format!("filling {}: {e}", file.display())))?;
        let mb = filled >> 20;
        if out.code == 0 {
            return Err(Failure::Violated(format!(
                "checkpoint {} taken on the full disk ({mb} MiB written to fill it)",
                out.stdout.trim()
            )));
        }
        let err = out.stderr.to_lowercase();
        if !(err.contains("disk full") || err.contains("no space") || accepted_refusal(&err)) {
            return Err(Failure::Violated(format!(
                "the checkpoint on the full disk failed without saying so: {:?}",
                out.stderr.trim()
            )));
        }
        let partial: Vec<&String> = during.iter().filter(|c| !listed.contains(c)).collect();
        if !partial.is_empty() || !staged.is_empty() {
            return Err(Failure::Violated(format!(
                "on the full disk: listed {partial:?} new, staging dirs {staged:?}"
            )));
        }
        self.untouched(pid).map_err(Failure::Violated)?;
        let after = self.belayer(&["checkpoint", self.id()]);
        if after.code != 0 && !accepted_refusal(&after.stderr) {
            return Err(Failure::Violated(format!(
                "the checkpoint on the freed disk failed: {}",
                after.stderr.trim()
            )));
        }
        Ok(Injected::Yes(format!(
            "{mb} MiB filled; refused: {}; after freeing: {}",
            out.stderr.trim(),
            if after.code == 0 {
                format!("checkpoint {}", after.stdout.trim())
            } else {
                after.stderr.trim().to_string()
            }
        )))
    }

    /// Before a fault that makes `coming` recoveries: when with those the newest checkpoint
    /// would have been recovered from three times in 60 s — a crash loop, which ends recovery by
    /// design — a checkpoint is taken first (as the automatic ones would, had one landed since).
    /// Says so (empty when none was needed); `Err` when the checkpoint was refused.
    fn spare_crash_loop(&self, coming: usize) -> Result<String, String> {
        let recent = self.recent_recoveries();
        if recent + coming < 3 {
            return Ok(String::new());
        }
        let out = self.belayer(&["checkpoint", self.id()]);
        if out.code != 0 {
            return Err(format!(
                "{recent} recoveries from the newest checkpoint in 60 s, and the checkpoint \
                 taken to spare a crash loop failed: {}",
                out.stderr.trim()
            ));
        }
        Ok(format!(
            "checkpoint {} taken first ({recent} recoveries from the newest in 60 s); ",
            out.stdout.trim()
        ))
    }

    /// Recoveries from the newest checkpoint in the last 60 s.
    fn recent_recoveries(&self) -> usize {
        let st = status(self.c(), self.id());
        let newest = check::listed(self.c(), self.id()).pop().unwrap_or_default();
        let now = unix_ms();
        st["recoveries"].as_array().map_or(0, |r| {
            r.iter()
                .filter(|rec| {
                    rec["restore"]["checkpoint"].as_str() == Some(newest.as_str())
                        && rec["at_unix_ms"]
                            .as_u64()
                            .is_some_and(|at| now.saturating_sub(at) < 60_000)
                })
                .count()
        })
    }

    /// Waits up to `limit` for the sandbox to settle after a failed restore: recovered (more
    /// recoveries than `before`, running), running (for 2 s), or not running (for 2 s).
    fn settle(&self, before: usize, limit: Duration) -> Settled {
        let start = Instant::now();
        let mut last: Option<(Settled, Instant)> = None;
        loop {
            let running =
                self.c().task_row(self.id()).get(1).map(String::as_str) == Some("RUNNING");
            if running && self.recoveries() > before {
                return Settled::Recovered;
            }
            let now = if running {
                Settled::Running
            } else {
                Settled::Stopped
            };
            match last {
                Some((was, since)) if was == now => {
                    if since.elapsed() >= Duration::from_secs(2) || start.elapsed() > limit {
                        return now;
                    }
                }
                _ => last = Some((now, Instant::now())),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the sandbox's shim. containerd then removes the task; the framework restores
    /// the newest checkpoint with `belayer restore` (no shim is left to recover by itself).
    fn kill_shim(&mut self) -> Result<Injected, Failure> {
        let shims = crate::leaks::pids_with_args(&["-id", self.id()]);
        let [shim] = shims[..] else {
            return Ok(Injected::Missed(format!("shims of the sandbox: {shims:?}")));
        };
        crate::sigkill(i64::from(shim))
            .map_err(|e| Failure::Violated(format!("SIGKILL of shim {shim}: {e}")))?;
        let killed = Instant::now();
        while !self.c().task_row(self.id()).is_empty() {
            if killed.elapsed() > Duration::from_secs(30) {
                return Err(Failure::Violated(format!(
                    "containerd kept the task of killed shim {shim}: {:?}",
                    self.c().task_row(self.id())
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let gone_ms = killed.elapsed().as_millis();
        let since = unix_ms();
        let out = self.belayer(&["restore", self.id()]);
        if out.code != 0 {
            return Err(Failure::Lost(format!(
                "restore after the shim's death failed: {}",
                out.stderr.trim()
            )));
        }
        let detail = self.rewound(since)?;
        let ms = killed.elapsed().as_millis() as u64;
        self.run.record(|j| j.recovery_ms.push(ms));
        Ok(Injected::Yes(format!(
            "shim {shim} killed, task gone after {gone_ms} ms; {detail}; kill → next action {ms} ms"
        )))
    }

    /// SIGKILLs the init between turns; the sandbox must recover.
    fn kill_in_gap(&mut self, pid: i64) -> Result<Injected, Failure> {
        let before = self.recoveries();
        let killed = self.kill_init(pid)?;
        self.recovered(before, killed).map(Injected::Yes)
    }

    /// SIGKILLs the init while a turn runs; the sandbox must recover.
    fn kill_in_action(&mut self, pid: i64) -> Result<Injected, Failure> {
        let before = self.recoveries();
        let wait = Duration::from_millis(self.rng.range(50, 450));
        let k = self.done + 1;
        let s = &self.s;
        let (out, killed) = std::thread::scope(|scope| {
            let turn = scope.spawn(|| s.exec(&turn_script(k), None));
            std::thread::sleep(wait);
            let finished = turn.is_finished();
            let killed = crate::sigkill(pid).map(|_| Instant::now());
            (turn.join().ok(), killed.map(|k| (k, finished)))
        });
        let (killed, finished) =
            killed.map_err(|e| Failure::Violated(format!("SIGKILL of init {pid}: {e}")))?;
        let code = out.map_or(-1, |o| o.code);
        self.recovered(before, killed).map(|d| {
            Injected::Yes(format!(
                "turn {k} exec exit {code}{}; {d}",
                if finished {
                    " (it had ended before the kill)"
                } else {
                    ""
                }
            ))
        })
    }

    /// SIGKILLs the init once a checkpoint of it is being written; the sandbox must recover.
    fn kill_in_checkpoint(&mut self, pid: i64) -> Result<Injected, Failure> {
        let before = self.recoveries();
        let (c, id) = (self.c(), self.id().to_string());
        let (out, killed) = std::thread::scope(|scope| {
            let cp = scope.spawn(|| c.belayer(&["checkpoint", &id]));
            let mut killed = None;
            while !cp.is_finished() {
                if fault::pending_checkpoint(c, &id).is_some() {
                    killed = Some(crate::sigkill(pid).map(|_| Instant::now()));
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (cp.join().ok(), killed)
        });
        let Some(killed) = killed else {
            return Ok(Injected::Missed(
                "the checkpoint ended before it was seen".into(),
            ));
        };
        let killed =
            killed.map_err(|e| Failure::Violated(format!("SIGKILL of init {pid}: {e}")))?;
        let said = out.map_or("?".into(), |o| {
            if o.code == 0 {
                format!("checkpoint {}", o.stdout.trim())
            } else {
                o.stderr.trim().to_string()
            }
        });
        self.recovered(before, killed)
            .map(|d| Injected::Yes(format!("the checkpoint: {said}; {d}")))
    }

    /// SIGKILLs the CRIU dumping the sandbox: the checkpoint fails clearly and the sandbox runs on.
    fn kill_criu(&mut self, pid: i64) -> Result<Injected, Failure> {
        let before = self.recoveries();
        let killed_at = Instant::now();
        let (c, id) = (self.c(), self.id().to_string());
        let init = pid.to_string();
        let (out, killed) = std::thread::scope(|scope| {
            let cp = scope.spawn(|| c.belayer(&["checkpoint", &id]));
            let mut killed = None;
            while !cp.is_finished() {
                if let Some(criu) = fault::dumping_criu(c, &id, &init) {
                    killed = Some(crate::sigkill(criu));
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (cp.join().ok(), killed)
        });
        if !matches!(killed, Some(Ok(()))) {
            return Ok(Injected::Missed(format!(
                "no CRIU dump caught ({killed:?})"
            )));
        }
        let out = out.unwrap_or(Out {
            code: -1,
            stdout: String::new(),
            stderr: "panicked".into(),
        });
        if out.stderr.contains("died during the checkpoint")
            || self.recoveries() > before
            || self.init_pid() != Some(pid)
        {
            let recovered = self.recovered(before, killed_at)?;
            // How the init ended (containerd's status: 128 + the signal that killed it).
            let exit = status(self.c(), self.id())["recoveries"]
                .as_array()
                .and_then(|r| r.last()?["exit_status"].as_u64());
            // A task CRIU had stopped at one of its parasite's traps takes, once CRIU is gone,
            // the SIGTRAP meant for CRIU (exit 133): no runtime can keep it; the claim is that
            // the sandbox is then recovered like any crash. Any other death is a violation.
            if exit == Some(SIGTRAP_EXIT) {
                return Ok(Injected::Yes(format!(
                    "the init died of the SIGTRAP of CRIU's parasite (exit 133); {recovered}"
                )));
            }
            return Err(Failure::Violated(format!(
                "the sandbox died when CRIU was killed mid-dump (init exit status {exit:?}; {}); \
                 {recovered}",
                out.stderr.trim()
            )));
        }
        if out.code == 0 {
            // CRIU had finished its part when killed: a whole checkpoint is fine.
            self.untouched(pid).map_err(Failure::Violated)?;
            return Ok(Injected::Yes(format!(
                "the checkpoint {} completed",
                out.stdout.trim()
            )));
        }
        if !out.stderr.to_lowercase().contains("criu dump of container") {
            return Err(Failure::Violated(format!(
                "unclear error: {:?}",
                out.stderr
            )));
        }
        self.untouched(pid).map_err(Failure::Violated)?;
        Ok(Injected::Yes(format!("refused: {}", out.stderr.trim())))
    }

    /// A checkpoint asked for just before a turn: it succeeds or is refused clearly; the turn is unaffected.
    fn race_checkpoint(&mut self) -> Result<Injected, Failure> {
        let k = self.done + 1;
        let (c, id, s) = (self.run.c, self.s.id.clone(), &self.s);
        let (cp, turn) = std::thread::scope(|scope| {
            let cp = scope.spawn(|| c.belayer(&["checkpoint", &id]));
            std::thread::sleep(Duration::from_millis(20));
            let turn = s.exec(&turn_script(k), None);
            (cp.join().ok(), turn)
        });
        if turn.code != 0 {
            return Err(Failure::Lost(format!(
                "turn {k} beside the checkpoint failed: {}",
                turn.stderr.trim()
            )));
        }
        self.done = k;
        self.executed += 1;
        let cp = cp.unwrap_or(Out {
            code: -1,
            stdout: String::new(),
            stderr: "panicked".into(),
        });
        if cp.code == 0 {
            Ok(Injected::Yes(format!(
                "checkpoint {} beside turn {k}",
                cp.stdout.trim()
            )))
        } else if accepted_refusal(&cp.stderr) {
            Ok(Injected::Yes(format!("refused: {}", cp.stderr.trim())))
        } else {
            Err(Failure::Violated(format!(
                "checkpoint failed: {}",
                cp.stderr.trim()
            )))
        }
    }

    /// An explicit restore of the newest checkpoint: the environment is at its journal position.
    fn race_restore(&mut self) -> Result<Injected, Failure> {
        let since = unix_ms();
        let newest = check::listed(self.c(), self.id()).pop().unwrap_or_default();
        let out = self.belayer(&["restore", self.id()]);
        if out.code != 0 {
            // What a post-mortem needs of the images it could not read.
            let criu = self
                .c()
                .checkpoints_dir(self.id())
                .join(&newest)
                .join("criu");
            let mut cores: Vec<String> = std::fs::read_dir(&criu)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|n| n.starts_with("core-") || n.starts_with("pstree"))
                        .collect()
                })
                .unwrap_or_default();
            cores.sort();
            return Err(Failure::Lost(format!(
                "restore (newest listed: {newest}) failed: {}; in {}: {cores:?}",
                out.stderr.trim(),
                criu.display()
            )));
        }
        self.rewound(since).map(Injected::Yes)
    }

    /// A fork of the newest checkpoint: its log and memory are intact, the source untouched.
    fn race_fork(&mut self, pid: i64) -> Result<Injected, Failure> {
        // Not one corrupted on purpose (its refusal is corrupt-newest's claim): the newest
        // whole one, as a framework that saw the refusal would choose.
        let Some(newest) = check::listed(self.c(), self.id())
            .into_iter()
            .rfind(|cp| !self.corrupted.contains(cp))
        else {
            return Ok(Injected::Missed("no checkpoint listed".into()));
        };
        let out = self.belayer(&["fork", self.id(), "--checkpoint", &newest, "--count", "1"]);
        if out.code != 0 {
            return Err(Failure::Violated(format!(
                "fork of {newest} failed: {}",
                out.stderr.trim()
            )));
        }
        let fork = out.stdout.trim().to_string();
        self.run.record(|j| j.forks.push(fork.clone()));
        let f = Sandbox::attach(self.c(), &fork);
        let log = read_log(&f);
        let (now, start) = f.holder_digests();
        remove(self.c(), &fork);
        // Its checkpoints stay in the store after the container goes (they restore into new
        // containers): a tidy framework removes them, else every fork's leaves ~40 MB behind
        // (a 30-minute soak filled its 6 GB store so).
        drop_checkpoints(self.c(), &fork).map_err(Failure::Violated)?;
        let numbers = log.map_err(|e| Failure::Violated(format!("fork {fork}: {e}")))?;
        if !(numbers.is_empty() || is_contiguous(&numbers)) {
            return Err(Failure::Violated(format!(
                "fork {fork} of {newest}: log {numbers:?}"
            )));
        }
        if now.is_empty() || now != start {
            return Err(Failure::Violated(format!(
                "fork {fork} of {newest}: holder memory {now:?} vs {start:?}"
            )));
        }
        self.untouched(pid).map_err(Failure::Violated)?;
        Ok(Injected::Yes(format!(
            "fork {fork} of {newest} at turn {}",
            numbers.len()
        )))
    }

    /// `belayer rm` of the oldest checkpoint: removed and unlisted, or refused clearly.
    fn race_rm(&mut self) -> Result<Injected, Failure> {
        let listed = check::listed(self.c(), self.id());
        if listed.len() < 2 {
            return Ok(Injected::Missed("fewer than 2 checkpoints listed".into()));
        }
        let oldest = &listed[0];
        let out = self.belayer(&["rm", self.id(), oldest]);
        if out.code == 0 {
            if check::listed(self.c(), self.id()).contains(oldest) {
                return Err(Failure::Violated(format!(
                    "{oldest} still listed after its rm"
                )));
            }
            Ok(Injected::Yes(format!("removed {oldest}")))
        } else if accepted_refusal(&out.stderr) || out.stderr.contains("not found") {
            Ok(Injected::Yes(format!("refused: {}", out.stderr.trim())))
        } else {
            Err(Failure::Violated(format!(
                "rm {oldest}: {}",
                out.stderr.trim()
            )))
        }
    }

    /// Flips a byte of the newest checkpoint's largest CRIU image: a restore of it must be
    /// refused naming the file, with the sandbox untouched. Then a fresh checkpoint is taken (a
    /// recovery restores the newest, and does not fall back) and the corrupt one removed.
    fn corrupt(&mut self, pid: i64) -> Result<Injected, Failure> {
        let Some(newest) = check::listed(self.c(), self.id()).pop() else {
            return Ok(Injected::Missed("no checkpoint listed".into()));
        };
        let criu = self
            .c()
            .checkpoints_dir(self.id())
            .join(&newest)
            .join("criu");
        let Some(file) = fault::largest_file(&criu) else {
            return Ok(Injected::Missed(format!(
                "{newest} went before it was corrupted"
            )));
        };
        let name = fault::flip_byte(&file)
            .map_err(|e| Failure::Violated(format!("{}: {e}", file.display())))?;
        self.corrupted.push(newest.clone());
        let out = self.belayer(&["restore", self.id(), "--checkpoint", &newest]);
        if out.code == 0 {
            return Err(Failure::Lost(format!(
                "checkpoint {newest} with {name} corrupted was restored"
            )));
        }
        if !out.stderr.contains(&name) && !out.stderr.contains("not found") {
            return Err(Failure::Violated(format!(
                "the refusal does not name {name}: {:?}",
                out.stderr
            )));
        }
        self.untouched(pid).map_err(Failure::Violated)?;
        let fresh = self.belayer(&["checkpoint", self.id()]);
        let rm = self.belayer(&["rm", self.id(), &newest]);
        if rm.code == 0 {
            self.corrupted.retain(|c| c != &newest);
        }
        Ok(Injected::Yes(format!(
            "restore of {newest} refused: {}; fresh checkpoint: {}; rm: {}",
            out.stderr.trim(),
            if fresh.code == 0 {
                fresh.stdout.trim().to_string()
            } else {
                fresh.stderr.trim().to_string()
            },
            if rm.code == 0 {
                "done".to_string()
            } else {
                rm.stderr.trim().to_string()
            }
        )))
    }
}

/// An error Belayer documents for a request that meets another: "already in progress", a task
/// in vfork or uninterruptible I/O, the frozen bound (try again), a checkpoint in use.
fn accepted_refusal(stderr: &str) -> bool {
    [
        "in progress",
        "vfork",
        "uninterruptible",
        "try again",
        "in use",
        "is part of the fs chain",
    ]
    .iter()
    .any(|r| stderr.to_lowercase().contains(r))
}
