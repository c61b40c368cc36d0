//! The worker's logits against candle's `quantized_llama` (an independent implementation) on the
//! same GGUF. Run with `--features candle`. Tolerance: max |Δlogit| ≤ 1e-4 · max(1, max |logit|),
//! and the same argmax at every position (candle dequantizes every tensor to f32 here via
//! `CANDLE_DEQUANTIZE_ALL=1`, so both sides compute in f32).
#![cfg(feature = "candle")]

use candle_core::{Device, Tensor};
use candle_transformers::models::quantized_llama::ModelWeights;
use gpu_broker::model::gguf::Gguf;
use gpu_broker::model::kv::{KvArena, KvGeom};
use gpu_broker::model::layout::{Layout, dequantize_into};
use gpu_broker::model::llama::{Llama, Row};
use gpu_broker::model::sampler::argmax;

const TOL: f32 = 1e-4;

#[test]
fn logits_match_candle_quantized_llama() {
    let path = gpu_broker::worker::model_path();
    assert!(
        path.is_file(),
        "model file {} is missing: run gpu-broker/scripts/fetch-model",
        path.display()
    );
    // SAFETY: this test binary holds this single test; no other thread touches the environment.
    unsafe { std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1") };

    let g = Gguf::open(&path).unwrap();
    let layout = Layout::from_gguf(&g).unwrap();
    let mut w = vec![0f32; layout.total];
    assert!(dequantize_into(&g, &layout, &mut w, 2));
    drop(g);
    let ours = Llama::new(&layout, &w, 2).unwrap();
    let c = &layout.config;
    let geom = KvGeom {
        layers: c.n_layers,
        kv_dim: c.kv_dim(),
    };
    let mut kvbuf = vec![0f32; geom.page_floats() * 4];
    let mut kv = KvArena {
        data: &mut kvbuf,
        geom,
    };
    let tables = vec![vec![0u32, 1, 2, 3]];
    // A chat-shaped prompt (special tokens 1 and 2 around ordinary ids), then decode steps.
    let prompt: Vec<u32> = vec![
        1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
    ];

    let dev = Device::Cpu;
    let mut f = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f).unwrap();
    let mut theirs = ModelWeights::from_gguf(content, &mut f, &dev).unwrap();

    let mut worst = 0f32;
    let mut check = |a: &[f32], b: &[f32], pos: usize| {
        let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
        let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst = worst.max(d / scale);
        assert!(
            d <= TOL * scale,
            "position {pos}: max |Δlogit| {d} > {TOL}·{scale}"
        );
        assert_eq!(argmax(a), argmax(b), "position {pos}: argmax differs");
    };

    // Prefill: our rows for the whole prompt, candle's forward over the prompt (last logits).
    let rows: Vec<Row> = prompt
        .iter()
        .enumerate()
        .map(|(p, &t)| Row {
            seq: 0,
            pos: p,
            token: t,
            logits: p + 1 == prompt.len(),
        })
        .collect();
    let a = ours.forward(&mut kv, &tables, &rows).pop().unwrap();
    let input = Tensor::new(prompt.as_slice(), &dev)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let b: Vec<f32> = theirs
        .forward(&input, 0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    check(&a, &b, prompt.len() - 1);

    // Decode: feed the argmax token by token through both KV caches.
    let mut next = argmax(&a);
    for step in 0..12 {
        let pos = prompt.len() + step;
        let a = ours
            .forward(
                &mut kv,
                &tables,
                &[Row {
                    seq: 0,
                    pos,
                    token: next,
                    logits: true,
                }],
            )
            .pop()
            .unwrap();
        let input = Tensor::new(&[next], &dev).unwrap().unsqueeze(0).unwrap();
        let b: Vec<f32> = theirs
            .forward(&input, pos)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        check(&a, &b, pos);
        next = argmax(&a);
    }
    eprintln!("worst relative |Δlogit| = {worst:e} (tolerance {TOL:e})");
}
