//! The property takeover correctness rests on: a row's result does not depend on how it is
//! batched. Prefill of a prefix gives bit-identical logits to token-by-token decoding, alone or
//! next to other requests.

mod common;

use gpu_broker::model::gguf::Gguf;
use gpu_broker::model::kv::{KvArena, KvGeom};
use gpu_broker::model::layout::{Layout, dequantize_into};
use gpu_broker::model::llama::{Llama, Row};

#[test]
fn prefill_and_decode_give_bit_identical_logits_in_any_batch() {
    let g = Gguf::open(&common::model()).unwrap();
    let layout = Layout::from_gguf(&g).unwrap();
    let mut w = vec![0f32; layout.total];
    assert!(dequantize_into(&g, &layout, &mut w, 2));
    drop(g);
    let model = Llama::new(&layout, &w, 2).unwrap();
    let c = &layout.config;
    let geom = KvGeom {
        layers: c.n_layers,
        kv_dim: c.kv_dim(),
    };
    let mut buf = vec![0f32; geom.page_floats() * 13];
    let mut kv = KvArena {
        data: &mut buf,
        geom,
    };
    let a: Vec<u32> = (0..24).map(|i| 300 + (i * 7919) % 40000).collect();
    let b: Vec<u32> = (0..20).map(|i| 500 + (i * 104_729) % 40000).collect();
    let tables = vec![vec![0, 1], vec![3, 4], vec![5, 6], vec![8, 9]];
    let rows = |seq: usize, toks: &[u32], from: usize, all: bool| -> Vec<Row> {
        (from..toks.len())
            .map(|p| Row {
                seq,
                pos: p,
                token: toks[p],
                logits: all || p + 1 == toks.len(),
            })
            .collect()
    };

    // (1) Request a alone, one forward over the whole prefix, logits everywhere.
    let prefill = model.forward(&mut kv, &tables, &rows(0, &a, 0, true));
    // (2) Request a decoded token by token (seq 2), batched with request b (seq 3) prefilling.
    let mut decoded = Vec::new();
    for (p, &tok) in a.iter().enumerate() {
        let mut rs = vec![Row {
            seq: 2,
            pos: p,
            token: tok,
            logits: true,
        }];
        if p == 3 {
            rs.extend(rows(3, &b, 0, false));
        }
        let out = model.forward(&mut kv, &tables, &rs);
        decoded.push(out[0].clone());
    }
    for (p, (x, y)) in prefill.iter().zip(&decoded).enumerate() {
        assert!(
            x.iter().zip(y).all(|(u, v)| u.to_bits() == v.to_bits()),
            "position {p}: prefill and decode logits differ"
        );
    }
    // (3) Rebuild-style: the prefix without logits, then the last token alone, in fresh pages.
    let n = a.len();
    let rebuilt = vec![vec![10, 11]];
    model.forward(&mut kv, &rebuilt, &rows(0, &a[..n - 1], 0, false));
    let last = model.forward(
        &mut kv,
        &rebuilt,
        &[Row {
            seq: 0,
            pos: n - 1,
            token: a[n - 1],
            logits: true,
        }],
    );
    assert!(
        last[0]
            .iter()
            .zip(&prefill[n - 1])
            .all(|(u, v)| u.to_bits() == v.to_bits()),
        "rebuild + last token differs from the original logits"
    );
}
