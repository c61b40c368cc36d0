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

    fn container(&mut self, id: &str, t: f64) -> &mut Container {
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

    /// Registers a container whose work starts at `t` (its creation or start). Optional: any
    /// first event registers it at that event's time.
    pub fn on_container_start(&mut self, id: &str, t: Duration) {
        self.container(id, secs(t));
    }

    /// Forgets a container (deleted); returns its permit if it had a checkpoint in flight.
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
    /// waiting for a checkpoint, so that the measured gap is the agent's, not ours.
    pub fn on_exec_start(&mut self, id: &str, t: Duration) {
        let t = secs(t);
        let c = self.container(id, t);
        c.actions_total += 1;
        c.pending_force = false;
        if let Some(gap) = c.gaps.exec_start(t) {
            self.node_gaps.push(gap);
        }
    }

    /// An exec exited at `t`. When it was the last one running this is an action boundary: call
    /// [`decide`](Self::decide) next.
    pub fn on_exec_exit(&mut self, id: &str, t: Duration) {
        let t = secs(t);
        self.container(id, t).gaps.exec_exit(t);
    }

    /// A hint from the agent loop arrived at `t`. After an `llm-start` with an expected duration,
    /// calling [`decide`](Self::decide) again may now say checkpoint.
    pub fn on_hint(&mut self, id: &str, hint: Hint, t: Duration) {
        let tps = self.cfg.tokens_per_s;
        let t = secs(t);
        self.container(id, t).gaps.hint(hint, t, tps);
    }

    /// The container's current footprint, measured by the caller; used to predict the cost of
    /// its next checkpoint. Update it before `decide` when it is cheap to measure.
    pub fn on_footprint(&mut self, id: &str, footprint: Footprint, t: Duration) {
        self.container(id, secs(t)).footprint = Some(footprint);
    }

    /// Decides whether to checkpoint `id` now, at time `t`. A checkpoint decision holds a permit
    /// until [`on_checkpoint_done`](Self::on_checkpoint_done) or
    /// [`on_checkpoint_failed`](Self::on_checkpoint_failed).
    pub fn decide(&mut self, id: &str, t: Duration) -> Decision {
        let ts = secs(t);
        let gap = self.predict_gap(id, t);
        let cost = self.predict_cost(id);
        let permits_free = self.permits_free();
        let reserved_for_force = self
            .containers
            .iter()
            .filter(|(k, c)| c.pending_force && k.as_str() != id)
            .count() as u32;
        let c = self.container(id, ts);
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
            *recheck_at = self.containers.get(id).and_then(|c| {
                c.gaps
                    .recheck_at(ts, needed, &self.node_gaps, &self.cfg)
                    .map(Duration::from_secs_f64)
            });
        }
        let c = self.container(id, ts);
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
        decision
    }

    /// Begins a checkpoint the scheduler did not decide (a user's `belayer checkpoint`), taking a
    /// permit; report it done or failed like any other.
    pub fn begin_manual(&mut self, id: &str, t: Duration) -> Result<(), SchedError> {
        let ts = secs(t);
        if self.permits_free() == 0 {
            return Err(SchedError::NodeBusy(self.cfg.max_concurrent));
        }
        let c = self.container(id, ts);
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
    pub fn on_restored(&mut self, id: &str, t: Duration) {
        let ts = secs(t);
        let c = self.container(id, ts);
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
