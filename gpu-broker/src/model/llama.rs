//! Llama forward pass over f32 weights read in place from the broker's mapping, with a paged KV
//! cache. Every row is computed the same way whatever the batch around it, so a prefill of a
//! logged prefix reproduces the KV and logits that token-by-token decoding produced, bit for bit.

use thiserror::Error;

use super::attention::{Attn, attend_row, dot};
use super::kv::{BLOCK, KvArena};
use super::layout::{Layout, LlamaConfig};

/// The weights do not match the layout.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A tensor is missing from the layout or lies outside the region.
    #[error("weight tensor {0} is missing or outside the region")]
    Missing(String),
    /// A tensor's length is not what the configuration's dimensions make it.
    #[error("weight tensor {name} holds {len} values, but the configuration implies {want}")]
    Shape {
        /// Tensor name.
        name: String,
        /// Its length in the layout.
        len: usize,
        /// Product of its configured dimensions.
        want: usize,
    },
    /// The configuration's dimensions are inconsistent or overflow.
    #[error("model configuration is inconsistent: {0}")]
    Config(&'static str),
}

struct Layer<'w> {
    attn_norm: &'w [f32],
    wq: &'w [f32],
    wk: &'w [f32],
    wv: &'w [f32],
    wo: &'w [f32],
    ffn_norm: &'w [f32],
    wg: &'w [f32],
    wu: &'w [f32],
    wd: &'w [f32],
}

/// A model whose weights are borrowed from a mapped region.
pub struct Llama<'w> {
    /// Hyper-parameters.
    pub cfg: LlamaConfig,
    embed: &'w [f32],
    layers: Vec<Layer<'w>>,
    out_norm: &'w [f32],
    head: &'w [f32],
    threads: usize,
}

/// One token to process: request `seq` (index into the block tables) at position `pos`.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Index of the request's block table.
    pub seq: usize,
    /// Position in the sequence.
    pub pos: usize,
    /// Input token.
    pub token: u32,
    /// Whether to return logits for this row.
    pub logits: bool,
}

/// Rows per forward chunk (bounds scratch memory).
const CHUNK: usize = 512;

fn matmul(threads: usize, x: &[f32], m: usize, k: usize, w: &[f32], n: usize, out: &mut [f32]) {
    // out[m×n] = x[m×k] · wᵀ, w row-major [n×k]. Rows are split among threads; each output
    // element's accumulation order depends only on k, never on m or on the split.
    // The unsafe sgemm below relies on these lengths.
    assert!(
        k > 0 && w.len() == n * k && x.len() == m * k && out.len() == m * n,
        "matmul shapes: x {} for {m}×{k}, w {} for {n}×{k}, out {} for {m}×{n}",
        x.len(),
        w.len(),
        out.len()
    );
    let per = m.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (xc, oc) in x.chunks(per * k).zip(out.chunks_mut(per * n)) {
            let rows = xc.len() / k;
            let mut run = move || {
                // SAFETY: xc is rows×k, w is n×k read with strides (1, k) as a k×n matrix, oc is
                // rows×n; all three slices are at least as long as the strides imply.
                unsafe {
                    matrixmultiply::sgemm(
                        rows,
                        k,
                        n,
                        1.0,
                        xc.as_ptr(),
                        k as isize,
                        1,
                        w.as_ptr(),
                        1,
                        k as isize,
                        0.0,
                        oc.as_mut_ptr(),
                        n as isize,
                        1,
                    )
                }
            };
            if rows == m {
                run();
            } else {
                s.spawn(run);
            }
        }
    });
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let d = w.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss = dot(xr, xr) / d as f32;
        let r = 1.0 / (ss + eps).sqrt();
        for i in 0..d {
            or[i] = xr[i] * r * w[i];
        }
    }
}

fn rope(v: &mut [f32], pos: usize, head_dim: usize, theta: f32) {
    for h in v.chunks_exact_mut(head_dim) {
        for i in 0..head_dim / 2 {
            let f = (theta as f64).powf(-((2 * i) as f64) / head_dim as f64);
            let a = pos as f64 * f;
            let (s, c) = (a.sin() as f32, a.cos() as f32);
            let (x0, x1) = (h[2 * i], h[2 * i + 1]);
            h[2 * i] = x0 * c - x1 * s;
            h[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

/// Lengths of the matrices, in f32 values, that a configuration implies.
struct Dims {
    dim_dim: usize,
    kv_dim: usize,
    ffn_dim: usize,
    vocab_dim: usize,
}

/// Checks that the dimensions agree with each other (heads tile the hidden size, query heads
/// group over key/value heads) and that every matrix size is representable.
fn check_config(c: &LlamaConfig) -> Result<Dims, ModelError> {
    if [
        c.n_layers,
        c.dim,
        c.ffn,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.vocab,
    ]
    .contains(&0)
    {
        return Err(ModelError::Config("a dimension is zero"));
    }
    if c.n_heads.checked_mul(c.head_dim) != Some(c.dim) {
        return Err(ModelError::Config("n_heads × head_dim is not dim"));
    }
    if !c.n_heads.is_multiple_of(c.n_kv_heads) {
        return Err(ModelError::Config(
            "n_heads is not a multiple of n_kv_heads",
        ));
    }
    let mul = |a: usize, b: usize| {
        a.checked_mul(b)
            .ok_or(ModelError::Config("a matrix size overflows"))
    };
    Ok(Dims {
        dim_dim: mul(c.dim, c.dim)?,
        kv_dim: mul(mul(c.n_kv_heads, c.head_dim)?, c.dim)?,
        ffn_dim: mul(c.ffn, c.dim)?,
        vocab_dim: mul(c.vocab, c.dim)?,
    })
}

impl<'w> Llama<'w> {
    /// Borrows the weights from `region` (the mapped weights, as f32) following `layout`. Every
    /// tensor must lie inside the region and have exactly the length the configuration's
    /// dimensions give it.
    pub fn new(layout: &Layout, region: &'w [f32], threads: usize) -> Result<Self, ModelError> {
        let c = &layout.config;
        let dims = check_config(c)?;
        let get = |name: &str, want: usize| -> Result<&'w [f32], ModelError> {
            let missing = || ModelError::Missing(name.to_string());
            let s = layout.slot(name).ok_or_else(missing)?;
            if s.len != want {
                return Err(ModelError::Shape {
                    name: name.to_string(),
                    len: s.len,
                    want,
                });
            }
            let end = s.offset.checked_add(s.len).ok_or_else(missing)?;
            region.get(s.offset..end).ok_or_else(missing)
        };
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let t = |n: &str, want: usize| get(&format!("blk.{l}.{n}.weight"), want);
            layers.push(Layer {
                attn_norm: t("attn_norm", c.dim)?,
                wq: t("attn_q", dims.dim_dim)?,
                wk: t("attn_k", dims.kv_dim)?,
                wv: t("attn_v", dims.kv_dim)?,
                wo: t("attn_output", dims.dim_dim)?,
                ffn_norm: t("ffn_norm", c.dim)?,
                wg: t("ffn_gate", dims.ffn_dim)?,
                wu: t("ffn_up", dims.ffn_dim)?,
                wd: t("ffn_down", dims.ffn_dim)?,
            });
        }
        let embed = get("token_embd.weight", dims.vocab_dim)?;
        let head = if layout.slot("output.weight").is_some() {
            get("output.weight", dims.vocab_dim)?
        } else {
            embed
        };
        Ok(Self {
            cfg: c.clone(),
            embed,
            layers,
            out_norm: get("output_norm.weight", c.dim)?,
            head,
            threads: threads.max(1),
        })
    }

    /// Runs `rows` (any mix of prefill and decode rows of any requests), writing their K/V into
    /// the pages named by `tables[row.seq]`, and returns logits for rows with `logits` set, in
    /// row order.
    pub fn forward(
        &self,
        kv: &mut KvArena<'_>,
        tables: &[Vec<u32>],
        rows: &[Row],
    ) -> Vec<Vec<f32>> {
        let mut out = Vec::new();
        for chunk in rows.chunks(CHUNK) {
            out.extend(self.forward_chunk(kv, tables, chunk));
        }
        out
    }

    fn forward_chunk(
        &self,
        kv: &mut KvArena<'_>,
        tables: &[Vec<u32>],
        rows: &[Row],
    ) -> Vec<Vec<f32>> {
        let c = &self.cfg;
        let (m, d, kvd, hd) = (rows.len(), c.dim, c.kv_dim(), c.head_dim);
        let mut x = vec![0f32; m * d];
        for (r, row) in rows.iter().enumerate() {
            let t = (row.token as usize).min(c.vocab - 1);
            x[r * d..(r + 1) * d].copy_from_slice(&self.embed[t * d..(t + 1) * d]);
        }
        let mut h = vec![0f32; m * d];
        let mut q = vec![0f32; m * d];
        let mut k = vec![0f32; m * kvd];
        let mut v = vec![0f32; m * kvd];
        let mut att = vec![0f32; m * d];
        let mut o = vec![0f32; m * d];
        let mut g = vec![0f32; m * c.ffn];
        let mut u = vec![0f32; m * c.ffn];
        let th = self.threads;
        for (l, w) in self.layers.iter().enumerate() {
            rmsnorm(&x, w.attn_norm, c.eps, &mut h);
            matmul(th, &h, m, d, w.wq, d, &mut q);
            matmul(th, &h, m, d, w.wk, kvd, &mut k);
            matmul(th, &h, m, d, w.wv, kvd, &mut v);
            for (r, row) in rows.iter().enumerate() {
                rope(&mut q[r * d..(r + 1) * d], row.pos, hd, c.rope_theta);
                rope(&mut k[r * kvd..(r + 1) * kvd], row.pos, hd, c.rope_theta);
                let page = tables[row.seq][row.pos / BLOCK];
                let slot = row.pos % BLOCK;
                let ko = kv.geom.offset(page, l, false, slot);
                kv.data[ko..ko + kvd].copy_from_slice(&k[r * kvd..(r + 1) * kvd]);
                let vo = kv.geom.offset(page, l, true, slot);
                kv.data[vo..vo + kvd].copy_from_slice(&v[r * kvd..(r + 1) * kvd]);
            }
            self.attention(kv, tables, rows, l, &q, &mut att);
            matmul(th, &att, m, d, w.wo, d, &mut o);
            for i in 0..m * d {
                x[i] += o[i];
            }
            rmsnorm(&x, w.ffn_norm, c.eps, &mut h);
            matmul(th, &h, m, d, w.wg, c.ffn, &mut g);
            matmul(th, &h, m, d, w.wu, c.ffn, &mut u);
            for (gi, ui) in g.iter_mut().zip(&u) {
                *gi = *gi / (1.0 + (-*gi).exp()) * ui;
            }
            matmul(th, &g, m, c.ffn, w.wd, d, &mut o);
            for i in 0..m * d {
                x[i] += o[i];
            }
        }
        let picked: Vec<usize> = (0..m).filter(|&r| rows[r].logits).collect();
        if picked.is_empty() {
            return Vec::new();
        }
        let mut xs = Vec::with_capacity(picked.len() * d);
        for &r in &picked {
            xs.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        let mut hn = vec![0f32; xs.len()];
        rmsnorm(&xs, self.out_norm, c.eps, &mut hn);
        let mut logits = vec![0f32; picked.len() * c.vocab];
        matmul(th, &hn, picked.len(), d, self.head, c.vocab, &mut logits);
        logits.chunks_exact(c.vocab).map(<[f32]>::to_vec).collect()
    }

    fn attention(
        &self,
        kv: &KvArena<'_>,
        tables: &[Vec<u32>],
        rows: &[Row],
        l: usize,
        q: &[f32],
        out: &mut [f32],
    ) {
        let c = &self.cfg;
        let d = c.dim;
        let a = Attn {
            data: kv.data,
            geom: kv.geom,
            layer: l,
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        };
        let per = rows.len().div_ceil(self.threads).max(1);
        std::thread::scope(|s| {
            for (ci, oc) in out.chunks_mut(per * d).enumerate() {
                let a = &a;
                let mut work = move || {
                    let mut scores = Vec::new();
                    for (i, o) in oc.chunks_exact_mut(d).enumerate() {
                        let r = ci * per + i;
                        let row = rows[r];
                        let qr = &q[r * d..(r + 1) * d];
                        attend_row(a, &tables[row.seq], row.pos, qr, o, &mut scores);
                    }
                };
                if per >= rows.len() {
                    work();
                } else {
                    s.spawn(work);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::layout::{Slot, tensor_names};

    fn config() -> LlamaConfig {
        LlamaConfig {
            n_layers: 1,
            dim: 8,
            ffn: 12,
            n_heads: 2,
            n_kv_heads: 1,
            head_dim: 4,
            vocab: 10,
            rope_theta: 10000.0,
            eps: 1e-5,
        }
    }

    /// A packed layout of `c`'s tensors with the lengths `len` gives them.
    fn layout(c: &LlamaConfig, len: impl Fn(&str) -> usize) -> Layout {
        let mut slots = Vec::new();
        let mut at = 0;
        for name in tensor_names(c) {
            let n = len(&name);
            slots.push(Slot {
                name,
                offset: at,
                len: n,
            });
            at += n;
        }
        Layout {
            config: c.clone(),
            slots,
            total: at,
            version: 1,
        }
    }

    fn true_len(c: &LlamaConfig, name: &str) -> usize {
        let kv = c.n_kv_heads * c.head_dim;
        let t = name.trim_end_matches(".weight").rsplit('.').next().unwrap();
        match t {
            "token_embd" => c.vocab * c.dim,
            "attn_norm" | "ffn_norm" | "output_norm" => c.dim,
            "attn_q" | "attn_output" => c.dim * c.dim,
            "attn_k" | "attn_v" => kv * c.dim,
            "ffn_gate" | "ffn_up" | "ffn_down" => c.ffn * c.dim,
            _ => unreachable!("{name}"),
        }
    }

    #[test]
    fn slots_must_match_the_configured_dimensions() {
        let c = config();
        let l = layout(&c, |n| true_len(&c, n));
        let w = vec![0.01f32; l.total];
        assert!(Llama::new(&l, &w, 1).is_ok());
        // The GGUF left out head_count_kv: the config assumes as many K/V heads as query heads,
        // but the tensors were made for one.
        let mut wrong = c.clone();
        wrong.n_kv_heads = 2;
        let l = layout(&c, |n| true_len(&c, n));
        let l = Layout { config: wrong, ..l };
        assert!(matches!(
            Llama::new(&l, &w, 1),
            Err(ModelError::Shape { name, len: 32, want: 64 }) if name == "blk.0.attn_k.weight"
        ));
        // A head count that does not tile the hidden size.
        let mut wrong = c.clone();
        wrong.head_dim = 3;
        let l = Layout {
            config: wrong,
            ..layout(&c, |n| true_len(&c, n))
        };
        assert!(matches!(Llama::new(&l, &w, 1), Err(ModelError::Config(_))));
        // Dimensions whose product overflows.
        let mut wrong = c.clone();
        wrong.vocab = usize::MAX / 2;
        let l = Layout {
            config: wrong,
            ..layout(&c, |n| true_len(&c, n))
        };
        assert!(matches!(Llama::new(&l, &w, 1), Err(ModelError::Config(_))));
    }

    #[test]
    #[should_panic(expected = "matmul shapes")]
    fn matmul_refuses_a_short_weight_matrix() {
        let x = vec![1f32; 2 * 4];
        let w = vec![1f32; 3 * 4 - 1];
        let mut out = vec![0f32; 2 * 3];
        matmul(1, &x, 2, 4, &w, 3, &mut out);
    }
}
