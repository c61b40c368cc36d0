//! What a run measures: visible overhead and work lost to failures.

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

/// The state a restore at `u` returns to: the newest completed checkpoint's, else the start.
pub fn state_at(start: f64, u: f64, done: &[(f64, f64)]) -> f64 {
    done.iter()
        .filter(|&&(_, d)| d <= u)
        .map(|&(s, _)| s)
        .fold(start, f64::max)
}

/// ∫ from `start` to `end` of (u − state_at(u)) du.
pub fn lost_integral(start: f64, end: f64, done: &[(f64, f64)]) -> f64 {
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

    #[test]
    fn lost_integral_by_hand() {
        // No checkpoint over [0, 10]: ∫u du = 50.
        assert_eq!(lost_integral(0.0, 10.0, &[]), 50.0);
        // Checkpoint of the state at 4, done at 5: ∫0..5 u du + ∫5..10 (u−4) du = 12.5 + 17.5.
        assert_eq!(lost_integral(0.0, 10.0, &[(4.0, 5.0)]), 30.0);
        assert_eq!(state_at(0.0, 4.5, &[(4.0, 5.0)]), 0.0);
        assert_eq!(state_at(0.0, 5.5, &[(4.0, 5.0)]), 4.0);
    }
}
