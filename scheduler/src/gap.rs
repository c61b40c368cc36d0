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
    /// The container sends `llm-start` hints but sent none in this gap: a follow-up action with
    /// no model call, the remaining gap is taken as zero (see `trust_hint_silence`).
    HintSilence,
}

/// A predicted remaining idle time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GapPrediction {
    /// Conservative remaining idle time from now, in seconds (≥ 0).
    pub remaining_s: f64,
    /// What the prediction is based on.
    pub source: GapSource,
}

/// How far past a gap sample a recheck is scheduled, seconds.
const RECHECK_STEP_S: f64 = 1e-3;

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
    /// Whether an `llm-start` with an expected duration was ever received.
    hinting: bool,
}

impl GapTracker {
    /// A tracker keeping `window` gaps.
    pub fn new(window: usize) -> Self {
        Self {
            running: 0,
            idle_since: None,
            gaps: QuantileWindow::new(window),
            hint: HintState::None,
            hinting: false,
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
        if let Hint::LlmStart { expected: Some(_) } = hint {
            self.hinting = true;
        }
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

    /// Predicts the remaining idle time at `t`. Without a hint: the low quantile of the gaps that
    /// lasted longer than the current idle time so far, minus that time (own gaps blended with
    /// the node's `node` window, which is the prior for containers with few gaps of their own).
    pub fn predict(&self, t: f64, node: &QuantileWindow, cfg: &SchedulerConfig) -> GapPrediction {
        match self.hint {
            HintState::Ended => GapPrediction {
                remaining_s: 0.0,
                source: GapSource::LlmEnded,
            },
            HintState::Started {
                at,
                expected_s: Some(e),
            } => GapPrediction {
                remaining_s: (cfg.hint_trust * e - (t - at).max(0.0)).max(0.0),
                source: GapSource::Hint,
            },
            HintState::None if self.hinting && cfg.trust_hint_silence => GapPrediction {
                remaining_s: 0.0,
                source: GapSource::HintSilence,
            },
            HintState::Started { .. } | HintState::None => GapPrediction {
                remaining_s: self.history_remaining(self.elapsed(t), node, cfg),
                source: GapSource::History,
            },
        }
    }

    /// When the history-based prediction will first reach `needed_s` if no exec arrives before:
    /// an absolute time to call `decide` again. `None` with a hint, outside a gap, or never.
    pub fn recheck_at(
        &self,
        t: f64,
        needed_s: f64,
        node: &QuantileWindow,
        cfg: &SchedulerConfig,
    ) -> Option<f64> {
        if self.predict(t, node, cfg).source != GapSource::History {
            return None;
        }
        let idle_since = self.idle_since?;
        let now = self.elapsed(t);
        let mut points: Vec<f64> = self
            .gaps
            .iter()
            .chain(node.iter())
            .filter(|&x| x > now)
            .collect();
        points.sort_by(f64::total_cmp);
        points.dedup();
        // Just past each sample value, where the prediction steps up; the millisecond keeps a
        // caller's rounded clock from landing on the sample itself and getting the same answer.
        points
            .into_iter()
            .map(|x| x + RECHECK_STEP_S)
            .find(|&e| self.history_remaining(e, node, cfg) >= needed_s)
            .map(|e| idle_since + e)
    }

    fn elapsed(&self, t: f64) -> f64 {
        self.idle_since.map_or(0.0, |s| (t - s).max(0.0))
    }

    fn history_remaining(&self, elapsed: f64, node: &QuantileWindow, cfg: &SchedulerConfig) -> f64 {
        let q = cfg.gap_quantile;
        match (
            self.gaps.conditional_quantile(q, elapsed),
            node.conditional_quantile(q, elapsed),
        ) {
            (Some((own, n)), Some((prior, _))) => {
                let n = n as f64;
                (cfg.prior_weight * prior + n * own) / (cfg.prior_weight + n)
            }
            (Some((x, _)), None) | (None, Some((x, _))) => x,
            (None, None) if node.is_empty() => (cfg.prior_gap_s - elapsed).max(0.0),
            // Idle longer than any gap seen: no evidence of more to come.
            (None, None) => 0.0,
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

    fn window(xs: &[f64]) -> QuantileWindow {
        let mut w = QuantileWindow::new(64);
        xs.iter().for_each(|&x| w.push(x));
        w
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
    fn new_container_uses_node_prior_then_warms_up() {
        let c = cfg();
        let node = window(&[2.0; 10]);
        let mut g = GapTracker::new(8);
        g.exec_start(0.0);
        g.exec_exit(0.0);
        assert_eq!(g.predict(0.0, &node, &c).remaining_s, 2.0);
        for i in 0..6 {
            let t = 100.0 * i as f64;
            g.exec_start(t + 10.0);
            g.exec_exit(t + 100.0);
        }
        // Six own gaps of 10 s against weight 2 on the node's 2 s.
        let p = g.predict(600.0, &node, &c);
        assert_eq!(p.source, GapSource::History);
        assert!((p.remaining_s - (2.0 * 2.0 + 6.0 * 10.0) / 8.0).abs() < 1e-9);
    }

    #[test]
    fn empty_node_uses_configured_prior_minus_elapsed() {
        let mut g = GapTracker::new(8);
        let node = window(&[]);
        g.exec_start(0.0);
        g.exec_exit(1.0);
        assert_eq!(g.predict(2.5, &node, &cfg()).remaining_s, 0.5);
        assert_eq!(g.predict(9.0, &node, &cfg()).remaining_s, 0.0);
    }

    #[test]
    fn surviving_the_short_mode_predicts_the_long_one() {
        let c = SchedulerConfig {
            gap_quantile: 0.1,
            prior_weight: 0.0,
            ..Default::default()
        };
        let gaps = [0.1, 10.0, 0.1, 10.0, 0.1, 10.0, 0.1, 10.0, 0.1, 10.0];
        let mut g = GapTracker::new(64);
        let mut t = 0.0;
        for gap in gaps {
            g.exec_start(t);
            g.exec_exit(t + 1.0);
            t += 1.0 + gap;
        }
        g.exec_start(t);
        g.exec_exit(t + 1.0);
        let node = window(&gaps);
        let exit = t + 1.0;
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(g.predict(exit, &node, &c).remaining_s, 0.1));
        assert!(near(g.predict(exit + 0.2, &node, &c).remaining_s, 9.8));
        let at = g.recheck_at(exit, 3.0, &node, &c).unwrap();
        assert!(near(at, exit + 0.1 + RECHECK_STEP_S));
        // Deciding at that (rounded) time does not ask for the same recheck again.
        let again = g.recheck_at(at - 1e-9, 3.0, &node, &c);
        assert!(again.is_none_or(|a| a > at), "{again:?}");
        assert_eq!(g.recheck_at(exit, 30.0, &node, &c), None);
        // Idle longer than any gap seen: nothing predicted.
        assert_eq!(g.predict(exit + 11.0, &node, &c).remaining_s, 0.0);
    }

    #[test]
    fn hints_override_history() {
        let c = cfg();
        let node = window(&[2.0]);
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
        let p = g.predict(3.0, &node, &c);
        assert_eq!(p.source, GapSource::Hint);
        assert!((p.remaining_s - (0.8 * 10.0 - 2.0)).abs() < 1e-9);
        assert_eq!(g.recheck_at(3.0, 100.0, &node, &c), None);
        g.hint(
            Hint::LlmStart {
                expected: Some(Expected::Tokens(500)),
            },
            1.0,
            50.0,
        );
        assert!((g.predict(1.0, &node, &c).remaining_s - 8.0).abs() < 1e-9);
        g.hint(Hint::LlmEnd, 4.0, 50.0);
        assert_eq!(g.predict(4.0, &node, &c).source, GapSource::LlmEnded);
        assert_eq!(g.predict(4.0, &node, &c).remaining_s, 0.0);
        // The next exec clears the hint; a gap without one is now a follow-up action.
        g.exec_start(5.0);
        g.exec_exit(5.5);
        assert_eq!(g.predict(5.5, &node, &c).source, GapSource::HintSilence);
        assert_eq!(g.recheck_at(5.5, 0.1, &node, &c), None);
        let c = SchedulerConfig {
            trust_hint_silence: false,
            ..c
        };
        assert_eq!(g.predict(5.5, &node, &c).source, GapSource::History);
    }
}
