//! Checkpoint cost model: seconds as a non-negative linear function of the container's footprint,
//! fitted online by recursive least squares with forgetting, starting from a prior.

use serde::{Deserialize, Serialize};

use crate::config::CostPrior;

const GIB: f64 = (1u64 << 30) as f64;
/// Number of model features: intercept, dirty, resident, fs.
const N: usize = 4;
/// Bound on the diagonal of the covariance, against wind-up in directions the data never excites.
const P_MAX: f64 = 1e3;

/// The sizes a checkpoint's duration depends on, as the shim measures them (cgroup memory.stat,
/// soft-dirty pages, the overlay upper directory).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Footprint {
    /// Memory dirtied since the last checkpoint, in bytes (all resident memory if none).
    pub dirty_bytes: u64,
    /// Resident memory, in bytes.
    pub resident_bytes: u64,
    /// Filesystem bytes changed since the last checkpoint.
    pub fs_changed_bytes: u64,
}

impl Footprint {
    fn features(&self) -> [f64; N] {
        [
            1.0,
            self.dirty_bytes as f64 / GIB,
            self.resident_bytes as f64 / GIB,
            self.fs_changed_bytes as f64 / GIB,
        ]
    }
}

/// An observed checkpoint: the footprint it saved and how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CheckpointCost {
    /// The footprint at the checkpoint.
    pub footprint: Footprint,
    /// Wall time of the checkpoint, in seconds (the time the container was frozen or busy).
    pub seconds: f64,
}

/// A cost prediction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostEstimate {
    /// Expected duration, in seconds.
    pub mean_s: f64,
    /// Conservative duration: mean plus `z` prediction standard deviations, in seconds.
    pub upper_s: f64,
}

/// Online linear model `seconds = θ · [1, dirty GiB, resident GiB, fs GiB]` with θ ≥ 0.
///
/// Recursive least squares with forgetting factor λ, started at the prior θ₀ with covariance I;
/// after each update θ is projected onto θ ≥ 0 (a checkpoint never gets cheaper with more bytes).
/// The residual variance is an exponentially weighted mean of squared prediction errors; the
/// predictive standard deviation is `σ · √(1 + xᵀPx)`, so footprints unlike any seen are costed
/// more conservatively.
#[derive(Debug, Clone)]
pub struct CostModel {
    theta: [f64; N],
    p: [[f64; N]; N],
    resid_var: f64,
    lambda: f64,
    observations: u64,
}

impl CostModel {
    /// A model at `prior` with forgetting factor `lambda` in (0, 1].
    pub fn new(prior: &CostPrior, lambda: f64) -> Self {
        let mut p = [[0.0; N]; N];
        for (i, row) in p.iter_mut().enumerate() {
            row[i] = 1.0;
        }
        Self {
            theta: [
                prior.intercept_s,
                prior.s_per_gib_dirty,
                prior.s_per_gib_resident,
                prior.s_per_gib_fs,
            ],
            p,
            resid_var: prior.sd_s * prior.sd_s,
            lambda,
            observations: 0,
        }
    }

    /// Current coefficients: intercept (s), then s/GiB for dirty, resident and fs bytes.
    pub fn coefficients(&self) -> [f64; N] {
        self.theta
    }

    /// Number of checkpoints fitted.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Predicted duration of a checkpoint of `footprint`, upper bound at `z` standard deviations.
    pub fn predict(&self, footprint: &Footprint, z: f64) -> CostEstimate {
        let x = footprint.features();
        let mean_s = dot(&self.theta, &x).max(0.0);
        let px = mat_vec(&self.p, &x);
        let sd = (self.resid_var * (1.0 + dot(&x, &px).max(0.0))).sqrt();
        CostEstimate {
            mean_s,
            upper_s: mean_s + z.max(0.0) * sd,
        }
    }

    /// Fits one observed checkpoint. Non-finite or negative durations are ignored.
    pub fn observe(&mut self, cost: &CheckpointCost) {
        if !cost.seconds.is_finite() || cost.seconds < 0.0 {
            return;
        }
        let x = cost.footprint.features();
        let err = cost.seconds - dot(&self.theta, &x);
        let px = mat_vec(&self.p, &x);
        let denom = self.lambda + dot(&x, &px);
        let k: [f64; N] = std::array::from_fn(|i| px[i] / denom);
        for (t, ki) in self.theta.iter_mut().zip(k) {
            *t = (*t + ki * err).max(0.0);
        }
        // P ← (P − k (Px)ᵀ) / λ; P is symmetric so xᵀP = (Px)ᵀ.
        for (row, ki) in self.p.iter_mut().zip(k) {
            for (v, pxj) in row.iter_mut().zip(px) {
                *v = (*v - ki * pxj) / self.lambda;
            }
        }
        let max_diag = (0..N).map(|i| self.p[i][i]).fold(0.0, f64::max);
        if max_diag > P_MAX {
            let s = P_MAX / max_diag;
            self.p.iter_mut().flatten().for_each(|v| *v *= s);
        }
        const ALPHA: f64 = 0.1;
        self.resid_var = (1.0 - ALPHA) * self.resid_var + ALPHA * err * err;
        self.observations += 1;
    }
}

fn dot(a: &[f64; N], b: &[f64; N]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn mat_vec(m: &[[f64; N]; N], x: &[f64; N]) -> [f64; N] {
    std::array::from_fn(|i| dot(&m[i], x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fp(dirty_gib: f64, resident_gib: f64, fs_gib: f64) -> Footprint {
        Footprint {
            dirty_bytes: (dirty_gib * GIB) as u64,
            resident_bytes: (resident_gib * GIB) as u64,
            fs_changed_bytes: (fs_gib * GIB) as u64,
        }
    }

    #[test]
    fn prior_prediction() {
        let m = CostModel::new(&CostPrior::default(), 0.98);
        let e = m.predict(&fp(1.0, 2.0, 0.5), 0.0);
        assert!((e.mean_s - (0.3 + 1.0 + 0.2 + 0.5)).abs() < 1e-6);
        assert_eq!(e.upper_s, e.mean_s);
        assert!(m.predict(&fp(1.0, 2.0, 0.5), 1.0).upper_s > e.mean_s);
    }

    #[test]
    fn ignores_garbage() {
        let mut m = CostModel::new(&CostPrior::default(), 0.98);
        m.observe(&CheckpointCost {
            footprint: fp(1.0, 1.0, 1.0),
            seconds: f64::NAN,
        });
        m.observe(&CheckpointCost {
            footprint: fp(1.0, 1.0, 1.0),
            seconds: -1.0,
        });
        assert_eq!(m.observations(), 0);
    }

    #[test]
    fn coefficients_stay_non_negative() {
        // Data that pulls the fit negative: zero cost at a huge footprint.
        let mut m = CostModel::new(&CostPrior::default(), 0.98);
        let prior = m.predict(&fp(4.0, 8.0, 2.0), 0.0).mean_s;
        for _ in 0..50 {
            m.observe(&CheckpointCost {
                footprint: fp(4.0, 8.0, 2.0),
                seconds: 0.0,
            });
            assert!(m.coefficients().iter().all(|&c| c >= 0.0));
        }
        assert!(m.predict(&fp(4.0, 8.0, 2.0), 0.0).mean_s < prior / 2.0);
        // A smaller footprint never costs more than a larger one.
        assert!(
            m.predict(&fp(1.0, 1.0, 0.0), 0.0).mean_s <= m.predict(&fp(4.0, 8.0, 2.0), 0.0).mean_s
        );
    }

    #[test]
    fn noisy_data_with_a_free_feature() {
        // Resident memory costs nothing here; noise must not drive its coefficient negative.
        let mut m = CostModel::new(&CostPrior::default(), 0.98);
        let mut s = 1u64;
        let mut u = || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        };
        for _ in 0..500 {
            let (d, r, f) = (u() * 2.0, u() * 8.0, u());
            let y = 0.2 + 1.5 * d + 2.0 * f + (u() - 0.5) * 0.1;
            m.observe(&CheckpointCost {
                footprint: fp(d, r, f),
                seconds: y,
            });
        }
        let c = m.coefficients();
        assert!(c.iter().all(|&x| x >= 0.0), "{c:?}");
        let got = m.predict(&fp(1.0, 4.0, 0.5), 0.0).mean_s;
        assert!((got - 2.7).abs() < 0.1, "{got} {c:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn converges_on_synthetic_linear_data(
            truth in [0.0f64..1.0, 0.0f64..4.0, 0.0f64..1.0, 0.0f64..4.0],
            xs in prop::collection::vec((0.0f64..2.0, 0.0f64..8.0, 0.0f64..1.0), 200..300),
        ) {
            let mut m = CostModel::new(&CostPrior::default(), 0.98);
            for &(d, r, f) in &xs {
                let footprint = fp(d, r, f);
                let x = footprint.features();
                m.observe(&CheckpointCost { footprint, seconds: dot(&truth, &x) });
            }
            // Predictions converge on fresh points of the same range.
            for &(d, r, f) in [(0.5, 1.0, 0.1), (1.5, 6.0, 0.9), (0.0, 0.0, 0.0)].iter() {
                let footprint = fp(d, r, f);
                let want = dot(&truth, &footprint.features());
                let got = m.predict(&footprint, 0.0).mean_s;
                prop_assert!((got - want).abs() < 0.02 + 0.02 * want, "got {got} want {want} theta {:?}", m.coefficients());
            }
        }
    }
}
