//! Deterministic request sets for tests and benchmarks, and the worker's result file.

use serde::{Deserialize, Serialize};

use crate::wire::SamplingParams;

/// How requests sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Every request greedy.
    Greedy,
    /// Every request seeded (temperature 0.8, top-k 40).
    Seeded,
    /// Even ids greedy, odd ids seeded.
    Mixed,
}

/// A request set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSpec {
    /// Number of requests.
    pub requests: usize,
    /// Base prompt length (request i adds `(13 i) mod 32`).
    pub prompt_len: usize,
    /// Tokens to generate per request.
    pub max_new: usize,
    /// Sampling mode.
    pub mode: Mode,
    /// Seed for prompts and samplers.
    pub seed: u64,
}

/// One request.
#[derive(Debug, Clone)]
pub struct Job {
    /// Request id (1-based).
    pub id: u64,
    /// Sampling parameters.
    pub params: SamplingParams,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
}

impl JobSpec {
    /// Prompt length of request `i` (0-based).
    pub fn prompt_len_of(&self, i: usize) -> usize {
        self.prompt_len + (13 * i) % 32
    }

    /// Longest sequence any request reaches.
    pub fn max_seq(&self) -> usize {
        (0..self.requests)
            .map(|i| self.prompt_len_of(i))
            .max()
            .unwrap_or(0)
            + self.max_new
    }

    /// The requests.
    pub fn jobs(&self, vocab: usize) -> Vec<Job> {
        (0..self.requests)
            .map(|i| {
                let id = i as u64 + 1;
                let mut s = self.seed ^ id.wrapping_mul(0x2545_F491_4F6C_DD1D);
                let prompt = (0..self.prompt_len_of(i))
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        // Skip the special tokens at the start of the vocabulary.
                        (300 + s % (vocab as u64 - 300)) as u32
                    })
                    .collect();
                let seeded = match self.mode {
                    Mode::Greedy => false,
                    Mode::Seeded => true,
                    Mode::Mixed => id.is_multiple_of(2),
                };
                Job {
                    id,
                    params: SamplingParams {
                        temperature: if seeded { 0.8 } else { 0.0 },
                        top_k: if seeded { 40 } else { 0 },
                        seed: self.seed.wrapping_add(id),
                        max_new_tokens: self.max_new as u32,
                    },
                    prompt,
                }
            })
            .collect()
    }
}

/// The result file a finishing worker writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Results {
    /// (request id, generated tokens), by id.
    pub requests: Vec<(u64, Vec<u32>)>,
}
