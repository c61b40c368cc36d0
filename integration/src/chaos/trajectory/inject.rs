//! The injection of each fault kind into one trajectory's sandbox, and what is checked right
//! after it.

use std::time::{Duration, Instant};

use super::{Failure, Injected, Traj, read_log, remove, turn_script, unix_ms};
use crate::Out;
use crate::chaos::check;
use crate::chaos::fault::{self, Kind};
use crate::episode::{Sandbox, is_contiguous};

impl Traj<'_, '_> {
    pub(super) fn inject(&mut self, kind: Kind) -> Result<Injected, Failure> {
        let Some(pid) = self.init_pid() else {
            return Err(Failure::Lost(format!(
                "no running init before the fault: {:?}",
                self.c().task_row(self.id())
            )));
        };
        match kind {
            Kind::InitKillGap => self.kill_in_gap(pid),
            Kind::InitKillAction => self.kill_in_action(pid),
            Kind::InitKillCheckpoint => self.kill_in_checkpoint(pid),
            Kind::CriuKillDump => self.kill_criu(pid),
            Kind::RaceCheckpoint => self.race_checkpoint(),
            Kind::RaceRestore => self.race_restore(),
            Kind::RaceFork => self.race_fork(pid),
            Kind::RaceRm => self.race_rm(),
            Kind::Corrupt => self.corrupt(pid),
        }
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
            // Claimed otherwise (tests/checkpoint_errors.rs): the processes run on. The
            // sandbox recovers; the trajectory goes on from there.
            let recovered = self.recovered(before, killed_at)?;
            return Err(Failure::Violated(format!(
                "the sandbox died when CRIU was killed mid-dump ({}); {recovered}",
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
        let Some(newest) = check::listed(self.c(), self.id()).pop() else {
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
