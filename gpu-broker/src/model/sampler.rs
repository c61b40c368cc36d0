//! Greedy and seeded sampling with an explicit RNG state that is logged with every token, so a
//! successor resumes the exact random stream.

use crate::wire::SamplingParams;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Initial RNG state of a request.
pub fn initial_state(seed: u64, request_id: u64) -> u64 {
    let mut s = seed ^ request_id.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    splitmix(&mut s)
}

/// Index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Samples one token; advances `state` only for seeded sampling.
pub fn sample(logits: &[f32], p: &SamplingParams, state: &mut u64) -> u32 {
    if p.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    if p.top_k > 0 && (p.top_k as usize) < idx.len() {
        idx.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        idx.truncate(p.top_k as usize);
    }
    let max = idx
        .iter()
        .map(|&i| logits[i as usize])
        .fold(f32::NEG_INFINITY, f32::max);
    let t = f64::from(p.temperature);
    let w: Vec<f64> = idx
        .iter()
        .map(|&i| ((f64::from(logits[i as usize]) - f64::from(max)) / t).exp())
        .collect();
    let total: f64 = w.iter().sum();
    let u = (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64 * total;
    let mut acc = 0.0;
    for (i, wi) in idx.iter().zip(&w) {
        acc += wi;
        if u < acc {
            return *i;
        }
    }
    *idx.last().unwrap_or(&0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sampling_replays_from_a_logged_state() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let p = SamplingParams {
            temperature: 0.9,
            top_k: 20,
            seed: 3,
            max_new_tokens: 10,
        };
        let mut s = initial_state(3, 7);
        let a: Vec<u32> = (0..10).map(|_| sample(&logits, &p, &mut s)).collect();
        let mut s2 = initial_state(3, 7);
        let b1: Vec<u32> = (0..4).map(|_| sample(&logits, &p, &mut s2)).collect();
        let mut logged = s2;
        let b2: Vec<u32> = (0..6).map(|_| sample(&logits, &p, &mut logged)).collect();
        assert_eq!(a, [b1, b2].concat());
        assert!(a.iter().any(|&t| t != a[0]));
        let g = SamplingParams {
            temperature: 0.0,
            ..p
        };
        assert_eq!(sample(&logits, &g, &mut s), argmax(&logits));
    }
}
