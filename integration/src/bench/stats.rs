//! Samples of each measurement and their medians.

use std::collections::BTreeMap;

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
}

/// The median (mean of the middle two for an even count); `None` when empty.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }
}
