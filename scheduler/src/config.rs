//! Tunables of the scheduler, with documented defaults; (de)serializable so the shim can read them
//! from Belayer's config file.

use serde::{Deserialize, Serialize};

/// Prior of the checkpoint cost model: seconds = `intercept_s` + Σ rate × GiB.
///
/// The defaults are CRIU-like: ~0.3 s of fixed cost (freeze, walk /proc, write the image
/// directory), dirty memory written at ~1 GiB/s, a small per-GiB cost for scanning resident memory,
/// and changed filesystem bytes archived at ~1 GiB/s. The model moves away from them as real
/// checkpoints are observed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CostPrior {
    /// Fixed cost of any checkpoint, in seconds. Default 0.3.
    pub intercept_s: f64,
    /// Seconds per GiB of memory dirtied since the last checkpoint. Default 1.0.
    pub s_per_gib_dirty: f64,
    /// Seconds per GiB of resident memory. Default 0.1.
    pub s_per_gib_resident: f64,
    /// Seconds per GiB of filesystem bytes changed since the last checkpoint. Default 1.0.
    pub s_per_gib_fs: f64,
    /// Prior standard deviation of a checkpoint's duration around the model, in seconds. Default 0.2.
    pub sd_s: f64,
}

impl Default for CostPrior {
    fn default() -> Self {
        Self {
            intercept_s: 0.3,
            s_per_gib_dirty: 1.0,
            s_per_gib_resident: 0.1,
            s_per_gib_fs: 1.0,
            sd_s: 0.2,
        }
    }
}

/// The largest valid [`SchedulerConfig::gap_window`]. A recheck time costs time quadratic in the
/// window, and the shim computes it under its node-wide scheduler lock.
pub const MAX_GAP_WINDOW: usize = 512;

/// Every tunable of [`NodeScheduler`](crate::NodeScheduler). Missing fields take their defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchedulerConfig {
    /// Quantile of the idle-gap distribution taken as the predicted gap; low is conservative.
    /// Default 0.1.
    pub gap_quantile: f64,
    /// How many of the most recent gaps are kept, per container and node-wide, in
    /// 1..=[`MAX_GAP_WINDOW`] (512). Default 64.
    pub gap_window: usize,
    /// Gap assumed, in seconds, before the node has observed any. Default 2.0.
    pub prior_gap_s: f64,
    /// Weight of the node-wide estimate, in gaps: with `n` own gaps a container's estimate is
    /// `(w·node + n·own) / (w + n)`. Default 4.0.
    pub prior_weight: f64,
    /// Fraction of an `llm-start` hint's expected duration that is trusted. Default 0.8.
    pub hint_trust: f64,
    /// Once a container has sent an `llm-start` hint with an expected duration, take a gap in
    /// which none arrives as a follow-up action with no model call (remaining gap zero).
    /// Default true.
    pub trust_hint_silence: bool,
    /// Decode rate used to turn an `llm-start` hint's expected tokens into time. Default 50.0.
    pub tokens_per_s: f64,
    /// Checkpoint now when `predicted gap ≥ cost_margin × predicted cost + margin_s`.
    /// Default 1.25.
    pub cost_margin: f64,
    /// Additive margin of that rule, in seconds. Default 0.1.
    pub margin_s: f64,
    /// The predicted cost is the model's mean plus `cost_z` prediction standard deviations.
    /// Default 1.0.
    pub cost_z: f64,
    /// Forgetting factor of the cost model's recursive least squares, in (0, 1]. Default 0.98.
    pub cost_forgetting: f64,
    /// Prior of the cost model.
    pub cost_prior: CostPrior,
    /// Force a checkpoint at the next action boundary once this many seconds of work are at risk
    /// (time since the state the newest checkpoint captured). Default 60.0.
    pub risk_bound_s: f64,
    /// Also force once this many actions ran since the newest checkpoint; `None` disables it.
    /// Default `None`.
    pub risk_bound_actions: Option<u32>,
    /// Node-wide bound on checkpoints in flight at once. Default 2.
    pub max_concurrent: u32,
    /// How many checkpoints per container [`plan_retention`](crate::plan_retention) keeps.
    /// Default 3.
    pub keep: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            gap_quantile: 0.1,
            gap_window: 64,
            prior_gap_s: 2.0,
            prior_weight: 4.0,
            hint_trust: 0.8,
            trust_hint_silence: true,
            tokens_per_s: 50.0,
            cost_margin: 1.25,
            margin_s: 0.1,
            cost_z: 1.0,
            cost_forgetting: 0.98,
            cost_prior: CostPrior::default(),
            risk_bound_s: 60.0,
            risk_bound_actions: None,
            max_concurrent: 2,
            keep: 3,
        }
    }
}

/// A config value outside its valid range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("scheduler config field `{field}` must be {expected}")]
pub struct ConfigError {
    /// The offending field.
    pub field: &'static str,
    /// What the field must be.
    pub expected: &'static str,
}

impl SchedulerConfig {
    /// Checks every field's range; [`NodeScheduler::new`](crate::NodeScheduler::new) calls it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = &self.cost_prior;
        let checks: [(&'static str, bool, &'static str); 16] = [
            (
                "gap_quantile",
                in_range(self.gap_quantile, 0.0, 1.0),
                "in [0, 1]",
            ),
            (
                "gap_window",
                (1..=MAX_GAP_WINDOW).contains(&self.gap_window),
                "in 1..=512",
            ),
            ("prior_gap_s", non_neg(self.prior_gap_s), "finite and ≥ 0"),
            ("prior_weight", non_neg(self.prior_weight), "finite and ≥ 0"),
            (
                "hint_trust",
                in_range(self.hint_trust, 0.0, 1.0),
                "in [0, 1]",
            ),
            (
                "tokens_per_s",
                positive(self.tokens_per_s),
                "finite and > 0",
            ),
            (
                "cost_margin",
                self.cost_margin.is_finite() && self.cost_margin >= 1.0,
                "finite and ≥ 1",
            ),
            ("margin_s", non_neg(self.margin_s), "finite and ≥ 0"),
            ("cost_z", non_neg(self.cost_z), "finite and ≥ 0"),
            (
                "cost_forgetting",
                self.cost_forgetting > 0.0 && self.cost_forgetting <= 1.0,
                "in (0, 1]",
            ),
            (
                "cost_prior.intercept_s",
                non_neg(p.intercept_s),
                "finite and ≥ 0",
            ),
            (
                "cost_prior rates",
                non_neg(p.s_per_gib_dirty)
                    && non_neg(p.s_per_gib_resident)
                    && non_neg(p.s_per_gib_fs),
                "finite and ≥ 0",
            ),
            ("cost_prior.sd_s", positive(p.sd_s), "finite and > 0"),
            (
                "risk_bound_s",
                positive(self.risk_bound_s),
                "finite and > 0",
            ),
            ("max_concurrent", self.max_concurrent >= 1, "≥ 1"),
            ("keep", self.keep >= 1, "≥ 1"),
        ];
        match checks.into_iter().find(|(_, ok, _)| !ok) {
            Some((field, _, expected)) => Err(ConfigError { field, expected }),
            None if self.risk_bound_actions == Some(0) => Err(ConfigError {
                field: "risk_bound_actions",
                expected: "≥ 1 or absent",
            }),
            None => Ok(()),
        }
    }
}

fn in_range(x: f64, lo: f64, hi: f64) -> bool {
    (lo..=hi).contains(&x)
}

fn non_neg(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        SchedulerConfig::default().validate().unwrap();
    }

    #[test]
    fn partial_json_takes_defaults() {
        let c: SchedulerConfig =
            serde_json::from_str(r#"{"max_concurrent": 1, "keep": 5}"#).unwrap();
        assert_eq!(c.max_concurrent, 1);
        assert_eq!(c.keep, 5);
        assert_eq!(c.gap_quantile, 0.1);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        assert!(serde_json::from_str::<SchedulerConfig>(r#"{"max_concurent": 1}"#).is_err());
    }

    #[test]
    fn bad_values_name_the_field() {
        let c = SchedulerConfig {
            gap_quantile: 1.5,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "gap_quantile");
        let c = SchedulerConfig {
            max_concurrent: 0,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "max_concurrent");
        let c = SchedulerConfig {
            risk_bound_actions: Some(0),
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "risk_bound_actions");
        let c = SchedulerConfig {
            risk_bound_s: f64::NAN,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "risk_bound_s");
    }

    #[test]
    fn gap_window_is_bounded_as_documented() {
        let with = |gap_window| SchedulerConfig {
            gap_window,
            ..Default::default()
        };
        with(1).validate().unwrap();
        with(MAX_GAP_WINDOW).validate().unwrap();
        for bad in [0, MAX_GAP_WINDOW + 1, 4096] {
            let e = with(bad).validate().unwrap_err();
            assert_eq!(e.field, "gap_window", "{bad}");
            assert_eq!(
                e.to_string(),
                "scheduler config field `gap_window` must be in 1..=512"
            );
        }
    }
}
