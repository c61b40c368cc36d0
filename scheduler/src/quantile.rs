//! A streaming low-quantile estimate over a bounded window of the most recent samples.

use std::collections::VecDeque;

/// Keeps the newest `capacity` samples and answers quantile queries over them exactly.
///
/// The window both bounds memory and lets the estimate follow a drifting distribution (an agent
/// whose turns get longer as its context grows). Queries use the *lower* order statistic, so the
/// estimate never exceeds the interpolated sample quantile: conservative for gap prediction.
#[derive(Debug, Clone)]
pub struct QuantileWindow {
    samples: VecDeque<f64>,
    capacity: usize,
}

impl QuantileWindow {
    /// An empty window that holds at most `capacity` samples (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            samples: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds a sample, dropping the oldest when full. Non-finite samples are ignored.
    pub fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(x);
    }

    /// Number of samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `q`-quantile (q clamped to [0, 1]) of the held samples: the order statistic at index
    /// `⌊q·(n−1)⌋`. `None` while empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        lower_quantile(self.samples.iter().copied().collect(), q)
    }

    /// The `q`-quantile of `x − elapsed` over the samples `x > elapsed`, with how many there
    /// are: the remaining gap given that it has lasted `elapsed` so far. `None` if none is above.
    pub fn conditional_quantile(&self, q: f64, elapsed: f64) -> Option<(f64, usize)> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|&&x| x > elapsed)
            .map(|&x| x - elapsed)
            .collect();
        let n = v.len();
        lower_quantile(v, q).map(|x| (x, n))
    }

    /// The held samples, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = f64> + '_ {
        self.samples.iter().copied()
    }
}

fn lower_quantile(mut v: Vec<f64>, q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    // Truncation is the point: the lower order statistic.
    let k = ((q * (v.len() - 1) as f64).floor() as usize).min(v.len() - 1);
    let (_, x, _) = v.select_nth_unstable_by(k, f64::total_cmp);
    Some(*x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn empty_has_no_quantile() {
        assert_eq!(QuantileWindow::new(4).quantile(0.5), None);
    }

    #[test]
    fn lower_order_statistic() {
        let mut w = QuantileWindow::new(10);
        for x in [5.0, 1.0, 4.0, 2.0, 3.0] {
            w.push(x);
        }
        assert_eq!(w.quantile(0.0), Some(1.0));
        assert_eq!(w.quantile(0.1), Some(1.0));
        assert_eq!(w.quantile(0.25), Some(2.0));
        assert_eq!(w.quantile(0.5), Some(3.0));
        assert_eq!(w.quantile(1.0), Some(5.0));
    }

    #[test]
    fn conditional_on_survival() {
        let mut w = QuantileWindow::new(10);
        for x in [0.1, 0.2, 0.1, 8.0, 10.0, 12.0] {
            w.push(x);
        }
        assert_eq!(w.quantile(0.1), Some(0.1));
        assert_eq!(w.conditional_quantile(0.0, 0.5), Some((7.5, 3)));
        assert_eq!(w.conditional_quantile(0.0, 12.0), None);
    }

    #[test]
    fn window_forgets_oldest() {
        let mut w = QuantileWindow::new(3);
        for x in [100.0, 1.0, 2.0, 3.0] {
            w.push(x);
        }
        assert_eq!(w.len(), 3);
        assert_eq!(w.quantile(1.0), Some(3.0));
    }

    proptest! {
        #[test]
        fn estimate_within_window_bounds_and_below_interpolated(
            xs in prop::collection::vec(0.0f64..1e4, 1..200),
            cap in 1usize..64,
            q in 0.0f64..=1.0,
        ) {
            let mut w = QuantileWindow::new(cap);
            for &x in &xs { w.push(x); }
            let kept: Vec<f64> = xs[xs.len().saturating_sub(cap)..].to_vec();
            prop_assert!(w.len() <= cap);
            let est = w.quantile(q).unwrap();
            let mut sorted = kept.clone();
            sorted.sort_by(f64::total_cmp);
            prop_assert!(est >= sorted[0] && est <= sorted[sorted.len() - 1]);
            // Never above the linearly interpolated sample quantile.
            let pos = q * (sorted.len() - 1) as f64;
            let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
            let interp = sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64);
            prop_assert!(est <= interp + 1e-9);
            // At most ⌊q·(n−1)⌋ samples lie strictly below the estimate.
            let below = sorted.iter().filter(|&&x| x < est).count();
            prop_assert!(below as f64 <= q * (sorted.len() - 1) as f64 + 1e-9);
        }

        #[test]
        fn monotone_in_q(xs in prop::collection::vec(0.0f64..1e4, 1..100), a in 0.0f64..=1.0, b in 0.0f64..=1.0) {
            let mut w = QuantileWindow::new(64);
            for &x in &xs { w.push(x); }
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(w.quantile(lo).unwrap() <= w.quantile(hi).unwrap());
        }
    }
}
