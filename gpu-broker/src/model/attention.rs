//! Causal attention of one query row over its request's paged KV. Grouped-query heads share each
//! key/value load; the per-(head, key) arithmetic has a fixed order, so a row's result does not
//! depend on the batch it is computed in. An AVX2 build of the same code is used when the CPU has
//! it (identical results: no FMA contraction, same lane order).

use super::kv::{BLOCK, KvGeom};

/// Everything a row needs besides its own query and block table.
pub struct Attn<'a> {
    /// The KV arena's floats.
    pub data: &'a [f32],
    /// Page geometry.
    pub geom: KvGeom,
    /// Layer index.
    pub layer: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
}

#[inline(always)]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `x ← exp(x - max)` for every element (inputs ≤ max), branch-free so it vectorizes: Cody–Waite
/// reduction by ln 2 and a degree-6 polynomial (relative error ≈ 2e-7).
#[inline(always)]
fn exp_shifted(xs: &mut [f32], max: f32) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    for x in xs.iter_mut() {
        let v = (*x - max).max(-87.0);
        let n = (v * LOG2E + 0.5).floor();
        let r = v - n * LN2_HI - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
        let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
        *x = p * scale;
    }
}

#[inline(always)]
fn row_body(
    a: &Attn<'_>,
    table: &[u32],
    pos: usize,
    q: &[f32],
    o: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let hd = a.head_dim;
    let group = a.n_heads / a.n_kv_heads;
    let kv_dim = a.n_kv_heads * hd;
    let n = pos + 1;
    let scale = 1.0 / (hd as f32).sqrt();
    scores.clear();
    scores.resize(group * n, 0.0);
    let mut sums = vec![0f32; group];
    for g in 0..a.n_kv_heads {
        let qs = &q[g * group * hd..(g + 1) * group * hd];
        for (blk, &page) in table.iter().enumerate().take(n.div_ceil(BLOCK)) {
            let kbase = a.geom.offset(page, a.layer, false, 0) + g * hd;
            let first = blk * BLOCK;
            for t in first..n.min(first + BLOCK) {
                let ko = kbase + (t - first) * kv_dim;
                let k = &a.data[ko..ko + hd];
                for j in 0..group {
                    scores[j * n + t] = dot(&qs[j * hd..(j + 1) * hd], k) * scale;
                }
            }
        }
        for j in 0..group {
            let s = &mut scores[j * n..(j + 1) * n];
            let max = s.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            exp_shifted(s, max);
            let mut sum = 0f32;
            for &x in s.iter() {
                sum += x;
            }
            sums[j] = sum;
        }
        let os = &mut o[g * group * hd..(g + 1) * group * hd];
        os.fill(0.0);
        for (blk, &page) in table.iter().enumerate().take(n.div_ceil(BLOCK)) {
            let vbase = a.geom.offset(page, a.layer, true, 0) + g * hd;
            let first = blk * BLOCK;
            for t in first..n.min(first + BLOCK) {
                let vo = vbase + (t - first) * kv_dim;
                let v = &a.data[vo..vo + hd];
                for j in 0..group {
                    let p = scores[j * n + t] / sums[j];
                    for (x, y) in os[j * hd..(j + 1) * hd].iter_mut().zip(v) {
                        *x += p * y;
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn row_avx2(
    a: &Attn<'_>,
    table: &[u32],
    pos: usize,
    q: &[f32],
    o: &mut [f32],
    scores: &mut Vec<f32>,
) {
    row_body(a, table, pos, q, o, scores);
}

/// Attention output `o` (all heads) for the query `q` at position `pos`.
pub fn attend_row(
    a: &Attn<'_>,
    table: &[u32],
    pos: usize,
    q: &[f32],
    o: &mut [f32],
    scores: &mut Vec<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above), the only requirement of row_avx2.
        unsafe { row_avx2(a, table, pos, q, o, scores) };
        return;
    }
    row_body(a, table, pos, q, o, scores);
}

#[cfg(test)]
mod tests {
    use super::exp_shifted;

    #[test]
    fn polynomial_exp_is_accurate() {
        let mut xs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
        let want: Vec<f32> = xs.iter().map(|x| x.exp()).collect();
        exp_shifted(&mut xs, 0.0);
        for (g, w) in xs.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-6 * w.max(1e-30) + 1e-37, "{g} vs {w}");
        }
    }
}
