//! `NodeScheduler` end to end: the checkpoint life cycle, permits, forcing, learning, and random
//! event sequences checked against the invariants.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use scheduler::{
    CheckpointCost, Decision, DeferReason, Expected, Footprint, Hint, NodeScheduler, SchedError,
    SchedulerConfig,
};

fn s(x: f64) -> Duration {
    Duration::from_secs_f64(x)
}

const GIB: u64 = 1 << 30;

fn small() -> Footprint {
    Footprint {
        dirty_bytes: GIB / 10,
        resident_bytes: GIB / 2,
        fs_changed_bytes: 0,
    }
}

/// One turn: exec [t, t+1], then idle; returns the decision at the boundary.
fn turn(n: &mut NodeScheduler, id: &str, t: f64) -> Decision {
    n.on_exec_start(id, s(t));
    n.on_exec_exit(id, s(t + 1.0));
    n.on_footprint(id, small(), s(t + 1.0));
    n.decide(id, s(t + 1.0))
}

#[test]
fn long_gaps_are_used_and_short_ones_deferred() {
    let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
    // Gaps of 10 s: after the first (prior 2 s vs ~0.5 s cost, covers too), every boundary fits.
    let mut t = 0.0;
    for _ in 0..5 {
        let d = turn(&mut n, "a", t);
        assert_eq!(d, Decision::CheckpointNow, "at {t}");
        let cost = CheckpointCost {
            footprint: small(),
            seconds: 0.5,
        };
        n.on_checkpoint_done("a", cost).unwrap();
        t += 11.0;
    }
    // A container whose gaps are 0.2 s never gets an opportunistic checkpoint...
    let mut t = 0.0;
    let mut forced = 0;
    for _ in 0..200 {
        match turn(&mut n, "b", t) {
            Decision::CheckpointNow if t > 20.0 => {
                panic!("opportunistic checkpoint into 0.2 s gaps at {t}")
            }
            Decision::Force => {
                forced += 1;
                n.on_checkpoint_done(
                    "b",
                    CheckpointCost {
                        footprint: small(),
                        seconds: 0.5,
                    },
                )
                .unwrap();
            }
            Decision::CheckpointNow => n.on_checkpoint_failed("b").unwrap(),
            Decision::Defer { .. } => {}
        }
        t += 1.2;
    }
    // ...but one is forced every time 60 s of work are at risk (240 s / 60 s).
    assert!((3..=4).contains(&forced), "forced {forced}");
}

#[test]
fn hints_open_and_close_the_window() {
    let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
    // Teach it short gaps.
    for i in 0..20 {
        let t = i as f64 * 1.3;
        n.on_exec_start("a", s(t));
        n.on_exec_exit("a", s(t + 1.0));
    }
    n.on_exec_start("a", s(26.0));
    n.on_exec_exit("a", s(27.0));
    assert!(matches!(
        n.decide("a", s(27.0)),
        Decision::Defer {
            reason: DeferReason::GapTooShort { .. }
        }
    ));
    n.on_hint(
        "a",
        Hint::LlmStart {
            expected: Some(Expected::Millis(20_000)),
        },
        s(27.1),
    );
    assert_eq!(n.decide("a", s(27.1)), Decision::CheckpointNow);
    n.on_checkpoint_failed("a").unwrap();
    n.on_hint("a", Hint::LlmEnd, s(31.0));
    assert!(matches!(
        n.decide("a", s(31.0)),
        Decision::Defer {
            reason: DeferReason::GapTooShort { .. }
        }
    ));
}

#[test]
fn permits_bound_concurrency_and_forced_waiters_go_first() {
    let cfg = SchedulerConfig {
        max_concurrent: 1,
        risk_bound_s: 30.0,
        ..Default::default()
    };
    let mut n = NodeScheduler::new(cfg).unwrap();
    assert_eq!(turn(&mut n, "a", 0.0), Decision::CheckpointNow);
    assert_eq!(
        turn(&mut n, "b", 0.0),
        Decision::Defer {
            reason: DeferReason::NodeBusy { forced: false }
        }
    );
    assert_eq!(n.begin_manual("c", s(1.0)), Err(SchedError::NodeBusy(1)));
    // b accumulates risk and waits for a forced checkpoint.
    assert_eq!(
        turn(&mut n, "b", 40.0),
        Decision::Defer {
            reason: DeferReason::NodeBusy { forced: true }
        }
    );
    n.on_checkpoint_done(
        "a",
        CheckpointCost {
            footprint: small(),
            seconds: 1.0,
        },
    )
    .unwrap();
    // The freed permit is reserved for b: c's opportunistic checkpoint must wait.
    assert_eq!(
        turn(&mut n, "c", 41.0),
        Decision::Defer {
            reason: DeferReason::NodeBusy { forced: false }
        }
    );
    assert_eq!(n.idle_candidates(s(42.0))[0], "b");
    assert_eq!(n.decide("b", s(42.0)), Decision::Force);
    assert_eq!(n.in_flight(), 1);
    n.remove_container("b");
    assert_eq!(n.in_flight(), 0);
}

#[test]
fn life_cycle_errors() {
    let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
    let cost = CheckpointCost {
        footprint: small(),
        seconds: 1.0,
    };
    assert_eq!(
        n.on_checkpoint_done("x", cost),
        Err(SchedError::NotInFlight("x".into()))
    );
    n.begin_manual("x", s(0.0)).unwrap();
    assert_eq!(
        n.begin_manual("x", s(0.0)),
        Err(SchedError::AlreadyInFlight("x".into()))
    );
    assert_eq!(
        n.decide("x", s(0.0)),
        Decision::Defer {
            reason: DeferReason::CheckpointInFlight
        }
    );
    n.on_checkpoint_done("x", cost).unwrap();
    assert_eq!(
        n.on_checkpoint_failed("x"),
        Err(SchedError::NotInFlight("x".into()))
    );
    assert_eq!(n.cost_model().observations(), 1);
}

#[test]
fn risk_restarts_at_the_checkpoint_start_and_after_restore() {
    let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
    n.on_container_start("a", s(0.0));
    assert_eq!(turn(&mut n, "a", 10.0), Decision::CheckpointNow);
    n.on_checkpoint_done(
        "a",
        CheckpointCost {
            footprint: small(),
            seconds: 3.0,
        },
    )
    .unwrap();
    assert_eq!(n.work_at_risk("a", s(20.0)), Some(9.0));
    n.on_restored("a", s(30.0));
    assert_eq!(n.work_at_risk("a", s(31.0)), Some(1.0));
    assert_eq!(
        n.decide("a", s(31.0)),
        Decision::Defer {
            reason: DeferReason::NothingNew
        }
    );
}

#[test]
fn cost_model_learns_from_done_checkpoints() {
    let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
    let big = Footprint {
        dirty_bytes: 4 * GIB,
        resident_bytes: 8 * GIB,
        fs_changed_bytes: GIB,
    };
    n.on_container_start("a", s(0.0));
    n.on_footprint("a", big, s(0.0));
    let before = n.predict_cost("a").mean_s;
    for i in 0..30 {
        n.begin_manual("a", s(i as f64)).unwrap();
        n.on_checkpoint_done(
            "a",
            CheckpointCost {
                footprint: big,
                seconds: 20.0,
            },
        )
        .unwrap();
    }
    let after = n.predict_cost("a").mean_s;
    assert!(
        before < 8.0 && (after - 20.0).abs() < 1.0,
        "{before} → {after}"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Start(usize),
    Exit(usize),
    Hint(usize, Option<u64>),
    LlmEnd(usize),
    Decide(usize),
    Done(usize, f64),
    Failed(usize),
    Manual(usize),
    Remove(usize),
    Advance(f64),
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0usize..5;
    prop_oneof![
        1 => c.clone().prop_map(Op::Start),
        1 => c.clone().prop_map(Op::Exit),
        1 => (c.clone(), prop::option::of(0u64..30_000)).prop_map(|(c, e)| Op::Hint(c, e)),
        1 => c.clone().prop_map(Op::LlmEnd),
        3 => c.clone().prop_map(Op::Decide),
        1 => (c.clone(), 0.0f64..10.0).prop_map(|(c, x)| Op::Done(c, x)),
        1 => c.clone().prop_map(Op::Failed),
        1 => c.clone().prop_map(Op::Manual),
        1 => c.prop_map(Op::Remove),
        2 => (0.0f64..30.0).prop_map(Op::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn invariants_hold_under_any_event_order(
        ops in prop::collection::vec(op(), 1..300),
        max_concurrent in 1u32..4,
        risk_bound_s in 5.0f64..100.0,
    ) {
        let cfg = SchedulerConfig { max_concurrent, risk_bound_s, ..Default::default() };
        let mut n = NodeScheduler::new(cfg.clone()).unwrap();
        let ids = ["a", "b", "c", "d", "e"];
        let mut t = 0.0;
        let mut running = [0u32; 5];
        let mut ours: HashMap<usize, f64> = HashMap::new();
        // Containers registered (by an exec start or a manual checkpoint) and not removed since.
        let mut known = [false; 5];
        for op in ops {
            match op {
                Op::Start(c) => { n.on_exec_start(ids[c], s(t)); running[c] += 1; known[c] = true; }
                Op::Exit(c) => { n.on_exec_exit(ids[c], s(t)); running[c] = running[c].saturating_sub(1); }
                Op::Hint(c, e) => n.on_hint(ids[c], Hint::LlmStart { expected: e.map(Expected::Millis) }, s(t)),
                Op::LlmEnd(c) => n.on_hint(ids[c], Hint::LlmEnd, s(t)),
                Op::Advance(dt) => t += dt,
                Op::Manual(c) => {
                    if n.begin_manual(ids[c], s(t)).is_ok() {
                        prop_assert!(ours.insert(c, t).is_none());
                        known[c] = true;
                    }
                }
                Op::Remove(c) => {
                    n.remove_container(ids[c]);
                    ours.remove(&c);
                    running[c] = 0;
                    known[c] = false;
                }
                Op::Done(c, x) => {
                    let r = n.on_checkpoint_done(ids[c], CheckpointCost { footprint: small(), seconds: x });
                    let started = ours.remove(&c);
                    prop_assert_eq!(r.is_ok(), started.is_some());
                    if let Some(t0) = started {
                        // Risk restarts at the checkpoint's start.
                        let risk = n.work_at_risk(ids[c], s(t)).unwrap();
                        prop_assert!((risk - (t - t0)).abs() < 1e-6, "risk {risk} start {t0} now {t}");
                    }
                }
                Op::Failed(c) => prop_assert_eq!(n.on_checkpoint_failed(ids[c]).is_ok(), ours.remove(&c).is_some()),
                Op::Decide(c) => {
                    let free_before = n.permits_free();
                    let risk = n.work_at_risk(ids[c], s(t));
                    let gap = n.predict_gap(ids[c], s(t)).remaining_s;
                    let cost = n.predict_cost(ids[c]).upper_s;
                    let d = n.decide(ids[c], s(t));
                    match d {
                        Decision::CheckpointNow => {
                            prop_assert!(gap >= cost, "gap {gap} < cost {cost}");
                            prop_assert!(risk.unwrap_or(0.0) < risk_bound_s);
                        }
                        Decision::Force => prop_assert!(risk.unwrap() >= risk_bound_s),
                        Decision::Defer { reason } => {
                            // Force always fires past the bound at a free boundary.
                            let past = risk.is_some_and(|r| r >= risk_bound_s);
                            if past && free_before > 0 && running[c] == 0 && !ours.contains_key(&c) {
                                prop_assert_eq!(reason, DeferReason::NothingNew);
                            }
                        }
                    }
                    if !known[c] {
                        prop_assert_eq!(d, Decision::Defer { reason: DeferReason::NothingNew });
                    }
                    if d.is_checkpoint() {
                        prop_assert!(running[c] == 0);
                        prop_assert!(ours.insert(c, t).is_none());
                    }
                }
            }
            prop_assert!(n.in_flight() <= max_concurrent);
            prop_assert_eq!(n.in_flight() as usize, ours.len());
            // Only the registering events create an entry; no later event re-creates a removed one.
            for (c, id) in ids.iter().enumerate() {
                prop_assert_eq!(n.work_at_risk(id, s(t)).is_some(), known[c], "{}", id);
            }
        }
    }
}
