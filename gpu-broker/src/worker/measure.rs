//! Rebuild-cost measurement: attaches as primary and times `Engine::rebuild` (the exact code a
//! promoted shadow runs) for a grid of in-flight request counts and lengths.

use std::path::Path;
use std::time::Instant;

use super::engine::{Engine, Req};
use super::{WorkerError, geom_of, kv_view, map_kv, weights};
use crate::client::Client;
use crate::model::kv::{KvArena, pages_for};
use crate::model::llama::Llama;
use crate::wire::{Role, SamplingParams};

/// Times the rebuild of `requests` × `tokens` for each point; returns seconds per point.
pub fn rebuild_times(
    socket: &Path,
    model: &Path,
    threads: usize,
    points: &[(usize, usize)],
) -> Result<Vec<f64>, WorkerError> {
    let client = Client::connect(socket, Role::Primary, 0).map_err(WorkerError::Client)?;
    let max_pages = points
        .iter()
        .map(|&(n, t)| n * pages_for(t + 1))
        .max()
        .unwrap_or(0);
    let regions = client.manifest().map_err(WorkerError::Client)?;
    let published = weights::published(&regions)
        .map(weights::MappedWeights::map)
        .transpose()?;
    let (page_bytes, gguf) = super::page_bytes_of(published.as_ref(), model)?;
    let grant = client
        .acquire(page_bytes, max_pages as u32)
        .map_err(WorkerError::Client)?;
    let w = match published {
        Some(w) if grant.weights_ok => w,
        _ => weights::cold_load(&client, model, gguf, threads)?.0,
    };
    let geom = geom_of(&w);
    let _hb = client.start_heartbeat(std::time::Duration::from_millis(500));
    let regions = client.manifest().map_err(WorkerError::Client)?;
    let mut kv_map = map_kv(&regions, geom)?;
    let model = Llama::new(&w.layout, w.floats(), threads)
        .map_err(|e| WorkerError::Protocol(e.to_string()))?;
    let mut out = Vec::new();
    for &(n, t) in points {
        let mut engine = Engine::new(geom, &grant.pages);
        for i in 0..n {
            let mut s = 0x1234_5678u64 ^ (i as u64) << 20;
            let tokens: Vec<u32> = (0..t)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (300 + s % 48_000) as u32
                })
                .collect();
            engine.add(Req {
                id: i as u64 + 1,
                params: SamplingParams {
                    temperature: 0.0,
                    top_k: 0,
                    seed: 0,
                    max_new_tokens: 1,
                },
                prompt_len: t,
                tokens,
                kv_len: 0,
                rng: 0,
                table: Vec::new(),
            })?;
        }
        let mut kv = KvArena {
            data: kv_view(&mut kv_map),
            geom,
        };
        let t0 = Instant::now();
        engine.rebuild(&model, &mut kv);
        out.push(t0.elapsed().as_secs_f64());
        tracing::info!(
            requests = n,
            tokens = t,
            seconds = out[out.len() - 1],
            "rebuild measured"
        );
    }
    drop(_hb);
    let _ = client.release();
    Ok(out)
}
