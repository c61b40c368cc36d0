//! A small seeded PRNG (xoshiro256**, seeded by SplitMix64) and the distributions the simulator
//! draws from. Self-contained so that a seed gives the same traces on every build.

/// Mixes words into one seed (SplitMix64 finalizer over a running hash).
pub fn mix(words: &[u64]) -> u64 {
    let mut h = 0x243F_6A88_85A3_08D3u64;
    for &w in words {
        h = splitmix(&mut (h ^ w));
    }
    h
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256** generator.
#[derive(Debug, Clone)]
pub struct Rng([u64; 4]);

impl Rng {
    /// A generator seeded from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        Self(std::array::from_fn(|_| splitmix(&mut x)))
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let out = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        out
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn int(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit();
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Lognormal with the given median and log-space σ.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }

    /// Log-uniform in [lo, hi).
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + (hi.ln() - lo.ln()) * self.unit()).exp()
    }

    /// Poisson with mean `mean` (Knuth; the simulator's means are small).
    pub fn poisson(&mut self, mean: f64) -> u64 {
        let l = (-mean).exp();
        let mut k = 0;
        let mut p = self.unit();
        while p > l {
            k += 1;
            p *= self.unit();
        }
        k
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_roughly_uniform() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<f64> = (0..10_000).map(|_| a.unit()).collect();
        assert!(xs.iter().all(|&x| x == b.unit() && (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02);
    }

    #[test]
    fn lognormal_median_and_poisson_mean() {
        let mut r = Rng::new(1);
        let mut v: Vec<f64> = (0..20_001).map(|_| r.lognormal(6.0, 0.8)).collect();
        v.sort_by(f64::total_cmp);
        assert!((v[10_000] - 6.0).abs() < 0.3);
        let n: u64 = (0..20_000).map(|_| r.poisson(0.7)).sum();
        assert!((n as f64 / 20_000.0 - 0.7).abs() < 0.03);
    }
}
