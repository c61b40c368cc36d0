//! Model configuration and the layout of dequantized f32 weights inside the broker's region.
//! The layout travels as the region's metadata so a shadow needs no model file.

use serde::{Deserialize, Serialize};

use super::dequant;
use super::gguf::{Gguf, GgufError};

/// Llama hyper-parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub n_layers: usize,
    /// Hidden size.
    pub dim: usize,
    /// MLP inner size.
    pub ffn: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base.
    pub rope_theta: f32,
    /// RMSNorm epsilon.
    pub eps: f32,
}

impl LlamaConfig {
    /// A model of no layers and one-wide everything: for tests of layouts, not of the math.
    #[cfg(test)]
    pub(crate) fn unit() -> Self {
        Self {
            n_layers: 0,
            dim: 1,
            ffn: 1,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 1,
            vocab: 1,
            rope_theta: 1.0,
            eps: 1.0,
        }
    }

    /// Key/value width per token and layer.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Reads the config from GGUF metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self, GgufError> {
        let dim = g.int("llama.embedding_length")? as usize;
        let n_heads = g.int("llama.attention.head_count")? as usize;
        let vocab = g
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| GgufError::Missing("token_embd.weight".into()))?
            as usize;
        Ok(Self {
            n_layers: g.int("llama.block_count")? as usize,
            dim,
            ffn: g.int("llama.feed_forward_length")? as usize,
            n_heads,
            n_kv_heads: g
                .int("llama.attention.head_count_kv")
                .unwrap_or(n_heads as i64) as usize,
            head_dim: dim / n_heads,
            vocab,
            rope_theta: g.float("llama.rope.freq_base").unwrap_or(10000.0) as f32,
            eps: g.float("llama.attention.layer_norm_rms_epsilon")? as f32,
        })
    }
}

/// One tensor's place in the region, in f32 elements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slot {
    /// Tensor name.
    pub name: String,
    /// Offset in f32 elements.
    pub offset: usize,
    /// Length in f32 elements.
    pub len: usize,
}

/// Where every tensor lives in the weights region.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Layout {
    /// Hyper-parameters.
    pub config: LlamaConfig,
    /// Tensors.
    pub slots: Vec<Slot>,
    /// Region size in f32 elements.
    pub total: usize,
    /// Weight version tag (derived from the GGUF bytes).
    pub version: u64,
}

const ALIGN: usize = 16;

/// Names of the tensors the forward pass reads, in region order.
pub fn tensor_names(c: &LlamaConfig) -> Vec<String> {
    let mut v = vec!["token_embd.weight".to_string()];
    for l in 0..c.n_layers {
        for t in [
            "attn_norm",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            v.push(format!("blk.{l}.{t}.weight"));
        }
    }
    v.push("output_norm.weight".into());
    v
}

impl Layout {
    /// Lays out the GGUF's tensors (plus `output.weight` when the head is not tied).
    pub fn from_gguf(g: &Gguf) -> Result<Self, GgufError> {
        let config = LlamaConfig::from_gguf(g)?;
        let mut names = tensor_names(&config);
        if g.tensor("output.weight").is_some() {
            names.push("output.weight".into());
        }
        let mut slots = Vec::new();
        let mut at = 0;
        for n in names {
            let t = g.tensor(&n).ok_or_else(|| GgufError::Missing(n.clone()))?;
            if dequant::byte_size(t.ty, t.elements()).is_none() {
                return Err(GgufError::Corrupt("unsupported tensor type"));
            }
            slots.push(Slot {
                name: n,
                offset: at,
                len: t.elements(),
            });
            at += t.elements().div_ceil(ALIGN) * ALIGN;
        }
        let head = &g.data[..g.data.len().min(1 << 20)];
        let version = crate::checksum::checksum(head) ^ g.data.len() as u64;
        Ok(Self {
            config,
            slots,
            total: at,
            version,
        })
    }

    /// The slot of a tensor.
    pub fn slot(&self, name: &str) -> Option<&Slot> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// Region size in bytes, `None` if it overflows (a corrupt or hostile layout).
    pub fn bytes(&self) -> Option<usize> {
        self.total.checked_mul(4)
    }

    /// Serialized form for the region metadata.
    pub fn to_meta(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses region metadata.
    pub fn from_meta(b: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(b)
    }
}

/// Dequantizes every tensor of `g` into `dst` (the mapped weights region), on `threads` threads.
pub fn dequantize_into(g: &Gguf, layout: &Layout, dst: &mut [f32], threads: usize) -> bool {
    let mut jobs: Vec<(&Slot, &mut [f32])> = Vec::new();
    let mut rest = dst;
    let mut base = 0;
    for s in &layout.slots {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(s.offset - base);
        let (mine, tail) = tail.split_at_mut(s.len);
        jobs.push((s, mine));
        rest = tail;
        base = s.offset + s.len;
    }
    let threads = threads.max(1);
    let mut buckets: Vec<Vec<(&Slot, &mut [f32])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, j) in jobs.into_iter().enumerate() {
        buckets[i % threads].push(j);
    }
    std::thread::scope(|sc| {
        let hs: Vec<_> = buckets
            .into_iter()
            .map(|b| {
                sc.spawn(move || {
                    b.into_iter().all(|(s, d)| match g.tensor(&s.name) {
                        Some(t) => dequant::dequantize(t.ty, g.tensor_bytes(t), d),
                        None => false,
                    })
                })
            })
            .collect();
        hs.into_iter().all(|h| h.join().unwrap_or(false))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_whose_size_overflows_has_no_byte_size() {
        let mut l = Layout {
            config: LlamaConfig::unit(),
            slots: Vec::new(),
            total: 100,
            version: 0,
        };
        assert_eq!(l.bytes(), Some(400));
        l.total = usize::MAX / 4 + 2;
        assert_eq!(l.bytes(), None);
    }
}
