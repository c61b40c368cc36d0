//! Benchmark results: the JSON document, the table, medians.

use serde::Serialize;

/// One rebuild point.
#[derive(Debug, Clone, Serialize)]
pub struct Rebuild {
    pub requests: usize,
    pub tokens: usize,
    pub seconds: f64,
}

/// The kill test.
#[derive(Debug, Clone, Serialize)]
pub struct KillTest {
    pub requests: usize,
    pub prompt_len: usize,
    pub max_new: usize,
    pub killed_after_tokens: usize,
    pub takeover_s: f64,
    pub rebuild_s: f64,
    pub rebuild_tokens: u64,
    pub tokens_identical: bool,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub quick: bool,
    pub threads: usize,
    pub cpu: String,
    /// `/sys/kernel/mm/transparent_hugepage/shmem_enabled` (huge pages for the broker's memfds).
    pub shmem_thp: String,
    /// `/proc/loadavg` at the start and at the end of the run (other load skews every time).
    pub loadavg: [String; 2],
    pub cold_start_s: f64,
    pub cold_start_runs: Vec<f64>,
    pub cold_load_s: f64,
    pub takeover_s: f64,
    pub takeover_runs: Vec<f64>,
    pub takeover_checksum_s: f64,
    pub health_check_us: u64,
    pub health_check_checksum_us: u64,
    pub speedup_takeover: f64,
    pub rebuild: Vec<Rebuild>,
    pub kill_test: KillTest,
    pub tokens_identical: bool,
}

pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { 0.0 } else { s[s.len() / 2] }
}

pub fn table(r: &Report) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "cpu: {} ({} threads){}; shmem THP: {}; load average {} → {}\n",
        r.cpu,
        r.threads,
        if r.quick { ", quick mode" } else { "" },
        r.shmem_thp,
        r.loadavg[0],
        r.loadavg[1]
    ));
    s.push_str(&format!("{:<44} {:>12}\n", "measurement", "seconds"));
    s.push_str(&format!(
        "{:<44} {:>12.4}\n",
        "cold start (new process → ready, median)", r.cold_start_s
    ));
    s.push_str(&format!(
        "{:<44} {:>12.4}\n",
        "  of which dequantize+checksum+publish", r.cold_load_s
    ));
    s.push_str(&format!(
        "{:<44} {:>12.4}\n",
        "takeover, promotion only (median)", r.takeover_s
    ));
    s.push_str(&format!(
        "{:<44} {:>12.4}\n",
        "takeover with full weight checksum", r.takeover_checksum_s
    ));
    s.push_str(&format!(
        "{:<44} {:>11.1}×\n",
        "cold start / takeover", r.speedup_takeover
    ));
    s.push_str(&format!(
        "\n{:>9} {:>8} {:>10} {:>12} {:>22}\n",
        "requests", "tokens", "rebuild s", "tokens/s", "cold/(takeover+rebuild)"
    ));
    for p in &r.rebuild {
        s.push_str(&format!(
            "{:>9} {:>8} {:>10.3} {:>12.0} {:>21.2}×\n",
            p.requests,
            p.tokens,
            p.seconds,
            (p.requests * p.tokens) as f64 / p.seconds.max(1e-9),
            r.cold_start_s / (r.takeover_s + p.seconds)
        ));
    }
    let k = &r.kill_test;
    s.push_str(&format!(
        "\nkill test: {} requests × {}-token prompts, SIGKILL after {} tokens: takeover {:.4}s, rebuild {:.3}s ({} tokens), tokens identical: {}\n",
        k.requests, k.prompt_len, k.killed_after_tokens, k.takeover_s, k.rebuild_s, k.rebuild_tokens, k.tokens_identical
    ));
    s
}
