//! Discrete-event simulation of one node's episodes under one checkpoint policy.
//!
//! Each episode alternates idle gaps (the model generating) and actions (execs). A synchronous
//! checkpoint holds the action's result back from the agent until it is written; an asynchronous
//! one freezes the container, so an exec requested before it finishes waits for it. Checkpoints
//! take a node permit; at most `max_concurrent` run at once. A checkpoint a policy wants while
//! no permit is free is retried, for every policy alike, when one frees while the container is
//! in a gap (Belayer's through its idle candidates, every-k's through a pending mark).
//! Failures do not perturb the timeline: work lost is evaluated against the failure-free run.
//! The policy sees the footprint the shim feeds it ([`Feed`]); the machine's true cost uses
//! the exact one.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use scheduler::{
    CheckpointCost, Decision, DeferReason, Expected, Footprint, Hint, NodeScheduler,
    SchedulerConfig,
};

mod machine;
mod outcome;
mod policy;

pub use machine::TrueCost;
pub use outcome::Outcome;
pub use policy::Policy;

use crate::bench::sched::rng::{Rng, mix};
use crate::bench::sched::trace::Episode;
use outcome::{lost_integral, state_at};

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
    /// What the policy is told of a footprint.
    pub feed: Feed,
}

/// What the policy under test is told of a container's footprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Feed {
    /// What the shim feeds today: the resident set (RSS) as both dirty and resident bytes,
    /// nothing for the filesystem.
    Rss,
    /// The exact dirty, resident and filesystem bytes (a simulator-only oracle).
    Exact,
}

impl Feed {
    /// How the record names it.
    pub fn describe(self) -> &'static str {
        match self {
            Feed::Rss => "rss (as the shim feeds: RSS for dirty and resident, 0 for files)",
            Feed::Exact => "exact (dirty, resident and file bytes: an oracle)",
        }
    }

    /// `exact` as this feed reports it.
    pub fn view(self, exact: Footprint) -> Footprint {
        match self {
            Feed::Exact => exact,
            Feed::Rss => Footprint {
                dirty_bytes: exact.resident_bytes,
                resident_bytes: exact.resident_bytes,
                fs_changed_bytes: 0,
            },
        }
    }
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
    /// An every-k checkpoint in the gap was due but found no permit: retried when one frees.
    pending: bool,
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
            pending: false,
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
        let fp = self.setup.feed.view(self.footprint(i));
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
            Policy::Every { k, sync: true } if next.is_multiple_of(k) => {
                self.c[i].phase = Phase::Sync { since: t };
                if self.in_flight < self.setup.cfg.max_concurrent {
                    self.start_ckpt(i, t, false);
                } else {
                    self.queue.push_back(i);
                }
            }
            Policy::Every { k, sync: false } if next.is_multiple_of(k) => {
                self.begin_gap(i, t);
                self.c[i].pending = true;
                self.retry(i, t);
            }
            Policy::Every { .. } => {
                self.begin_gap(i, t);
                self.retry(i, t);
            }
            Policy::Belayer { .. } => {
                self.begin_gap(i, t);
                self.try_decide(i, t);
            }
        }
    }

    /// Starts container `i`'s pending every-k checkpoint if it is in a gap, has none running
    /// and a permit is free.
    fn retry(&mut self, i: usize, t: f64) {
        let c = &self.c[i];
        if c.pending
            && c.phase == Phase::Gap
            && c.ckpt.is_none()
            && self.in_flight < self.setup.cfg.max_concurrent
        {
            self.c[i].pending = false;
            self.start_ckpt(i, t, false);
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
                footprint: self.setup.feed.view(f.footprint),
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
        for j in 0..self.c.len() {
            self.retry(j, t);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sched::trace::Turn;

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
            feed: Feed::Exact,
        }
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
    fn an_async_checkpoint_without_a_permit_is_retried() {
        let cfg = SchedulerConfig {
            max_concurrent: 1,
            ..SchedulerConfig::default()
        };
        let truth = TrueCost {
            intercept_s: 1.0,
            noise_sigma: 0.0,
            contention: 0.0,
            ..Default::default()
        };
        // Two containers finish their actions together; one permit: the second waits for the
        // first's checkpoint (1 s) and then takes its own, within its 5 s gap.
        let mut b = episode(&[5.0, 5.0]);
        b.id = "f".into();
        let o = run(
            &[episode(&[5.0, 5.0]), b],
            Policy::Every { k: 1, sync: false },
            &setup(&cfg, &truth),
        );
        assert_eq!((o.checkpoints, o.visible_s), (2, 0.0));
    }

    #[test]
    fn the_rss_feed_hides_dirty_and_file_bytes() {
        let fp = Footprint {
            dirty_bytes: 1,
            resident_bytes: 10,
            fs_changed_bytes: 5,
        };
        let v = Feed::Rss.view(fp);
        assert_eq!(
            (v.dirty_bytes, v.resident_bytes, v.fs_changed_bytes),
            (10, 10, 0)
        );
        assert_eq!(Feed::Exact.view(fp).fs_changed_bytes, 5);
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

    #[test]
    fn synthetic_nodes_order_the_policies_as_expected() {
        let cfg = SchedulerConfig::default();
        let truth = TrueCost::default();
        let total = |p: Policy| {
            let mut o = Outcome::default();
            for n in 0..8 {
                let eps = crate::bench::sched::synth::node(
                    3,
                    n,
                    4,
                    &crate::bench::sched::synth::Shape::default(),
                );
                o.add(&run(
                    &eps,
                    p,
                    &Setup {
                        seed: n,
                        ..setup(&cfg, &truth)
                    },
                ));
            }
            o
        };
        let hints = total(Policy::Belayer { hints: true });
        let plain = total(Policy::Belayer { hints: false });
        let sync = total(Policy::Every { k: 1, sync: true });
        let asyn = total(Policy::Every { k: 1, sync: false });
        let never = total(Policy::Never);
        assert!(hints.overhead_pct() < asyn.overhead_pct());
        assert!(plain.overhead_pct() < asyn.overhead_pct());
        assert!(asyn.overhead_pct() < sync.overhead_pct());
        assert!(plain.lost_per_failure_s() < never.lost_per_failure_s() / 5.0);
        assert!(hints.lost_per_failure_s() < 1.5 * sync.lost_per_failure_s());
        assert_eq!(never.checkpoints, 0);
    }
}
