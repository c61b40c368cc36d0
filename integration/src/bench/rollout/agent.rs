//! One trajectory's agent loop: per turn, the LLM generates (a request to the rollout worker with
//! the growing context), then the turn's scripted action runs in the sandbox and its output joins
//! the context. With Belayer, an action that fails because the sandbox died (or finds the
//! environment rewound) waits for the shim's in-place recovery, reads the journal position it
//! reports, re-runs the undone actions (their outputs must equal what the context already holds)
//! and goes on. Without Belayer such a trajectory is lost, or (replay, what frameworks do) runs
//! again from its start in a fresh runc container.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_broker::worker::events::now;
use gpu_broker::worker::serve::protocol::{GenClient, GenRequest};
use serde::Serialize;
use serde_json::Value;

use super::actions::{self, Action};
use super::faults::SandboxKill;
use crate::containerd::{Containerd, Out};

/// What a trajectory's agent needs.
pub struct Ctx<'a> {
    pub c: &'a Containerd,
    pub belayer: bool,
    /// Replay a failed trajectory from its start in a fresh container (runc).
    pub replay: bool,
    pub llm: GenClient,
    pub seed: u64,
    pub turns: usize,
    pub max_new: u32,
    /// Sandbox kills of the schedule (this agent fires its own).
    pub kills: &'a [SandboxKill],
    /// Generations completed by every agent (the worker-kill trigger).
    pub generations: &'a AtomicUsize,
    /// Unix time the run started.
    pub run_start: f64,
}

/// One sandbox recovery as the agent saw it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Recovery {
    /// Kill time, seconds since the run started.
    pub at_s: f64,
    /// Turn whose generation started the kill's timer.
    pub turn: usize,
    /// Kill → the shim's recovery record (`belayer status`).
    pub recovered_s: Option<f64>,
    /// Kill → the agent's next action succeeded on the recovered sandbox.
    pub next_action_s: Option<f64>,
    /// Journal position the recovered environment reflects (actions 1..=k; action 1 = setup).
    pub position: Option<u64>,
    pub reflects: String,
    /// Actions the agent re-ran because the restore undid them.
    pub turns_redone: usize,
}

/// What became of one trajectory.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Trajectory {
    pub traj: usize,
    pub container: String,
    pub completed: bool,
    /// The final state equals the expected one.
    pub verified: bool,
    pub lost: Option<String>,
    pub turns_done: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Generation time per turn (the "bubble").
    pub bubble_s: Vec<f64>,
    pub action_s: Vec<f64>,
    /// Connections to the worker lost and retried (a worker died meanwhile).
    pub reconnects: u32,
    pub recoveries: Vec<Recovery>,
    /// Replays from the start in a fresh container (replay mode).
    pub replays: Vec<Replay>,
    pub wall_s: f64,
}

/// One replay of a failed trajectory from its start (what frameworks do without Belayer).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Replay {
    /// Failure noticed, seconds since the run started.
    pub at_s: f64,
    /// The turn whose action (or final check) failed.
    pub failed_turn: usize,
    /// Actions (and their generations) done before the failure, run again.
    pub actions_rerun: usize,
    /// Why it failed.
    pub why: String,
}

/// The init pid of `id` (`ctr tasks ls`).
pub fn init_pid(c: &Containerd, id: &str) -> Option<i32> {
    c.ctr(&["tasks", "ls"])
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}

fn exec(c: &Containerd, id: &str, exec_id: &str, script: &str) -> Out {
    c.sh(id, exec_id, script)
}

fn status(c: &Containerd, id: &str) -> Value {
    serde_json::from_str(&c.belayer(&["status", id]).stdout).unwrap_or_default()
}

struct Agent<'a> {
    ctx: &'a Ctx<'a>,
    id: String,
    traj: usize,
    attempt: usize,
    seen: usize,
    /// Kill times (Unix s) and the turn that armed them, pushed by the killer threads.
    killed: Arc<Mutex<Vec<(f64, usize)>>>,
    /// The schedule's kill of this trajectory was armed (a replay does not arm it again).
    armed: bool,
    out: Trajectory,
}

impl Agent<'_> {
    fn act(&mut self, turn: usize, a: &Action) -> Result<(), String> {
        self.attempt += 1;
        let out = exec(
            self.ctx.c,
            &self.id,
            &format!("t{turn}x{}", self.attempt),
            &a.script,
        );
        if out.code == 0 && out.stdout == a.stdout {
            return Ok(());
        }
        Err(format!(
            "action of turn {turn} exited {} (stdout {:?}, stderr {:?})",
            out.code,
            out.stdout.trim(),
            out.stderr.trim()
        ))
    }

    /// The turns the journal says the environment reflects (successful actions `t{turn}x…`,
    /// counted from turn 1 without gaps).
    fn reflected_turns(&self) -> usize {
        let text = self.ctx.c.belayer(&["journal", &self.id, "--json"]).stdout;
        let mut done: Vec<usize> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["exit_code"] == 0)
            .filter_map(|e| {
                e["exec_id"]
                    .as_str()?
                    .strip_prefix('t')?
                    .split('x')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect();
        done.sort_unstable();
        done.dedup();
        done.iter()
            .enumerate()
            .take_while(|(i, t)| **t == i + 1)
            .count()
    }

    /// After a failed action (Belayer): waits for the shim's recovery, reads the journal
    /// position, re-runs the undone actions before `turn`. Returns the recovery index.
    fn resync(&mut self, turn: usize, why: &str) -> Result<usize, String> {
        let end = Instant::now() + Duration::from_secs(90);
        let recoveries = loop {
            let st = status(self.ctx.c, &self.id);
            let n = st["recoveries"].as_array().map_or(0, Vec::len);
            if n > self.seen {
                break st["recoveries"].clone();
            }
            if Instant::now() > end {
                return Err(format!("{why}; no recovery within 90 s: {st}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let list = recoveries.as_array().cloned().unwrap_or_default();
        let mut index = self.out.recoveries.len();
        for r in &list[self.seen..] {
            let kill = self
                .killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(index)
                .copied();
            self.out.recoveries.push(Recovery {
                at_s: kill.map_or(0.0, |k| k.0 - self.ctx.run_start),
                turn: kill.map_or(turn, |k| k.1),
                position: r["position"]["action"].as_u64(),
                reflects: r["position"]["reflects"].as_str().unwrap_or("").to_string(),
                ..Recovery::default()
            });
            index += 1;
        }
        self.seen = list.len();
        let from = self.reflected_turns();
        for t in from + 1..turn {
            let a = actions::action(self.ctx.seed, self.traj, t);
            // An undone action must produce the output the context already holds.
            self.act(t, &a)
                .map_err(|e| format!("re-running turn {t} after the recovery: {e}"))?;
            self.out.recoveries[index - 1].turns_redone += 1;
        }
        Ok(index - 1)
    }

    /// Runs `turn`'s action, recovering (Belayer) as often as needed.
    fn act_recovering(&mut self, turn: usize, a: &Action) -> Result<(), String> {
        let mut pending: Option<usize> = None;
        for _ in 0..5 {
            match self.act(turn, a) {
                Ok(()) => {
                    if let Some(i) = pending {
                        let r = &mut self.out.recoveries[i];
                        r.next_action_s = Some(now() - self.ctx.run_start - r.at_s);
                    }
                    return Ok(());
                }
                Err(e) if !self.ctx.belayer => return Err(e),
                Err(e) => pending = Some(self.resync(turn, &e)?),
            }
        }
        Err(format!("turn {turn}: still failing after 5 recoveries"))
    }

    fn killer(&self, k: &SandboxKill) -> Option<std::thread::JoinHandle<()>> {
        let pid = init_pid(self.ctx.c, &self.id)?;
        let killed = self.killed.clone();
        let (delay, turn) = (Duration::from_millis(k.delay_ms), k.turn);
        Some(std::thread::spawn(move || {
            std::thread::sleep(delay);
            killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((now(), turn));
            // The failure being injected: the sandbox's init, a process of this benchmark's
            // containerd.
            if let Err(e) = crate::sigkill(pid.into()) {
                eprintln!("sandbox kill at turn {turn}: {e}");
            }
        }))
    }

    /// SIGKILLs the sandbox's init now (the schedule's kill right after an action).
    fn kill_now(&self, turn: usize) {
        if let Some(pid) = init_pid(self.ctx.c, &self.id) {
            self.killed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((now(), turn));
            if let Err(e) = crate::sigkill(pid.into()) {
                eprintln!("sandbox kill after turn {turn}: {e}");
            }
        }
    }

    fn turns(&mut self) -> Result<(), String> {
        let ctx = self.ctx;
        let mut context = actions::tokens(&actions::task(ctx.seed, self.traj));
        let mut killer = None;
        let mut kill_after = None;
        let mut expected_ms = 2000u64;
        for turn in 1..=ctx.turns {
            if let Some(k) = ctx
                .kills
                .iter()
                .find(|k| k.traj == self.traj && k.turn == turn && !self.armed)
            {
                self.armed = true;
                if k.after_action {
                    kill_after = Some(turn);
                } else {
                    killer = self.killer(k);
                }
            }
            let req = GenRequest {
                id: (self.traj as u64) << 16 | turn as u64,
                prompt: context.clone(),
                max_new: ctx.max_new,
                seed: ctx.seed ^ ((self.traj as u64) << 32) ^ turn as u64,
                temperature: 0.7,
                top_k: 40,
            };
            let g = std::thread::scope(|s| {
                if ctx.belayer {
                    let ms = expected_ms.to_string();
                    let id = &self.id;
                    s.spawn(move || {
                        ctx.c
                            .belayer(&["hint", id, "llm-start", "--expected-ms", &ms])
                    });
                }
                ctx.llm.generate(&req)
            })
            .map_err(|e| format!("generation of turn {turn}: {e}"))?;
            ctx.generations.fetch_add(1, Ordering::SeqCst);
            expected_ms = (g.seconds * 1000.0) as u64;
            self.out.bubble_s.push(g.seconds);
            self.out.reconnects += g.reconnects;
            self.out.prompt_tokens += context.len();
            self.out.generated_tokens += g.reply.tokens.len();
            context.extend(&g.reply.tokens);

            let a = actions::action(ctx.seed, self.traj, turn);
            let t = Instant::now();
            self.act_recovering(turn, &a)?;
            self.out.action_s.push(t.elapsed().as_secs_f64());
            self.out.turns_done = turn;
            if kill_after == Some(turn) {
                self.kill_now(turn);
            }
            context.extend(actions::observation(turn, &a, 24));
        }
        // The schedule's kill has fired before the final check.
        if let Some(k) = killer {
            let _ = k.join();
        }
        Ok(())
    }

    /// The final state check (after catching up with a recovery that came after the last turn).
    fn verify(&mut self) -> Result<(), String> {
        let (script, want) = actions::final_state(self.ctx.seed, self.traj, self.ctx.turns);
        for _ in 0..3 {
            self.attempt += 1;
            let out = exec(self.ctx.c, &self.id, &format!("v{}", self.attempt), &script);
            if out.code == 0 && out.stdout == want {
                return Ok(());
            }
            let why = format!(
                "final state differs: got {:?} (exit {}), want {want:?}",
                out.stdout, out.code
            );
            if !self.ctx.belayer {
                return Err(why);
            }
            let turns = self.ctx.turns;
            self.resync(turns + 1, &why)?;
        }
        Err("final state still differs after recoveries".into())
    }

    /// Fills each recovery's kill → recovered time from the shim's records.
    fn finish_recoveries(&mut self) {
        let st = status(self.ctx.c, &self.id);
        let list = st["recoveries"].as_array().cloned().unwrap_or_default();
        let kills = self
            .killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (i, r) in list.iter().enumerate() {
            if i >= self.out.recoveries.len() {
                // Recovered to a state that held everything done: the agent never noticed.
                self.out.recoveries.push(Recovery {
                    at_s: kills.get(i).map_or(0.0, |k| k.0 - self.ctx.run_start),
                    turn: kills.get(i).map_or(0, |k| k.1),
                    position: r["position"]["action"].as_u64(),
                    reflects: r["position"]["reflects"].as_str().unwrap_or("").to_string(),
                    ..Recovery::default()
                });
            }
            if let (Some(at), Some(k)) = (r["at_unix_ms"].as_u64(), kills.get(i)) {
                self.out.recoveries[i].recovered_s = Some(at as f64 / 1000.0 - k.0);
            }
        }
    }
}

/// Runs trajectory `traj` in the started sandbox `id` (setup exec, then the turns, then the
/// final check).
pub fn run(ctx: &Ctx<'_>, traj: usize, id: &str) -> Trajectory {
    let start = Instant::now();
    let mut a = Agent {
        ctx,
        id: id.to_string(),
        traj,
        attempt: 0,
        seen: 0,
        killed: Arc::default(),
        armed: false,
        out: Trajectory {
            traj,
            container: id.to_string(),
            ..Trajectory::default()
        },
    };
    let mut result = a.turns().and_then(|()| {
        a.out.completed = true;
        a.verify()
    });
    // Replay: a failed trajectory runs again from its start in a fresh container, as often as
    // the schedule can make it fail (once per sandbox) and once more.
    while let (true, Err(why)) = (ctx.replay && a.out.replays.len() < 2, &result) {
        a.out.replays.push(Replay {
            at_s: now() - ctx.run_start,
            failed_turn: a.out.turns_done + 1,
            actions_rerun: a.out.turns_done,
            why: why.chars().take(160).collect(),
        });
        a.out.completed = false;
        a.out.turns_done = 0;
        result = fresh_container(ctx.c, id).and_then(|()| {
            a.turns().and_then(|()| {
                a.out.completed = true;
                a.verify()
            })
        });
    }
    match result {
        Ok(()) => a.out.verified = true,
        Err(e) => a.out.lost = Some(e),
    }
    if ctx.belayer {
        a.finish_recoveries();
    } else if let Some(&(k, turn)) = a.killed.lock().unwrap_or_else(|p| p.into_inner()).first() {
        a.out.recoveries.push(Recovery {
            at_s: k - ctx.run_start,
            turn,
            reflects: if ctx.replay {
                "replayed from the start in a fresh container (runc-v2)".into()
            } else {
                "no recovery: runc-v2".into()
            },
            ..Recovery::default()
        });
    }
    a.out.wall_s = start.elapsed().as_secs_f64();
    a.out
}

/// Replaces `id` with a fresh runc container of the same image and runs its setup.
fn fresh_container(c: &Containerd, id: &str) -> Result<(), String> {
    crate::bench::ctrd::remove(c, id);
    crate::episode::Sandbox::start_annotated(c, crate::bench::ctrd::RUNC, id, &[]);
    setup(c, id)
}

/// The setup exec of a sandbox (journal action 1).
pub fn setup(c: &Containerd, id: &str) -> Result<(), String> {
    let out = exec(c, id, "setup", actions::SETUP);
    if out.code != 0 {
        return Err(format!("setup of {id} failed: {out:?}"));
    }
    Ok(())
}
