//! Statistics every benchmark reports the same way: samples by key, medians, nearest-rank
//! percentiles, a mean with its 95 % confidence interval, and the JSON of a distribution.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Samples in seconds (or a plain number for ratios), by measurement key.
#[derive(Clone, Debug, Default)]
pub struct Samples(pub BTreeMap<String, Vec<f64>>);

impl Samples {
    pub fn push(&mut self, key: &str, v: f64) {
        self.0.entry(key.to_string()).or_default().push(v);
    }

    pub fn get(&self, key: &str) -> &[f64] {
        self.0.get(key).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn median(&self, key: &str) -> Option<f64> {
        median(self.get(key))
    }

    /// The median and every sample of `key` as JSON (null when it has none).
    pub fn dist(&self, key: &str) -> Value {
        dist(self.get(key))
    }
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(xs: &[f64]) -> Option<f64> {
    let v = sorted(xs);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The nearest-rank percentile `p` (0–100); `None` when empty.
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    let v = sorted(xs);
    if v.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    Some(v[rank.clamp(1, v.len()) - 1])
}

/// The mean and the half-width of its 95 % confidence interval (normal approximation; 0 for
/// fewer than two values, NaN mean for none).
pub fn mean_ci(xs: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = xs.into_iter().collect();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, 1.96 * (var / n).sqrt())
}

/// Rounds to three decimals (what the reports print).
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A distribution as the reports give it: `{n, median, p50, p99, samples}` (null when empty).
pub fn dist(xs: &[f64]) -> Value {
    let Some(m) = median(xs) else {
        return Value::Null;
    };
    json!({
        "n": xs.len(),
        "median": round3(m),
        "p99": percentile(xs, 99.0).map(round3),
        "samples": xs.iter().map(|v| round3(*v)).collect::<Vec<_>>(),
    })
}

/// `median (n = N: a, b, c)` for a table cell, seconds with `decimals`.
pub fn cell(xs: &[f64], decimals: usize) -> String {
    match median(xs) {
        None => "—".into(),
        Some(m) => {
            let all: Vec<String> = xs.iter().map(|v| format!("{v:.decimals$}")).collect();
            format!("{m:.decimals$} ({})", all.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_percentiles_and_ci() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&xs, 50.0), Some(50.0));
        assert_eq!(percentile(&xs, 99.0), Some(99.0));
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        assert_eq!(mean_ci([2.0]), (2.0, 0.0));
        let (m, ci) = mean_ci([1.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((ci - 1.96).abs() < 1e-9);
        assert_eq!(dist(&[]), Value::Null);
        assert_eq!(dist(&[1.0, 3.0])["median"], 2.0);
        assert_eq!(cell(&[1.0, 3.0], 1), "2.0 (1.0, 3.0)");
    }
}
