//! Discrete-event simulation of one node's episodes under one checkpoint policy.
//!
//! Each episode alternates idle gaps (the model generating) and actions (execs). A synchronous
//! checkpoint holds the action's result back from the agent until it is written; an asynchronous
//! one freezes the container, so an exec requested before it finishes waits for it. Checkpoints
//! take a node permit; at most `max_concurrent` run at once. Failures do not perturb the
//! timeline: work lost is evaluated against the failure-free run.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use scheduler::{
    CheckpointCost, Decision, DeferReason, Expected, Footprint, Hint, NodeScheduler,
    SchedulerConfig,
};

use crate::rng::{Rng, mix};
use crate::trace::Episode;

const GIB: f64 = (1u64 << 30) as f64;

/// A checkpoint policy under comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    /// The scheduler crate's policy; with or without the agent loop's hints.
    Belayer {
        /// Whether `llm-start`/`llm-end` hints are sent.
        hints: bool,
    },
    /// A checkpoint after every `k`-th action.
    Every {
        /// Period in actions.
        k: u32,
        /// Synchronous (the agent waits) or in the gap (skipped when no permit is free).
        sync: bool,
    },
    /// No checkpoints.
    Never,
}

impl Policy {
    /// Its name in tables and plots.
    pub fn name(&self) -> String {
        match *self {
            Policy::Belayer { hints: false } => "belayer".into(),
            Policy::Belayer { hints: true } => "belayer+hints".into(),
            Policy::Every { k: 1, sync: true } => "every-turn".into(),
            Policy::Every { k: 1, sync: false } => "every-turn-async".into(),
            Policy::Every { k, sync: true } => format!("every-{k}"),
            Policy::Every { k, sync: false } => format!("every-{k}-async"),
            Policy::Never => "never".into(),
        }
    }
}

/// The simulated machine's true checkpoint cost, unknown to the policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrueCost {
    /// Fixed seconds per checkpoint.
    pub intercept_s: f64,
    /// Seconds per GiB dirtied since the last checkpoint.
    pub s_per_gib_dirty: f64,
    /// Seconds per GiB resident.
    pub s_per_gib_resident: f64,
    /// Seconds per GiB of files changed since the last checkpoint.
    pub s_per_gib_fs: f64,
    /// Log-space σ of multiplicative noise.
    pub noise_sigma: f64,
    /// Slow-down per other checkpoint running at the same time (shared disk and cores).
    pub contention: f64,
}

impl Default for TrueCost {
    fn default() -> Self {
        Self {
            intercept_s: 0.4,
            s_per_gib_dirty: 1.0,
            s_per_gib_resident: 0.5,
            s_per_gib_fs: 2.0,
            noise_sigma: 0.2,
            contention: 0.5,
        }
    }
}

impl TrueCost {
    fn seconds(&self, fp: &Footprint, others: u32, rng: &mut Rng) -> f64 {
        let gib = |b: u64| b as f64 / GIB;
        let base = self.intercept_s
            + self.s_per_gib_dirty * gib(fp.dirty_bytes)
            + self.s_per_gib_resident * gib(fp.resident_bytes)
            + self.s_per_gib_fs * gib(fp.fs_changed_bytes);
        base * rng.lognormal(1.0, self.noise_sigma) * (1.0 + self.contention * f64::from(others))
    }
}

/// Totals of one run; add runs up with [`Outcome::add`].
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Outcome {
    /// Episodes.
    pub episodes: u64,
    /// Actions executed.
    pub actions: u64,
    /// Σ of gaps and actions: the episodes' length with no checkpointing, seconds.
    pub base_s: f64,
    /// Time the agent loops waited for checkpoints, seconds.
    pub visible_s: f64,
    /// Σ of episode wall times, seconds (container-time exposed to failures).
    pub exposure_s: f64,
    /// ∫ over exposure of the work a failure at that instant loses, seconds².
    pub lost_integral: f64,
    /// Failures sampled (Poisson).
    pub failures: u64,
    /// Work they lost, seconds.
    pub failure_lost_s: f64,
    /// Checkpoints taken.
    pub checkpoints: u64,
    /// Of which forced by the risk bound.
    pub forced: u64,
    /// Σ of checkpoint durations, seconds.
    pub checkpoint_s: f64,
}

impl Outcome {
    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &Outcome) {
        self.episodes += o.episodes;
        self.actions += o.actions;
        self.base_s += o.base_s;
        self.visible_s += o.visible_s;
        self.exposure_s += o.exposure_s;
        self.lost_integral += o.lost_integral;
        self.failures += o.failures;
        self.failure_lost_s += o.failure_lost_s;
        self.checkpoints += o.checkpoints;
        self.forced += o.forced;
        self.checkpoint_s += o.checkpoint_s;
    }

    /// Visible overhead, percent of the checkpoint-free length.
    pub fn overhead_pct(&self) -> f64 {
        100.0 * self.visible_s / self.base_s.max(1e-9)
    }

    /// Expected work lost per failure, seconds (failure instant uniform over exposure).
    pub fn lost_per_failure_s(&self) -> f64 {
        self.lost_integral / self.exposure_s.max(1e-9)
    }
}

/// Parameters of a run besides the policy.
#[derive(Debug, Clone)]
pub struct Setup<'a> {
    /// Scheduler configuration (its `max_concurrent` bounds every policy).
    pub cfg: &'a SchedulerConfig,
    /// The machine's true checkpoint cost.
    pub truth: &'a TrueCost,
    /// Poisson failure rate per container-hour, for the sampled failures.
    pub failures_per_h: f64,
    /// Seed of the cost noise and the failures (the same for every policy).
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    NotStarted,
    Gap,
    /// The exec was requested at `since` and waits for the container's checkpoint.
    Blocked {
        since: f64,
    },
    Running,
    /// A synchronous checkpoint after the action that exited at `since` (queued or running).
    Sync {
        since: f64,
    },
    Finished,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    start: f64,
    footprint: Footprint,
}

struct Ctr<'a> {
    ep: &'a Episode,
    next: usize,
    phase: Phase,
    ckpt: Option<InFlight>,
    dirty: u64,
    fs: u64,
    resident: u64,
    /// Completed checkpoints: (state time, done time).
    done: Vec<(f64, f64)>,
    start: f64,
    end: f64,
    /// Gaps begun so far (tells a recheck whether its gap is still the current one).
    gap_no: u64,
    rng: Rng,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Start(usize),
    GapEnd(usize),
    ExecExit(usize),
    CkptDone(usize),
    /// Re-decide in the container's gap number `.1`, as the scheduler asked.
    Recheck(usize, u64),
}

struct Item {
    t: f64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Item {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Item {}
impl PartialOrd for Item {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Item {
    /// Reversed: the heap pops the earliest event, ties in scheduling order.
    fn cmp(&self, o: &Self) -> Ordering {
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}

struct Sim<'a> {
    policy: Policy,
    setup: &'a Setup<'a>,
    sched: NodeScheduler,
    heap: BinaryHeap<Item>,
    seq: u64,
    c: Vec<Ctr<'a>>,
    index: HashMap<String, usize>,
    in_flight: u32,
    queue: VecDeque<usize>,
    out: Outcome,
}

fn d(t: f64) -> Duration {
    Duration::from_secs_f64(t.max(0.0))
}

/// Runs one node's `episodes` under `policy`.
pub fn run(episodes: &[Episode], policy: Policy, setup: &Setup<'_>) -> Outcome {
    let mut sim = Sim {
        policy,
        setup,
        sched: NodeScheduler::new(setup.cfg.clone()).expect("config validated by the caller"),
        heap: BinaryHeap::new(),
        seq: 0,
        c: Vec::new(),
        index: HashMap::new(),
        in_flight: 0,
        queue: VecDeque::new(),
        out: Outcome::default(),
    };
    for (i, ep) in episodes
        .iter()
        .enumerate()
        .filter(|(_, e)| !e.turns.is_empty())
    {
        let idx = sim.c.len();
        sim.index.insert(ep.id.clone(), idx);
        sim.c.push(Ctr {
            ep,
            next: 0,
            phase: Phase::NotStarted,
            ckpt: None,
            dirty: 0,
            fs: 0,
            resident: 0,
            done: Vec::new(),
            start: ep.start_s,
            end: ep.start_s,
            gap_no: 0,
            rng: Rng::new(mix(&[setup.seed, i as u64, 0x636f_7374])),
        });
        sim.at(ep.start_s, Ev::Start(idx));
    }
    while let Some(Item { t, ev, .. }) = sim.heap.pop() {
        match ev {
            Ev::Start(i) => sim.start(i, t),
            Ev::GapEnd(i) => sim.gap_end(i, t),
            Ev::ExecExit(i) => sim.exec_exit(i, t),
            Ev::CkptDone(i) => sim.ckpt_done(i, t),
            Ev::Recheck(i, gap_no) => {
                let c = &sim.c[i];
                if c.phase == Phase::Gap && c.gap_no == gap_no && c.ckpt.is_none() {
                    sim.try_decide(i, t);
                }
            }
        }
    }
    sim.finish()
}

impl<'a> Sim<'a> {
    fn at(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item {
            t,
            seq: self.seq,
            ev,
        });
    }

    fn id(&self, i: usize) -> &'a str {
        &self.c[i].ep.id
    }

    fn hints(&self) -> bool {
        self.policy == Policy::Belayer { hints: true }
    }

    fn start(&mut self, i: usize, t: f64) {
        self.sched.on_container_start(self.id(i), d(t));
        self.begin_gap(i, t);
    }

    fn begin_gap(&mut self, i: usize, t: f64) {
        let turn = &self.c[i].ep.turns[self.c[i].next];
        if let (true, Some(ms)) = (self.hints(), turn.hint_ms) {
            let hint = Hint::LlmStart {
                expected: Some(Expected::Millis(ms)),
            };
            self.sched.on_hint(self.id(i), hint, d(t));
        }
        self.c[i].phase = Phase::Gap;
        self.c[i].gap_no += 1;
        self.at(t + turn.llm_s, Ev::GapEnd(i));
    }

    fn gap_end(&mut self, i: usize, t: f64) {
        let turn = &self.c[i].ep.turns[self.c[i].next];
        if self.hints() && turn.hint_ms.is_some() {
            self.sched.on_hint(self.id(i), Hint::LlmEnd, d(t));
        }
        self.sched.on_exec_start(self.id(i), d(t));
        if self.c[i].ckpt.is_some() {
            self.c[i].phase = Phase::Blocked { since: t };
        } else {
            self.run_exec(i, t);
        }
    }

    fn run_exec(&mut self, i: usize, t: f64) {
        self.c[i].phase = Phase::Running;
        let action_s = self.c[i].ep.turns[self.c[i].next].action_s;
        self.at(t + action_s, Ev::ExecExit(i));
    }

    fn exec_exit(&mut self, i: usize, t: f64) {
        let c = &mut self.c[i];
        let turn = &c.ep.turns[c.next];
        c.dirty += turn.dirty_bytes;
        c.fs += turn.fs_bytes;
        c.resident = turn.resident_bytes.unwrap_or(c.resident);
        c.next += 1;
        self.out.actions += 1;
        let fp = self.footprint(i);
        self.sched.on_exec_exit(self.id(i), d(t));
        self.sched.on_footprint(self.id(i), fp, d(t));
        let c = &mut self.c[i];
        if c.next == c.ep.turns.len() {
            c.phase = Phase::Finished;
            c.end = t;
            return;
        }
        let next = c.next as u32;
        match self.policy {
            Policy::Never => self.begin_gap(i, t),
            Policy::Every { k, sync: true } if next % k == 0 => {
                self.c[i].phase = Phase::Sync { since: t };
                if self.in_flight < self.setup.cfg.max_concurrent {
                    self.start_ckpt(i, t, false);
                } else {
                    self.queue.push_back(i);
                }
            }
            Policy::Every { k, sync: false } if next % k == 0 => {
                self.begin_gap(i, t);
                if self.in_flight < self.setup.cfg.max_concurrent {
                    self.start_ckpt(i, t, false);
                }
            }
            Policy::Every { .. } => self.begin_gap(i, t),
            Policy::Belayer { .. } => {
                self.begin_gap(i, t);
                self.try_decide(i, t);
            }
        }
    }

    fn footprint(&self, i: usize) -> Footprint {
        let c = &self.c[i];
        Footprint {
            dirty_bytes: c.dirty,
            resident_bytes: c.resident,
            fs_changed_bytes: c.fs,
        }
    }

    fn try_decide(&mut self, i: usize, t: f64) {
        match self.sched.decide(self.id(i), d(t)) {
            Decision::CheckpointNow => self.start_ckpt(i, t, false),
            Decision::Force => self.start_ckpt(i, t, true),
            Decision::Defer {
                reason:
                    DeferReason::GapTooShort {
                        recheck_at: Some(at),
                        ..
                    },
            } => {
                let gap_no = self.c[i].gap_no;
                let at = at.as_secs_f64();
                debug_assert!(at > t, "recheck at {at} ≤ now {t}");
                if at > t {
                    self.at(at, Ev::Recheck(i, gap_no));
                }
            }
            Decision::Defer { .. } => {}
        }
    }

    fn start_ckpt(&mut self, i: usize, t: f64, forced: bool) {
        let footprint = self.footprint(i);
        let others = self.in_flight;
        let c = &mut self.c[i];
        let cost = self.setup.truth.seconds(&footprint, others, &mut c.rng);
        c.ckpt = Some(InFlight {
            start: t,
            footprint,
        });
        c.dirty = 0;
        c.fs = 0;
        self.in_flight += 1;
        debug_assert!(self.in_flight <= self.setup.cfg.max_concurrent);
        self.out.checkpoints += 1;
        self.out.forced += u64::from(forced);
        self.out.checkpoint_s += cost;
        self.at(t + cost, Ev::CkptDone(i));
    }

    fn ckpt_done(&mut self, i: usize, t: f64) {
        let f = self.c[i].ckpt.take().expect("a checkpoint in flight");
        self.in_flight -= 1;
        self.c[i].done.push((f.start, t));
        if matches!(self.policy, Policy::Belayer { .. }) {
            let cost = CheckpointCost {
                footprint: f.footprint,
                seconds: t - f.start,
            };
            self.sched
                .on_checkpoint_done(self.id(i), cost)
                .expect("the scheduler began it");
        }
        match self.c[i].phase {
            Phase::Blocked { since } => {
                self.out.visible_s += t - since;
                self.run_exec(i, t);
            }
            Phase::Sync { since } => {
                self.out.visible_s += t - since;
                self.begin_gap(i, t);
            }
            _ => {}
        }
        if let Some(j) = self.queue.pop_front() {
            self.start_ckpt(j, t, false);
        }
        if matches!(self.policy, Policy::Belayer { .. }) {
            for id in self.sched.idle_candidates(d(t)) {
                if self.sched.permits_free() == 0 {
                    break;
                }
                let j = self.index[&id];
                if self.c[j].phase == Phase::Gap {
                    self.try_decide(j, t);
                }
            }
        }
    }

    fn finish(self) -> Outcome {
        let mut out = self.out;
        for (i, c) in self.c.iter().enumerate() {
            out.episodes += 1;
            out.base_s += c.ep.turns.iter().map(|t| t.llm_s + t.action_s).sum::<f64>();
            out.exposure_s += c.end - c.start;
            out.lost_integral += lost_integral(c.start, c.end, &c.done);
            let mut rng = Rng::new(mix(&[self.setup.seed, i as u64, 0x6661_696c]));
            let n = rng.poisson(self.setup.failures_per_h / 3600.0 * (c.end - c.start));
            for _ in 0..n {
                let u = c.start + rng.unit() * (c.end - c.start);
                out.failures += 1;
                out.failure_lost_s += u - state_at(c.start, u, &c.done);
            }
        }
        out
    }
}

/// The state a restore at `u` returns to: the newest completed checkpoint's, else the start.
fn state_at(start: f64, u: f64, done: &[(f64, f64)]) -> f64 {
    done.iter()
        .filter(|&&(_, d)| d <= u)
        .map(|&(s, _)| s)
        .fold(start, f64::max)
}

/// ∫ from `start` to `end` of (u − state_at(u)) du.
fn lost_integral(start: f64, end: f64, done: &[(f64, f64)]) -> f64 {
    let mut by_done: Vec<(f64, f64)> = done.iter().copied().filter(|&(_, d)| d < end).collect();
    by_done.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (mut a, mut s, mut total) = (start, start, 0.0);
    let seg = |a: f64, b: f64, s: f64| ((b - s).powi(2) - (a - s).powi(2)) / 2.0;
    for (state, d) in by_done {
        if d > a {
            total += seg(a, d, s);
            a = d;
        }
        s = s.max(state);
    }
    total + seg(a, end.max(a), s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::Turn;

    fn episode(gaps: &[f64]) -> Episode {
        Episode {
            id: "e".into(),
            start_s: 0.0,
            turns: gaps
                .iter()
                .map(|&g| Turn {
                    episode: "e".into(),
                    start_s: None,
                    llm_s: g,
                    action_s: 1.0,
                    dirty_bytes: 0,
                    resident_bytes: Some(0),
                    fs_bytes: 0,
                    hint_ms: Some((g * 1e3) as u64),
                })
                .collect(),
        }
    }

    fn setup<'a>(cfg: &'a SchedulerConfig, truth: &'a TrueCost) -> Setup<'a> {
        Setup {
            cfg,
            truth,
            failures_per_h: 0.0,
            seed: 1,
        }
    }

    #[test]
    fn lost_integral_by_hand() {
        // No checkpoint over [0, 10]: ∫u du = 50.
        assert_eq!(lost_integral(0.0, 10.0, &[]), 50.0);
        // Checkpoint of the state at 4, done at 5: ∫0..5 u du + ∫5..10 (u−4) du = 12.5 + 17.5.
        assert_eq!(lost_integral(0.0, 10.0, &[(4.0, 5.0)]), 30.0);
        assert_eq!(state_at(0.0, 4.5, &[(4.0, 5.0)]), 0.0);
        assert_eq!(state_at(0.0, 5.5, &[(4.0, 5.0)]), 4.0);
    }

    #[test]
    fn baselines_by_hand() {
        let cfg = SchedulerConfig::default();
        let truth = TrueCost {
            intercept_s: 0.5,
            noise_sigma: 0.0,
            ..Default::default()
        };
        let s = setup(&cfg, &truth);
        let ep = [episode(&[2.0, 2.0, 2.0])];
        let never = run(&ep, Policy::Never, &s);
        assert_eq!(
            (never.base_s, never.visible_s, never.checkpoints),
            (9.0, 0.0, 0)
        );
        assert_eq!(never.exposure_s, 9.0);
        // Synchronous after actions 1 and 2 (not after the last): 2 × 0.5 s visible.
        let sync = run(&ep, Policy::Every { k: 1, sync: true }, &s);
        assert_eq!(
            (sync.visible_s, sync.checkpoints, sync.exposure_s),
            (1.0, 2, 10.0)
        );
        // In the gap: 0.5 s < 2 s gaps, nothing visible.
        let asyn = run(&ep, Policy::Every { k: 1, sync: false }, &s);
        assert_eq!((asyn.visible_s, asyn.checkpoints), (0.0, 2));
        assert!(asyn.lost_per_failure_s() < never.lost_per_failure_s());
    }

    #[test]
    fn async_checkpoint_longer_than_the_gap_is_visible() {
        let cfg = SchedulerConfig::default();
        let truth = TrueCost {
            intercept_s: 3.0,
            noise_sigma: 0.0,
            ..Default::default()
        };
        let o = run(
            &[episode(&[1.0, 1.0, 1.0])],
            Policy::Every { k: 1, sync: false },
            &setup(&cfg, &truth),
        );
        assert!((o.visible_s - 2.0 * 2.0).abs() < 1e-9);
    }

    #[test]
    fn belayer_skips_short_gaps_and_uses_long_ones() {
        let cfg = SchedulerConfig::default();
        let truth = TrueCost {
            intercept_s: 1.0,
            noise_sigma: 0.0,
            ..Default::default()
        };
        let mut gaps = vec![0.1; 20];
        gaps.extend([10.0; 5]);
        let o = run(
            &[episode(&gaps)],
            Policy::Belayer { hints: true },
            &setup(&cfg, &truth),
        );
        assert_eq!(o.visible_s, 0.0);
        assert!(o.checkpoints >= 4, "{o:?}");
    }
}
