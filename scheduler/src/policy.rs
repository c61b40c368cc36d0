//! The decision rule at an action boundary, as a pure function of the predictions and the
//! container's and node's state.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::SchedulerConfig;
use crate::cost::CostEstimate;
use crate::gap::GapPrediction;

/// What the caller should do now.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "decision")]
pub enum Decision {
    /// The predicted gap covers the predicted cost: checkpoint now. A permit is held.
    CheckpointNow,
    /// Too much work is at risk: checkpoint now even if the agent will wait. A permit is held.
    Force,
    /// Do not checkpoint now.
    Defer {
        /// Why.
        reason: DeferReason,
    },
}

impl Decision {
    /// Whether the caller must take a checkpoint (and later report it done or failed).
    pub fn is_checkpoint(&self) -> bool {
        matches!(self, Decision::CheckpointNow | Decision::Force)
    }
}

/// Why a checkpoint was deferred.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "reason")]
pub enum DeferReason {
    /// An exec is running: never freeze a container mid-action.
    ActionRunning,
    /// This container already has a checkpoint in flight.
    CheckpointInFlight,
    /// No action ran since the newest checkpoint: nothing new to save.
    NothingNew,
    /// The predicted gap does not cover the predicted cost with margin.
    GapTooShort {
        /// Predicted remaining gap, seconds.
        gap_s: f64,
        /// Predicted (conservative) cost, seconds.
        cost_s: f64,
        /// When the prediction will cover the cost if the container stays idle until then (a
        /// gap that outlasts the short mode is likely a long one): call `decide` again at that
        /// time. Filled by [`NodeScheduler::decide`](crate::NodeScheduler::decide).
        recheck_at: Option<Duration>,
    },
    /// No node-wide permit is free (or the free ones are reserved for forced checkpoints).
    NodeBusy {
        /// Whether the checkpoint would have been forced.
        forced: bool,
    },
}

/// Everything [`decide`] looks at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyInput {
    /// An exec is running in the container.
    pub action_running: bool,
    /// The container has a checkpoint in flight.
    pub checkpoint_in_flight: bool,
    /// Actions started since the state of the newest checkpoint.
    pub actions_since: u32,
    /// Seconds of work since the state of the newest checkpoint.
    pub risk_s: f64,
    /// Predicted remaining gap.
    pub gap: GapPrediction,
    /// Predicted checkpoint cost.
    pub cost: CostEstimate,
    /// Node permits free right now.
    pub permits_free: u32,
    /// Permits to leave for other containers' pending forced checkpoints.
    pub reserved_for_force: u32,
}

/// Whether the predicted gap covers the predicted cost with the configured margins.
pub fn gap_covers_cost(gap_s: f64, cost_s: f64, cfg: &SchedulerConfig) -> bool {
    gap_s >= cfg.cost_margin * cost_s + cfg.margin_s
}

/// Whether the work at risk forces a checkpoint.
pub fn must_force(risk_s: f64, actions_since: u32, cfg: &SchedulerConfig) -> bool {
    risk_s >= cfg.risk_bound_s || cfg.risk_bound_actions.is_some_and(|n| actions_since >= n)
}

/// The policy. Does not reserve the permit; [`NodeScheduler`](crate::NodeScheduler) does.
pub fn decide(input: &PolicyInput, cfg: &SchedulerConfig) -> Decision {
    let defer = |reason| Decision::Defer { reason };
    if input.checkpoint_in_flight {
        return defer(DeferReason::CheckpointInFlight);
    }
    if input.action_running {
        return defer(DeferReason::ActionRunning);
    }
    if input.actions_since == 0 {
        return defer(DeferReason::NothingNew);
    }
    if must_force(input.risk_s, input.actions_since, cfg) {
        return if input.permits_free > 0 {
            Decision::Force
        } else {
            defer(DeferReason::NodeBusy { forced: true })
        };
    }
    if !gap_covers_cost(input.gap.remaining_s, input.cost.upper_s, cfg) {
        return defer(DeferReason::GapTooShort {
            gap_s: input.gap.remaining_s,
            cost_s: input.cost.upper_s,
            recheck_at: None,
        });
    }
    if input.permits_free > input.reserved_for_force {
        Decision::CheckpointNow
    } else {
        defer(DeferReason::NodeBusy { forced: false })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gap::GapSource;
    use proptest::prelude::*;

    fn input(gap_s: f64, cost_s: f64, risk_s: f64) -> PolicyInput {
        PolicyInput {
            action_running: false,
            checkpoint_in_flight: false,
            actions_since: 1,
            risk_s,
            gap: GapPrediction {
                remaining_s: gap_s,
                source: GapSource::History,
            },
            cost: CostEstimate {
                mean_s: cost_s,
                upper_s: cost_s,
            },
            permits_free: 1,
            reserved_for_force: 0,
        }
    }

    #[test]
    fn basic_rules() {
        let c = SchedulerConfig::default();
        assert_eq!(decide(&input(5.0, 1.0, 1.0), &c), Decision::CheckpointNow);
        assert!(matches!(
            decide(&input(1.0, 1.0, 1.0), &c),
            Decision::Defer {
                reason: DeferReason::GapTooShort { .. }
            }
        ));
        assert_eq!(decide(&input(0.0, 1.0, 61.0), &c), Decision::Force);
        let busy = PolicyInput {
            permits_free: 0,
            ..input(0.0, 1.0, 61.0)
        };
        assert_eq!(
            decide(&busy, &c),
            Decision::Defer {
                reason: DeferReason::NodeBusy { forced: true }
            }
        );
        let reserved = PolicyInput {
            reserved_for_force: 1,
            ..input(5.0, 1.0, 1.0)
        };
        assert_eq!(
            decide(&reserved, &c),
            Decision::Defer {
                reason: DeferReason::NodeBusy { forced: false }
            }
        );
        let running = PolicyInput {
            action_running: true,
            ..input(0.0, 1.0, 1e9)
        };
        assert_eq!(
            decide(&running, &c),
            Decision::Defer {
                reason: DeferReason::ActionRunning
            }
        );
        let nothing = PolicyInput {
            actions_since: 0,
            ..input(50.0, 1.0, 1e9)
        };
        assert_eq!(
            decide(&nothing, &c),
            Decision::Defer {
                reason: DeferReason::NothingNew
            }
        );
    }

    #[test]
    fn action_bound_forces() {
        let c = SchedulerConfig {
            risk_bound_actions: Some(3),
            ..Default::default()
        };
        let i = PolicyInput {
            actions_since: 3,
            ..input(0.0, 1.0, 1.0)
        };
        assert_eq!(decide(&i, &c), Decision::Force);
    }

    fn any_input() -> impl Strategy<Value = PolicyInput> {
        (
            any::<bool>(),
            any::<bool>(),
            0u32..20,
            0.0f64..200.0,
            0.0f64..30.0,
            0.0f64..10.0,
            0u32..4,
            0u32..4,
        )
            .prop_map(
                |(
                    action_running,
                    checkpoint_in_flight,
                    actions_since,
                    risk_s,
                    gap_s,
                    cost_s,
                    permits_free,
                    reserved_for_force,
                )| PolicyInput {
                    action_running,
                    checkpoint_in_flight,
                    actions_since,
                    risk_s,
                    gap: GapPrediction {
                        remaining_s: gap_s,
                        source: GapSource::History,
                    },
                    cost: CostEstimate {
                        mean_s: cost_s,
                        upper_s: cost_s,
                    },
                    permits_free,
                    reserved_for_force,
                },
            )
    }

    proptest! {
        #[test]
        fn never_checkpoints_into_a_short_gap_unless_forced(i in any_input()) {
            let c = SchedulerConfig::default();
            match decide(&i, &c) {
                Decision::CheckpointNow => {
                    prop_assert!(i.gap.remaining_s >= i.cost.upper_s);
                    prop_assert!(gap_covers_cost(i.gap.remaining_s, i.cost.upper_s, &c));
                    prop_assert!(!must_force(i.risk_s, i.actions_since, &c));
                }
                Decision::Force => prop_assert!(must_force(i.risk_s, i.actions_since, &c)),
                Decision::Defer { .. } => {}
            }
        }

        #[test]
        fn force_fires_past_the_risk_bound_at_a_free_boundary(i in any_input()) {
            let c = SchedulerConfig::default();
            let free_boundary = !i.action_running && !i.checkpoint_in_flight && i.actions_since > 0 && i.permits_free > 0;
            if free_boundary && i.risk_s >= c.risk_bound_s {
                prop_assert_eq!(decide(&i, &c), Decision::Force);
            }
        }

        #[test]
        fn never_without_a_permit(i in any_input()) {
            let c = SchedulerConfig::default();
            if decide(&i, &c).is_checkpoint() {
                prop_assert!(i.permits_free > 0);
                prop_assert!(!i.action_running && !i.checkpoint_in_flight);
            }
        }
    }
}
