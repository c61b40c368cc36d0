//! Summaries of the runs: one row per policy, as a Markdown table and as JSON.

use serde::Serialize;

use crate::bench::plot::{Chart, Point, Series};
use crate::bench::sched::sim::Outcome;
use crate::bench::stats::mean_ci;

/// One policy's results over all nodes.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Policy name.
    pub policy: String,
    /// Visible overhead, percent of the checkpoint-free episode length (mean over nodes).
    pub overhead_pct: f64,
    /// Half-width of its 95 % confidence interval.
    pub overhead_ci95: f64,
    /// Expected work lost per failure, seconds (mean over nodes).
    pub lost_per_failure_s: f64,
    /// Half-width of its 95 % confidence interval.
    pub lost_ci95: f64,
    /// Failures sampled from the Poisson process.
    pub sampled_failures: u64,
    /// Mean work those failures lost, seconds.
    pub sampled_lost_per_failure_s: f64,
    /// Checkpoints per episode.
    pub checkpoints_per_episode: f64,
    /// Forced checkpoints per episode.
    pub forced_per_episode: f64,
    /// Mean checkpoint duration, seconds.
    pub mean_checkpoint_s: f64,
    /// Totals over all nodes.
    pub totals: Outcome,
}

/// Summarizes a policy's per-node outcomes.
pub fn row(policy: String, per_node: &[Outcome]) -> Row {
    let mut totals = Outcome::default();
    per_node.iter().for_each(|o| totals.add(o));
    let (overhead_pct, overhead_ci95) = mean_ci(per_node.iter().map(Outcome::overhead_pct));
    let (lost_per_failure_s, lost_ci95) = mean_ci(per_node.iter().map(Outcome::lost_per_failure_s));
    let per = |x: u64| x as f64 / totals.episodes.max(1) as f64;
    Row {
        policy,
        overhead_pct,
        overhead_ci95,
        lost_per_failure_s,
        lost_ci95,
        sampled_failures: totals.failures,
        sampled_lost_per_failure_s: totals.failure_lost_s / totals.failures.max(1) as f64,
        checkpoints_per_episode: per(totals.checkpoints),
        forced_per_episode: per(totals.forced),
        mean_checkpoint_s: totals.checkpoint_s / totals.checkpoints.max(1) as f64,
        totals,
    }
}

/// The Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| policy | visible overhead % | E[work lost] per failure (s) | sampled failures: lost (s) | checkpoints / episode | forced / episode | mean checkpoint (s) |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.2} ± {:.2} | {:.1} ± {:.1} | {}: {:.1} | {:.1} | {:.2} | {:.2} |\n",
            r.policy,
            r.overhead_pct,
            r.overhead_ci95,
            r.lost_per_failure_s,
            r.lost_ci95,
            r.sampled_failures,
            r.sampled_lost_per_failure_s,
            r.checkpoints_per_episode,
            r.forced_per_episode,
            r.mean_checkpoint_s,
        ));
    }
    s
}

/// The trade-off plot: visible overhead (x) against expected work lost per failure (y, log),
/// one point per policy with 95 % confidence bars.
pub fn plot(rows: &[Row], title: &str) -> String {
    Chart {
        title: title.into(),
        x_label: "visible overhead (% of episode time)".into(),
        y_label: "expected work lost per failure (s)".into(),
        log_y: true,
        series: rows
            .iter()
            .map(|r| Series {
                name: r.policy.clone(),
                points: vec![Point {
                    x: r.overhead_pct,
                    y: r.lost_per_failure_s,
                    x_err: r.overhead_ci95,
                    y_err: r.lost_ci95,
                }],
                line: false,
            })
            .collect(),
        hlines: Vec::new(),
    }
    .svg()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_and_table() {
        let o = Outcome {
            episodes: 2,
            base_s: 100.0,
            visible_s: 1.0,
            exposure_s: 101.0,
            ..Default::default()
        };
        let t = markdown(&[row("never".into(), std::slice::from_ref(&o))]);
        assert!(t.contains("| never | 1.00 ± 0.00 |"), "{t}");
        let rows = [row("never".into(), &[o])];
        assert!(plot(&rows, "a < b").contains("a &lt; b"));
    }
}
