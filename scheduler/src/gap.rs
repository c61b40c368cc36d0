//! Idle-gap prediction: how long a container will sit idle after an action, from its history of
//! exec-exit → next-exec-start gaps, a node-wide prior, and the agent loop's hints.

use serde::{Deserialize, Serialize};

use crate::config::SchedulerConfig;
use crate::quantile::QuantileWindow;

/// What an `llm-start` hint says about the generation it announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Expected {
    /// Expected number of tokens to generate; turned into time with `tokens_per_s`.
    Tokens(u64),
    /// Expected generation time in milliseconds.
    Millis(u64),
}

/// A hint from the agent loop or its LLM gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "hint")]
pub enum Hint {
    /// The model started generating the next action.
    LlmStart {
        /// How long the generation is expected to take, if known.
        expected: Option<Expected>,
    },
    /// The model finished; the next action is imminent.
    LlmEnd,
}

/// Where a gap prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GapSource {
    /// The container's own gap history blended with the node-wide prior.
    History,
    /// An `llm-start` hint with an expected duration.
    Hint,
    /// An `llm-end` hint: the next action is imminent, the remaining gap is taken as zero.
    LlmEnded,
}

/// A predicted remaining idle time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GapPrediction {
    /// Conservative remaining idle time from now, in seconds (≥ 0).
    pub remaining_s: f64,
    /// What the prediction is based on.
    pub source: GapSource,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum HintState {
    None,
    Started { at: f64, expected_s: Option<f64> },
    Ended,
}

/// Per-container gap tracking: execs in flight, when the container went idle, recent gaps, and
/// the latest hint.
#[derive(Debug, Clone)]
pub struct GapTracker {
    running: u32,
    idle_since: Option<f64>,
    gaps: QuantileWindow,
    hint: HintState,
}

impl GapTracker {
    /// A tracker keeping `window` gaps.
    pub fn new(window: usize) -> Self {
        Self {
            running: 0,
            idle_since: None,
            gaps: QuantileWindow::new(window),
            hint: HintState::None,
        }
    }

    /// An exec started at `t`; returns the gap it closed, if it closed one.
    pub fn exec_start(&mut self, t: f64) -> Option<f64> {
        let gap = match (self.running, self.idle_since) {
            (0, Some(s)) if t >= s => Some(t - s),
            _ => None,
        };
        if let Some(g) = gap {
            self.gaps.push(g);
        }
        self.running = self.running.saturating_add(1);
        self.idle_since = None;
        self.hint = HintState::None;
        gap
    }

    /// An exec exited at `t`; the container goes idle when it was the last one running.
    pub fn exec_exit(&mut self, t: f64) {
        self.running = self.running.saturating_sub(1);
        if self.running == 0 {
            self.idle_since = Some(t);
        }
    }

    /// Records a hint received at `t`.
    pub fn hint(&mut self, hint: Hint, t: f64, tokens_per_s: f64) {
        self.hint = match hint {
            Hint::LlmStart { expected } => HintState::Started {
                at: t,
                expected_s: expected.map(|e| match e {
                    Expected::Millis(ms) => ms as f64 / 1e3,
                    Expected::Tokens(n) => n as f64 / tokens_per_s,
                }),
            },
            Hint::LlmEnd => HintState::Ended,
        };
    }

    /// Forgets the running execs, the idle start and the hint (after a restore).
    pub fn reset(&mut self) {
        self.running = 0;
        self.idle_since = None;
        self.hint = HintState::None;
    }

    /// Whether an exec is running.
    pub fn action_running(&self) -> bool {
        self.running > 0
    }

    /// Number of own gaps held.
    pub fn samples(&self) -> usize {
        self.gaps.len()
    }

    /// Predicts the remaining idle time at `t`, with `node_gap_s` the node-wide estimate of the
    /// same quantile (the prior for containers with few gaps of their own).
    pub fn predict(&self, t: f64, node_gap_s: f64, cfg: &SchedulerConfig) -> GapPrediction {
        match self.hint {
            HintState::Ended => {
                return GapPrediction {
                    remaining_s: 0.0,
                    source: GapSource::LlmEnded,
                };
            }
            HintState::Started {
                at,
                expected_s: Some(e),
            } => {
                return GapPrediction {
                    remaining_s: (cfg.hint_trust * e - (t - at).max(0.0)).max(0.0),
                    source: GapSource::Hint,
                };
            }
            HintState::Started { .. } | HintState::None => {}
        }
        let n = self.gaps.len() as f64;
        let est = match self.gaps.quantile(cfg.gap_quantile) {
            Some(own) if n + cfg.prior_weight > 0.0 => {
                (cfg.prior_weight * node_gap_s + n * own) / (cfg.prior_weight + n)
            }
            _ => node_gap_s,
        };
        let elapsed = self.idle_since.map_or(0.0, |s| (t - s).max(0.0));
        GapPrediction {
            remaining_s: (est - elapsed).max(0.0),
            source: GapSource::History,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> SchedulerConfig {
        SchedulerConfig {
            gap_quantile: 0.0,
            prior_weight: 2.0,
            ..Default::default()
        }
    }

    #[test]
    fn gaps_are_exit_to_next_start() {
        let mut g = GapTracker::new(8);
        assert_eq!(g.exec_start(0.0), None);
        g.exec_exit(1.0);
        assert_eq!(g.exec_start(6.0), Some(5.0));
        // Overlapping execs: idle only when the last one exits.
        assert_eq!(g.exec_start(6.5), None);
        g.exec_exit(7.0);
        assert!(g.action_running());
        g.exec_exit(8.0);
        assert_eq!(g.exec_start(11.0), Some(3.0));
        assert_eq!(g.samples(), 2);
    }

    #[test]
    fn new_container_uses_prior_then_warms_up() {
        let c = cfg();
        let mut g = GapTracker::new(8);
        g.exec_start(0.0);
        g.exec_exit(0.0);
        assert_eq!(g.predict(0.0, 2.0, &c).remaining_s, 2.0);
        for i in 0..6 {
            let t = 100.0 * i as f64;
            g.exec_start(t + 10.0);
            g.exec_exit(t + 100.0);
        }
        // Own gaps are 10 s (the first was 10 s too); weight 2 on the 2 s prior, 6 on 10 s.
        let p = g.predict(100.0 * 5.0 + 100.0, 2.0, &c);
        assert_eq!(p.source, GapSource::History);
        assert!((p.remaining_s - (2.0 * 2.0 + 6.0 * 10.0) / 8.0).abs() < 1e-9);
    }

    #[test]
    fn elapsed_idle_time_is_subtracted() {
        let mut g = GapTracker::new(8);
        g.exec_start(0.0);
        g.exec_exit(1.0);
        assert_eq!(g.predict(2.5, 2.0, &cfg()).remaining_s, 0.5);
        assert_eq!(g.predict(9.0, 2.0, &cfg()).remaining_s, 0.0);
    }

    #[test]
    fn hints_override_history() {
        let c = cfg();
        let mut g = GapTracker::new(8);
        g.exec_start(0.0);
        g.exec_exit(1.0);
        g.hint(
            Hint::LlmStart {
                expected: Some(Expected::Millis(10_000)),
            },
            1.0,
            50.0,
        );
        let p = g.predict(3.0, 2.0, &c);
        assert_eq!(p.source, GapSource::Hint);
        assert!((p.remaining_s - (0.8 * 10.0 - 2.0)).abs() < 1e-9);
        g.hint(
            Hint::LlmStart {
                expected: Some(Expected::Tokens(500)),
            },
            1.0,
            50.0,
        );
        assert!((g.predict(1.0, 2.0, &c).remaining_s - 8.0).abs() < 1e-9);
        g.hint(Hint::LlmEnd, 4.0, 50.0);
        assert_eq!(g.predict(4.0, 2.0, &c).source, GapSource::LlmEnded);
        assert_eq!(g.predict(4.0, 2.0, &c).remaining_s, 0.0);
        // The next exec clears the hint.
        g.exec_start(5.0);
        g.exec_exit(5.5);
        assert_eq!(g.predict(5.5, 2.0, &c).source, GapSource::History);
    }
}
