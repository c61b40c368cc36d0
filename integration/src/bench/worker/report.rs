//! What `belayer-bench worker` reports: the recoveries side by side, the rebuild curve, the
//! table, results.json and the plot.

use serde::Serialize;
use serde_json::{Value, json};

use crate::bench::plot::{Chart, Point, Series};
use crate::bench::stats::{Samples, cell, round3};

/// One rebuild point.
#[derive(Debug, Clone, Serialize)]
pub struct Rebuild {
    pub requests: usize,
    pub tokens: usize,
    pub seconds: f64,
}

/// One recovery, in seconds from the kill (takeover) or from the new process's spawn (cold).
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Ready to decode: promotion (takeover) or load (cold).
    pub ready_s: f64,
    /// The KV rebuild from the log (takeover only).
    pub rebuild_s: f64,
    /// Every in-flight request has generated a new token.
    pub generating_s: f64,
    /// Every request is back at the position it had at the kill.
    pub caught_up_s: f64,
    /// The cold load: dequantize, checksum, publish (cold only).
    pub cold_load_s: f64,
    /// Tokens the takeover rebuilt.
    pub in_flight_tokens: u64,
}

impl Recovery {
    /// Adds this recovery's figures to `s` under `side_*`.
    pub fn push(&self, s: &mut Samples, side: &str) {
        s.push(&format!("{side}_ready"), self.ready_s);
        s.push(&format!("{side}_generating"), self.generating_s);
        s.push(&format!("{side}_caught_up"), self.caught_up_s);
        if side == "takeover" {
            s.push("takeover_rebuild", self.rebuild_s);
            s.push("takeover_tokens", self.in_flight_tokens as f64);
        } else {
            s.push("cold_load", self.cold_load_s);
        }
    }
}

/// Everything one run measured.
pub struct Report {
    pub requests: usize,
    pub prompt_len: usize,
    pub kill_after: usize,
    pub max_new: usize,
    pub threads: usize,
    /// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` (huge pages for the broker's memfds).
    pub shmem_thp: String,
    /// One checksum of every weight byte (the broker's `--checksum always` health check).
    pub weight_checksum_s: f64,
    pub samples: Samples,
    pub rebuild: Vec<Rebuild>,
    pub tokens_identical: bool,
}

/// The rows of the table: key, what it is.
const ROWS: &[(&str, &str)] = &[
    (
        "cold_generating",
        "without Belayer: new process (cold load + prefill of every request) → every request generating",
    ),
    (
        "takeover_generating",
        "with Belayer: kill → shadow promoted + KV rebuilt → every request generating",
    ),
    (
        "cold_caught_up",
        "without Belayer: … → every request back at its position at the kill",
    ),
    ("cold_ready", "without Belayer: spawn → ready (cold load)"),
    (
        "cold_load",
        "… of which dequantize + weight checksum + publish",
    ),
    (
        "takeover_ready",
        "with Belayer: kill → promoted (secondary)",
    ),
    ("takeover_rebuild", "with Belayer: KV rebuild from the log"),
    ("takeover_tokens", "tokens rebuilt (prompts + generated)"),
];

impl Report {
    fn med(&self, key: &str) -> Option<f64> {
        self.samples.median(key)
    }

    /// The headline ratio and its parts: cold start + re-prefill over takeover + rebuild, both
    /// to every request generating again; and the same with the cold side's weight checksum
    /// (integrity work a plain engine does not do) taken out.
    pub fn ratios(&self) -> Value {
        let (cold, take) = (self.med("cold_generating"), self.med("takeover_generating"));
        let r = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| round3(a / b));
        json!({
            "cold_generating_over_takeover_generating": r(cold, take),
            "cold_less_checksum_over_takeover_generating":
                r(cold.map(|c| c - self.weight_checksum_s), take),
            "cold_ready_over_takeover_ready": r(self.med("cold_ready"), self.med("takeover_ready")),
        })
    }

    pub fn table(&self) -> String {
        let mut s = format!(
            "{} in-flight requests × {}+ prompt tokens, killed after {} decode steps ({} new tokens each in all); {} threads, shmem THP {}\n\n\
             | measurement (cold and takeover interleaved) | median s (samples) |\n|---|---|\n",
            self.requests,
            self.prompt_len,
            self.kill_after,
            self.max_new,
            self.threads,
            self.shmem_thp
        );
        for (key, label) in ROWS {
            let decimals = if *key == "takeover_tokens" { 0 } else { 3 };
            s.push_str(&format!(
                "| {label} | {} |\n",
                cell(self.samples.get(key), decimals)
            ));
        }
        s.push_str(&format!(
            "| weight checksum (Belayer's integrity work, in the cold load above) | {:.3} |\n",
            self.weight_checksum_s
        ));
        let ratios = self.ratios();
        s.push_str("\n| ratio (of medians) | value |\n|---|---:|\n");
        for (k, label) in [
            (
                "cold_generating_over_takeover_generating",
                "cold start + re-prefill ÷ takeover + KV rebuild (to every request generating)",
            ),
            (
                "cold_less_checksum_over_takeover_generating",
                "the same, the weight checksum taken out of the cold start",
            ),
            (
                "cold_ready_over_takeover_ready",
                "cold load ÷ promotion alone (secondary: no KV rebuild)",
            ),
        ] {
            let v = ratios[k]
                .as_f64()
                .map_or_else(|| "—".into(), |v| format!("{v:.2}×"));
            s.push_str(&format!("| {label} | {v} |\n"));
        }
        s.push_str(&format!(
            "\n| requests | tokens each | rebuild s | tokens/s |\n|---:|---:|---:|---:|\n{}",
            self.rebuild
                .iter()
                .map(|p| format!(
                    "| {} | {} | {:.3} | {:.0} |\n",
                    p.requests,
                    p.tokens,
                    p.seconds,
                    (p.requests * p.tokens) as f64 / p.seconds.max(1e-9)
                ))
                .collect::<String>()
        ));
        s.push_str(&format!(
            "\nshadow's tokens identical to an unkilled run's: {}\n",
            self.tokens_identical
        ));
        s
    }

    /// The one-line summary.
    pub fn summary(&self) -> Value {
        let mut medians = serde_json::Map::new();
        for (key, _) in ROWS {
            if let Some(m) = self.med(key) {
                medians.insert(format!("{key}_s"), json!(round3(m)));
            }
        }
        json!({
            "medians": medians,
            "weight_checksum_s": round3(self.weight_checksum_s),
            "ratios": self.ratios(),
            "tokens_identical": self.tokens_identical,
        })
    }

    /// The summary, every sample and the rebuild curve.
    pub fn results(&self) -> Value {
        let mut v = self.summary();
        v["shape"] = json!({
            "requests": self.requests, "prompt_len": self.prompt_len,
            "kill_after": self.kill_after, "max_new": self.max_new,
            "threads": self.threads, "shmem_thp": self.shmem_thp,
        });
        v["samples"] = json!(self.samples.0);
        v["rebuild"] = json!(self.rebuild);
        v
    }

    /// Rebuild time against in-flight tokens, one series per request count, with the two
    /// recoveries' medians as reference lines.
    pub fn plot(&self) -> String {
        let mut counts: Vec<usize> = self.rebuild.iter().map(|p| p.requests).collect();
        counts.sort_unstable();
        counts.dedup();
        let series = counts
            .iter()
            .map(|n| Series {
                name: format!("{n} requests"),
                points: self
                    .rebuild
                    .iter()
                    .filter(|p| p.requests == *n)
                    .map(|p| Point {
                        x: (p.requests * p.tokens) as f64,
                        y: p.seconds,
                        ..Point::default()
                    })
                    .collect(),
                line: true,
            })
            .collect();
        let mut hlines = Vec::new();
        for (key, what) in [
            ("cold_generating", "cold + re-prefill"),
            ("takeover_generating", "takeover + rebuild"),
        ] {
            if let Some(m) = self.med(key) {
                hlines.push((m, format!("{what} {m:.2}s")));
            }
        }
        Chart {
            title: "KV rebuild by prefill; whole recoveries for reference".into(),
            x_label: "in-flight tokens rebuilt (requests × tokens)".into(),
            y_label: "seconds".into(),
            log_y: false,
            series,
            hlines,
        }
        .svg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_table() {
        let mut samples = Samples::default();
        Recovery {
            ready_s: 2.0,
            generating_s: 10.0,
            caught_up_s: 11.0,
            cold_load_s: 1.5,
            ..Recovery::default()
        }
        .push(&mut samples, "cold");
        Recovery {
            ready_s: 0.1,
            rebuild_s: 3.0,
            generating_s: 4.0,
            caught_up_s: 4.0,
            in_flight_tokens: 2000,
            ..Recovery::default()
        }
        .push(&mut samples, "takeover");
        let r = Report {
            requests: 8,
            prompt_len: 256,
            kill_after: 8,
            max_new: 16,
            threads: 2,
            shmem_thp: "never".into(),
            weight_checksum_s: 2.0,
            samples,
            rebuild: vec![Rebuild {
                requests: 8,
                tokens: 256,
                seconds: 3.0,
            }],
            tokens_identical: true,
        };
        let v = r.ratios();
        assert_eq!(v["cold_generating_over_takeover_generating"], 2.5);
        assert_eq!(v["cold_less_checksum_over_takeover_generating"], 2.0);
        assert_eq!(v["cold_ready_over_takeover_ready"], 20.0);
        assert!(r.table().contains("| 8 | 256 | 3.000 |"));
        assert!(r.plot().contains("takeover + rebuild 4.00s"));
    }
}
