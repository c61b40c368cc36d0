//! The node-wide scheduler the shim holds: per-container state, the node's gap prior and cost
//! model, and the permit counter bounding concurrent checkpoints.

use std::collections::HashMap;
use std::time::Duration;

use crate::config::{ConfigError, SchedulerConfig};
use crate::cost::{CheckpointCost, CostEstimate, CostModel, Footprint};
use crate::gap::{GapPrediction, GapTracker, Hint};
use crate::policy::{self, Decision, DeferReason, PolicyInput};
use crate::quantile::QuantileWindow;

/// A misuse of the checkpoint life cycle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchedError {
    /// `on_checkpoint_done`/`on_checkpoint_failed` without a checkpoint begun for the container.
    #[error("container {0:?} has no checkpoint in flight")]
    NotInFlight(String),
    /// `begin_manual` while the container already has a checkpoint in flight.
    #[error("container {0:?} already has a checkpoint in flight")]
    AlreadyInFlight(String),
    /// `begin_manual` while every node permit is held.
    #[error("all {0} node checkpoint permits are in use")]
    NodeBusy(u32),
}

#[derive(Debug, Clone)]
struct Container {
    gaps: GapTracker,
    /// Time of the state the newest completed checkpoint holds (first event if none).
    state_at: f64,
    actions_total: u64,
    actions_at_state: u64,
    footprint: Option<Footprint>,
    /// Start time and action count of the checkpoint in flight.
    in_flight: Option<(f64, u64)>,
    pending_force: bool,
}

/// Scheduling state for every container on a node. All methods are pure bookkeeping: the
/// caller passes time as a [`Duration`] since any fixed monotonic origin (the same for all calls)
/// and performs the checkpoints itself.
///
/// Life cycle of a checkpoint: [`decide`](Self::decide) returns
/// [`Decision::CheckpointNow`] or [`Decision::Force`] and, in the same call, takes one of the
/// `max_concurrent` node permits; the caller then checkpoints and must report
/// [`on_checkpoint_done`](Self::on_checkpoint_done) or
/// [`on_checkpoint_failed`](Self::on_checkpoint_failed), which return the permit.
#[derive(Debug, Clone)]
pub struct NodeScheduler {
    cfg: SchedulerConfig,
    containers: HashMap<String, Container>,
    node_gaps: QuantileWindow,
    cost: CostModel,
    in_flight: u32,
}

fn secs(t: Duration) -> f64 {
    t.as_secs_f64()
}

impl NodeScheduler {
    /// A scheduler with `cfg`, after validating it.
    pub fn new(cfg: SchedulerConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self {
            node_gaps: QuantileWindow::new(cfg.gap_window),
            cost: CostModel::new(&cfg.cost_prior, cfg.cost_forgetting),
            cfg,
            containers: HashMap::new(),
            in_flight: 0,
        })
    }

    /// The configuration in force.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The entry of `id`, created at `t` if it has none. Only the registering events call this
    /// (container start, exec start, a manual checkpoint); every other event ignores an unknown
    /// id, so that a late event (a timer armed before `remove_container`) cannot re-create a
    /// removed container's entry.
    fn register(&mut self, id: &str, t: f64) -> &mut Container {
        let window = self.cfg.gap_window;
        self.containers
            .entry(id.to_owned())
            .or_insert_with(|| Container {
                gaps: GapTracker::new(window),
                state_at: t,
                actions_total: 0,
                actions_at_state: 0,
                footprint: None,
                in_flight: None,
                pending_force: false,
            })
    }

    /// Registers a container whose work starts at `t` (its creation or start); a no-op for a
    /// known one. Optional: [`on_exec_start`](Self::on_exec_start) and
    /// [`begin_manual`](Self::begin_manual) also register an unknown container at their time.
    /// The other events ignore containers never registered or [removed](Self::remove_container).
    pub fn on_container_start(&mut self, id: &str, t: Duration) {
        self.register(id, secs(t));
    }

    /// Forgets a container (deleted); returns its permit if it had a checkpoint in flight. Later
    /// events for `id` other than the registering ones are ignored, and
    /// [`decide`](Self::decide) defers with no recheck.
    pub fn remove_container(&mut self, id: &str) {
        if self
            .containers
            .remove(id)
            .is_some_and(|c| c.in_flight.is_some())
        {
            self.in_flight -= 1;
        }
    }

    /// An exec was requested at `t`. Pass the time the request arrived, not the time it ran after
    /// waiting for a checkpoint, so that the measured gap is the agent's, not ours. Registers an
    /// unknown container.
    pub fn on_exec_start(&mut self, id: &str, t: Duration) {
        let t = secs(t);
        let c = self.register(id, t);
        c.actions_total += 1;
        c.pending_force = false;
        if let Some(gap) = c.gaps.exec_start(t) {
            self.node_gaps.push(gap);
        }
    }

    /// An exec exited at `t`. When it was the last one running this is an action boundary: call
    /// [`decide`](Self::decide) next. Ignored for an unknown container.
    pub fn on_exec_exit(&mut self, id: &str, t: Duration) {
        if let Some(c) = self.containers.get_mut(id) {
            c.gaps.exec_exit(secs(t));
        }
    }

    /// A hint from the agent loop arrived at `t`. After an `llm-start` with an expected duration,
    /// calling [`decide`](Self::decide) again may now say checkpoint. Ignored for an unknown
    /// container.
    pub fn on_hint(&mut self, id: &str, hint: Hint, t: Duration) {
        if let Some(c) = self.containers.get_mut(id) {
            c.gaps.hint(hint, secs(t), self.cfg.tokens_per_s);
        }
    }

    /// The container's current footprint, measured by the caller; used to predict the cost of
    /// its next checkpoint. Update it before `decide` when it is cheap to measure. Ignored for an
    /// unknown container.
    pub fn on_footprint(&mut self, id: &str, footprint: Footprint, _t: Duration) {
        if let Some(c) = self.containers.get_mut(id) {
            c.footprint = Some(footprint);
        }
    }

    /// Decides whether to checkpoint `id` now, at time `t`. A checkpoint decision holds a permit
    /// until [`on_checkpoint_done`](Self::on_checkpoint_done) or
    /// [`on_checkpoint_failed`](Self::on_checkpoint_failed).
    ///
    /// An unknown container (never registered, or [removed](Self::remove_container)) gets
    /// [`DeferReason::NothingNew`], which has no recheck time, and stays unknown.
    pub fn decide(&mut self, id: &str, t: Duration) -> Decision {
        let ts = secs(t);
        let Some(c) = self.containers.get(id) else {
            return Decision::Defer {
                reason: DeferReason::NothingNew,
            };
        };
        let gap = c.gaps.predict(ts, &self.node_gaps, &self.cfg);
        let cost = self.predict_cost(id);
        let permits_free = self.permits_free();
        let reserved_for_force = self
            .containers
            .iter()
            .filter(|(k, c)| c.pending_force && k.as_str() != id)
            .count() as u32;
        let input = PolicyInput {
            action_running: c.gaps.action_running(),
            checkpoint_in_flight: c.in_flight.is_some(),
            actions_since: u32::try_from(c.actions_total - c.actions_at_state).unwrap_or(u32::MAX),
            risk_s: (ts - c.state_at).max(0.0),
            gap,
            cost,
            permits_free,
            reserved_for_force,
        };
        let mut decision = policy::decide(&input, &self.cfg);
        if let Decision::Defer {
            reason: DeferReason::GapTooShort { recheck_at, .. },
        } = &mut decision
        {
            let needed = self.cfg.cost_margin * cost.upper_s + self.cfg.margin_s;
            *recheck_at = c
                .gaps
                .recheck_at(ts, needed, &self.node_gaps, &self.cfg)
                .map(Duration::from_secs_f64);
        }
        if let Some(c) = self.containers.get_mut(id) {
            c.pending_force = matches!(
                decision,
                Decision::Defer {
                    reason: DeferReason::NodeBusy { forced: true }
                }
            );
            if decision.is_checkpoint() {
                c.in_flight = Some((ts, c.actions_total));
                self.in_flight += 1;
            }
        }
        decision
    }

    /// Begins a checkpoint the scheduler did not decide (a user's `belayer checkpoint`), taking a
    /// permit; report it done or failed like any other. Registers an unknown container.
    pub fn begin_manual(&mut self, id: &str, t: Duration) -> Result<(), SchedError> {
        let ts = secs(t);
        if self.permits_free() == 0 {
            return Err(SchedError::NodeBusy(self.cfg.max_concurrent));
        }
        let c = self.register(id, ts);
        if c.in_flight.is_some() {
            return Err(SchedError::AlreadyInFlight(id.to_owned()));
        }
        c.in_flight = Some((ts, c.actions_total));
        c.pending_force = false;
        self.in_flight += 1;
        Ok(())
    }

    /// The checkpoint begun for `id` completed with `cost`: the cost model learns from it, the
    /// work at risk restarts from the checkpoint's start, and the permit is returned.
    pub fn on_checkpoint_done(&mut self, id: &str, cost: CheckpointCost) -> Result<(), SchedError> {
        let c = self
            .containers
            .get_mut(id)
            .ok_or_else(|| SchedError::NotInFlight(id.to_owned()))?;
        let (start, actions) = c
            .in_flight
            .take()
            .ok_or_else(|| SchedError::NotInFlight(id.to_owned()))?;
        c.state_at = c.state_at.max(start);
        c.actions_at_state = c.actions_at_state.max(actions);
        self.in_flight -= 1;
        self.cost.observe(&cost);
        Ok(())
    }

    /// The checkpoint begun for `id` failed: the permit is returned, nothing else changes.
    pub fn on_checkpoint_failed(&mut self, id: &str) -> Result<(), SchedError> {
        let c = self
            .containers
            .get_mut(id)
            .ok_or_else(|| SchedError::NotInFlight(id.to_owned()))?;
        c.in_flight
            .take()
            .ok_or_else(|| SchedError::NotInFlight(id.to_owned()))?;
        self.in_flight -= 1;
        Ok(())
    }

    /// The container was restored from a checkpoint at `t`: nothing is at risk, no exec runs.
    /// Ignored for an unknown container.
    pub fn on_restored(&mut self, id: &str, t: Duration) {
        let ts = secs(t);
        let Some(c) = self.containers.get_mut(id) else {
            return;
        };
        c.gaps.reset();
        c.state_at = ts;
        c.actions_at_state = c.actions_total;
        c.pending_force = false;
    }

    /// Node permits free now.
    pub fn permits_free(&self) -> u32 {
        self.cfg.max_concurrent.saturating_sub(self.in_flight)
    }

    /// Checkpoints in flight on the node.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Seconds of work at risk in `id` at `t`, if the container is known.
    pub fn work_at_risk(&self, id: &str, t: Duration) -> Option<f64> {
        self.containers
            .get(id)
            .map(|c| (secs(t) - c.state_at).max(0.0))
    }

    /// Containers idle between actions with no checkpoint in flight, most work at risk first:
    /// whom to offer a permit when one is returned (call [`decide`](Self::decide) for each).
    pub fn idle_candidates(&self, t: Duration) -> Vec<String> {
        let ts = secs(t);
        let mut v: Vec<(&String, f64)> = self
            .containers
            .iter()
            .filter(|(_, c)| {
                !c.gaps.action_running()
                    && c.in_flight.is_none()
                    && c.actions_total > c.actions_at_state
            })
            .map(|(k, c)| (k, ts - c.state_at))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        v.into_iter().map(|(k, _)| k.clone()).collect()
    }

    /// Predicted remaining idle time of `id` at `t` (the node prior for unknown containers).
    pub fn predict_gap(&self, id: &str, t: Duration) -> GapPrediction {
        match self.containers.get(id) {
            Some(c) => c.gaps.predict(secs(t), &self.node_gaps, &self.cfg),
            None => GapTracker::new(1).predict(secs(t), &self.node_gaps, &self.cfg),
        }
    }

    /// Predicted cost of checkpointing `id` now, from its latest footprint (zero if never given).
    pub fn predict_cost(&self, id: &str) -> CostEstimate {
        let fp = self
            .containers
            .get(id)
            .and_then(|c| c.footprint)
            .unwrap_or_default();
        self.cost.predict(&fp, self.cfg.cost_z)
    }

    /// The node's cost model.
    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gap::Expected;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    const NOTHING_NEW: Decision = Decision::Defer {
        reason: DeferReason::NothingNew,
    };

    /// Every event a late timer or a straggling report can bring for a container.
    fn late_events(n: &mut NodeScheduler, id: &str, t: f64) -> Decision {
        let hint = Hint::LlmStart {
            expected: Some(Expected::Millis(30_000)),
        };
        n.on_hint(id, hint, s(t));
        n.on_footprint(id, Footprint::default(), s(t));
        n.on_exec_exit(id, s(t));
        n.on_restored(id, s(t));
        n.decide(id, s(t))
    }

    #[test]
    fn late_events_do_not_recreate_a_removed_container() {
        let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
        // One container per episode, as on a rollout node; each is deleted while a recheck or
        // Blocked-retry timer is still armed for it.
        for episode in 0..100 {
            let id = format!("episode-{episode}");
            let t = f64::from(episode) * 10.0;
            n.on_container_start(&id, s(t));
            n.on_exec_start(&id, s(t + 1.0));
            n.on_exec_exit(&id, s(t + 2.0));
            n.remove_container(&id);
            assert_eq!(late_events(&mut n, &id, t + 3.0), NOTHING_NEW, "{id}");
            assert_eq!(n.work_at_risk(&id, s(t + 3.0)), None, "{id}");
        }
        assert!(n.containers.is_empty(), "{} leaked", n.containers.len());
        assert_eq!(n.in_flight(), 0);
    }

    #[test]
    fn unknown_container_is_not_registered_and_gets_no_recheck() {
        let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
        // A hint that would open the window for a known container registers nothing here, and the
        // answer carries no recheck time, so the shim arms no timer.
        let d = late_events(&mut n, "never-started", 1.0);
        assert_eq!(d, NOTHING_NEW);
        assert!(!d.is_checkpoint());
        assert!(n.containers.is_empty());
        assert_eq!(n.permits_free(), n.config().max_concurrent);
    }

    #[test]
    fn removal_with_a_checkpoint_in_flight_returns_the_permit_for_good() {
        let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
        n.on_container_start("a", s(0.0));
        n.on_exec_start("a", s(1.0));
        n.on_exec_exit("a", s(2.0));
        n.on_hint(
            "a",
            Hint::LlmStart {
                expected: Some(Expected::Millis(30_000)),
            },
            s(2.0),
        );
        assert_eq!(n.decide("a", s(2.0)), Decision::CheckpointNow);
        n.remove_container("a");
        assert_eq!(n.in_flight(), 0);
        // The checkpoint's report arrives after the delete: nothing to return twice.
        let cost = CheckpointCost {
            footprint: Footprint::default(),
            seconds: 1.0,
        };
        assert_eq!(
            n.on_checkpoint_done("a", cost),
            Err(SchedError::NotInFlight("a".into()))
        );
        assert_eq!(late_events(&mut n, "a", 3.0), NOTHING_NEW);
        assert_eq!(n.in_flight(), 0);
        assert!(n.containers.is_empty());
    }

    #[test]
    fn registering_events_still_register() {
        let mut n = NodeScheduler::new(SchedulerConfig::default()).unwrap();
        n.on_container_start("a", s(0.0));
        n.on_exec_start("b", s(0.0));
        n.begin_manual("c", s(0.0)).unwrap();
        let mut ids: Vec<_> = n.containers.keys().cloned().collect();
        ids.sort();
        assert_eq!(ids, ["a", "b", "c"]);
    }
}
