//! The simulated machine's true checkpoint cost, which the policy under test does not know.

use scheduler::Footprint;

use crate::bench::sched::rng::Rng;

const GIB: f64 = (1u64 << 30) as f64;

/// The simulated machine's true checkpoint cost, unknown to the policy.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TrueCost {
    /// Fixed seconds per checkpoint.
    pub intercept_s: f64,
    /// Seconds per GiB dirtied since the last checkpoint.
    pub s_per_gib_dirty: f64,
    /// Seconds per GiB resident.
    pub s_per_gib_resident: f64,
    /// Seconds per GiB of files changed since the last checkpoint.
    pub s_per_gib_fs: f64,
    /// Log-space σ of multiplicative noise.
    pub noise_sigma: f64,
    /// Slow-down per other checkpoint running at the same time (shared disk and cores).
    pub contention: f64,
}

impl Default for TrueCost {
    fn default() -> Self {
        Self {
            intercept_s: 0.4,
            s_per_gib_dirty: 1.0,
            s_per_gib_resident: 0.5,
            s_per_gib_fs: 2.0,
            noise_sigma: 0.2,
            contention: 0.5,
        }
    }
}

impl TrueCost {
    /// Duration of a checkpoint of `fp` while `others` run, with noise from `rng`.
    pub fn seconds(&self, fp: &Footprint, others: u32, rng: &mut Rng) -> f64 {
        let gib = |b: u64| b as f64 / GIB;
        let base = self.intercept_s
            + self.s_per_gib_dirty * gib(fp.dirty_bytes)
            + self.s_per_gib_resident * gib(fp.resident_bytes)
            + self.s_per_gib_fs * gib(fp.fs_changed_bytes);
        base * rng.lognormal(1.0, self.noise_sigma) * (1.0 + self.contention * f64::from(others))
    }
}
