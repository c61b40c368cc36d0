//! Synthetic episodes with the published shapes of agentic coding rollouts: 16–100 model turns,
//! actions of 0.3–3 s, lognormal generation times of seconds to tens of seconds, occasional
//! follow-up actions without a model call in between, and a sandbox whose memory and filesystem
//! grow as it works.

use crate::bench::sched::rng::{Rng, mix};
use crate::bench::sched::trace::{Episode, Turn};

const MIB: f64 = (1u64 << 20) as f64;
const GIB: f64 = (1u64 << 30) as f64;

/// Parameters of the synthetic episodes (flags of the same names, dashes for underscores).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Shape {
    /// Fewest model turns per episode.
    pub turns_min: u64,
    /// Most model turns per episode.
    pub turns_max: u64,
    /// Median generation time, seconds.
    pub llm_median_s: f64,
    /// Log-space σ of generation times within an episode.
    pub llm_sigma: f64,
    /// Log-space σ of each episode's speed (model, prompt length, gateway load).
    pub episode_sigma: f64,
    /// Shortest action, seconds (log-uniform between this and the longest).
    pub action_min_s: f64,
    /// Longest action, seconds.
    pub action_max_s: f64,
    /// Probability that a model turn issues one more action right after the last (parallel tool
    /// calls): a gap of 20–250 ms with no `llm-start` hint.
    pub burst_p: f64,
    /// Median resident memory at the start, GiB (lognormal, σ 0.6).
    pub resident_median_gib: f64,
    /// Median memory an action dirties, MiB (lognormal, σ 1).
    pub dirty_median_mib: f64,
    /// Probability that an action writes files; then median MiB written (lognormal, σ 1.5).
    pub fs_p: f64,
    /// Median MiB an action writes when it writes.
    pub fs_median_mib: f64,
    /// Log-space σ of the error of an `llm-start` hint's expected time.
    pub hint_sigma: f64,
    /// Episodes start uniformly within this many seconds of each other.
    pub stagger_s: f64,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            turns_min: 16,
            turns_max: 100,
            llm_median_s: 6.0,
            llm_sigma: 0.8,
            episode_sigma: 0.3,
            action_min_s: 0.3,
            action_max_s: 3.0,
            burst_p: 0.2,
            resident_median_gib: 0.5,
            dirty_median_mib: 30.0,
            fs_p: 0.5,
            fs_median_mib: 5.0,
            hint_sigma: 0.25,
            stagger_s: 30.0,
        }
    }
}

/// The episodes of one synthetic node: `containers` episodes, reproducible from `(seed, node)`.
pub fn node(seed: u64, node: u64, containers: usize, shape: &Shape) -> Vec<Episode> {
    (0..containers)
        .map(|c| {
            let mut rng = Rng::new(mix(&[seed, node, c as u64, 0x7472_6163]));
            episode(&mut rng, format!("s{seed}-n{node}-c{c}"), shape)
        })
        .collect()
}

fn episode(rng: &mut Rng, id: String, s: &Shape) -> Episode {
    let model_turns = rng.int(s.turns_min, s.turns_max);
    let speed = rng.lognormal(1.0, s.episode_sigma);
    let mut resident = rng.lognormal(s.resident_median_gib, 0.6) * GIB;
    let resident_cap = 4.0 * resident;
    let mut turns = Vec::new();
    for _ in 0..model_turns {
        let mut follow_up = false;
        loop {
            let (llm_s, hint_ms) = if follow_up {
                (rng.uniform(0.02, 0.25), None)
            } else {
                let g = rng.lognormal(s.llm_median_s * speed, s.llm_sigma);
                let hint = g * rng.lognormal(1.0, s.hint_sigma);
                (g, Some((hint * 1e3).round() as u64))
            };
            let dirty = (rng.lognormal(s.dirty_median_mib, 1.0) * MIB).min(GIB);
            let fs = if rng.unit() < s.fs_p {
                (rng.lognormal(s.fs_median_mib, 1.5) * MIB).min(2.0 * GIB)
            } else {
                0.0
            };
            resident = (resident + 0.25 * dirty).min(resident_cap);
            turns.push(Turn {
                episode: id.clone(),
                start_s: None,
                llm_s: round3(llm_s),
                action_s: round3(rng.log_uniform(s.action_min_s, s.action_max_s)),
                dirty_bytes: dirty as u64,
                resident_bytes: Some(resident as u64),
                fs_bytes: fs as u64,
                hint_ms,
            });
            follow_up = true;
            if rng.unit() >= s.burst_p {
                break;
            }
        }
    }
    Episode {
        id,
        start_s: round3(rng.uniform(0.0, s.stagger_s)),
        turns,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_hold_and_seeds_reproduce() {
        let s = Shape::default();
        let a = node(1, 0, 8, &s);
        assert_eq!(a, node(1, 0, 8, &s));
        assert_ne!(a, node(2, 0, 8, &s));
        for e in &a {
            let model_turns = e.turns.iter().filter(|t| t.hint_ms.is_some()).count() as u64;
            assert!((s.turns_min..=s.turns_max).contains(&model_turns));
            assert!(
                e.turns
                    .iter()
                    .all(|t| (0.299..=3.001).contains(&t.action_s))
            );
        }
    }
}
