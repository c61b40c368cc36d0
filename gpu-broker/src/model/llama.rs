//! Llama forward pass over f32 weights read in place from the broker's mapping, with a paged KV
//! cache. Every row is computed the same way whatever the batch around it, so a prefill of a
//! logged prefix reproduces the KV and logits that token-by-token decoding produced, bit for bit.

use thiserror::Error;

use super::attention::{Attn, attend_row, dot};
use super::kv::{BLOCK, KvArena};
use super::layout::{Layout, LlamaConfig};

/// The weights do not match the layout.
#[derive(Debug, Error)]
#[error("weight tensor {0} is missing or outside the region")]
pub struct ModelError(pub String);

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
    debug_assert_eq!(w.len(), n * k);
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

impl<'w> Llama<'w> {
    /// Borrows the weights from `region` (the mapped weights, as f32) following `layout`.
    pub fn new(layout: &Layout, region: &'w [f32], threads: usize) -> Result<Self, ModelError> {
        let get = |name: &str| -> Result<&'w [f32], ModelError> {
            let s = layout
                .slot(name)
                .ok_or_else(|| ModelError(name.to_string()))?;
            region
                .get(s.offset..s.offset + s.len)
                .ok_or_else(|| ModelError(name.to_string()))
        };
        let c = &layout.config;
        let mut layers = Vec::with_capacity(c.n_layers);
        for l in 0..c.n_layers {
            let t = |n: &str| get(&format!("blk.{l}.{n}.weight"));
            layers.push(Layer {
                attn_norm: t("attn_norm")?,
                wq: t("attn_q")?,
                wk: t("attn_k")?,
                wv: t("attn_v")?,
                wo: t("attn_output")?,
                ffn_norm: t("ffn_norm")?,
                wg: t("ffn_gate")?,
                wu: t("ffn_up")?,
                wd: t("ffn_down")?,
            });
        }
        let embed = get("token_embd.weight")?;
        let head = if layout.slot("output.weight").is_some() {
            get("output.weight")?
        } else {
            embed
        };
        Ok(Self {
            cfg: c.clone(),
            embed,
            layers,
            out_norm: get("output_norm.weight")?,
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
