//! The soak's only source of randomness: a small seeded PRNG (SplitMix64), one stream per
//! sandbox, so a seed fixes every sandbox's sequence of gaps and faults.

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, trivially seedable.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The stream of sandbox `index` under `seed`: independent of the other sandboxes' streams.
    pub fn for_sandbox(seed: u64, index: usize) -> Self {
        let mut r = Self(seed ^ (index as u64).wrapping_mul(0xa076_1d64_78bd_642f));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// A seed from the clock, for a run that was given none (it is printed, so it can be replayed).
pub fn fresh_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng::new(nanos ^ u64::from(std::process::id())).next_u64() >> 16
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn one_seed_one_sequence_and_sandboxes_differ() {
        let a: Vec<u64> = (0..4).map(|_| Rng::for_sandbox(7, 0).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            Rng::for_sandbox(7, 0).next_u64(),
            Rng::for_sandbox(7, 1).next_u64()
        );
        let mut r = Rng::new(1);
        assert!(
            (0..1000)
                .map(|_| r.range(5, 9))
                .all(|v| (5..9).contains(&v))
        );
    }
}
