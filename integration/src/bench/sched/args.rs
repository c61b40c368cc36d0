//! Command-line flags of `belayer-bench sched`.

use std::path::PathBuf;

use clap::builder::TypedValueParser as _;

use crate::bench::Common;
use crate::bench::sched::sim::{Feed, TrueCost};
use crate::bench::sched::synth::Shape;

/// Simulates checkpoint policies on synthetic or recorded agent episodes and compares visible
/// overhead with expected work lost per failure. Prints a Markdown table, writes results.json
/// and plot.svg to --out.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Base seed of synthetic traces, cost noise and failures
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Synthetic nodes to simulate
    #[arg(long = "seeds", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub nodes: u64,
    /// Episodes per node sharing its checkpoint permits
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    pub containers: usize,
    /// Periods of the every-k baselines (each sync and async), comma-separated; k = 1 always runs
    #[arg(long = "k", value_delimiter = ',', default_value = "5",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub ks: Vec<u32>,
    /// Poisson failure rate per container-hour
    #[arg(long, default_value_t = 2.0)]
    pub failures_per_h: f64,
    /// What the policies are told of a container's footprint: `rss` (what the shim feeds: its
    /// resident set as both dirty and resident bytes, no filesystem bytes) or `exact` (the
    /// trace's dirty, resident and filesystem bytes)
    #[arg(long, value_enum, default_value_t = Feed::Rss)]
    pub feed: Feed,
    /// Replay a trace file (format: scheduler/README.md) instead of synthetic episodes
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the simulated episodes as a trace file
    #[arg(long)]
    pub write_trace: Option<PathBuf>,
    /// Scheduler config file, JSON [default: built-in defaults]
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override the config's node-wide checkpoint limit
    #[arg(long)]
    pub max_concurrent: Option<u32>,
    #[command(flatten)]
    pub shape: ShapeArgs,
    #[command(flatten)]
    pub truth: CostArgs,
    #[command(flatten)]
    pub common: Common,
}

/// The synthetic episodes' shape.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Synthetic shape")]
pub struct ShapeArgs {
    /// Fewest model turns per episode
    #[arg(long, default_value_t = 16)]
    pub turns_min: u64,
    /// Most model turns per episode
    #[arg(long, default_value_t = 100)]
    pub turns_max: u64,
    /// Median generation time, seconds (lognormal)
    #[arg(long, default_value_t = 6.0)]
    pub llm_median_s: f64,
    /// Log-space σ of generation times
    #[arg(long, default_value_t = 0.8)]
    pub llm_sigma: f64,
    /// Shortest action, seconds (log-uniform)
    #[arg(long, default_value_t = 0.3)]
    pub action_min_s: f64,
    /// Longest action, seconds
    #[arg(long, default_value_t = 3.0)]
    pub action_max_s: f64,
    /// Chance of a follow-up action without a model call
    #[arg(long, default_value_t = 0.2)]
    pub burst_p: f64,
    /// Initial resident memory, median GiB
    #[arg(long, default_value_t = 0.5)]
    pub resident_median_gib: f64,
    /// Memory dirtied per action, median MiB
    #[arg(long, default_value_t = 30.0)]
    pub dirty_median_mib: f64,
    /// Files written per writing action, median MiB
    #[arg(long, default_value_t = 5.0)]
    pub fs_median_mib: f64,
}

/// The simulated machine's true checkpoint cost.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "True checkpoint cost of the simulated machine")]
pub struct CostArgs {
    #[arg(long, default_value_t = 0.4)]
    pub cost_intercept_s: f64,
    #[arg(long, default_value_t = 1.0)]
    pub cost_s_per_gib_dirty: f64,
    #[arg(long, default_value_t = 0.5)]
    pub cost_s_per_gib_resident: f64,
    #[arg(long, default_value_t = 2.0)]
    pub cost_s_per_gib_fs: f64,
    /// Log-space σ of multiplicative noise
    #[arg(long, default_value_t = 0.2)]
    pub cost_noise: f64,
    /// Slow-down per other checkpoint running at the same time
    #[arg(long, default_value_t = 0.5)]
    pub contention: f64,
}

impl Args {
    /// The synthetic shape, checked.
    pub fn shape(&self) -> Result<Shape, String> {
        let a = &self.shape;
        if a.turns_min == 0 || a.turns_min > a.turns_max {
            return Err("need 1 ≤ --turns-min ≤ --turns-max".into());
        }
        if !(a.action_min_s > 0.0 && a.action_min_s <= a.action_max_s) {
            return Err("need 0 < --action-min-s ≤ --action-max-s".into());
        }
        Ok(Shape {
            turns_min: a.turns_min,
            turns_max: a.turns_max,
            llm_median_s: a.llm_median_s,
            llm_sigma: a.llm_sigma,
            action_min_s: a.action_min_s,
            action_max_s: a.action_max_s,
            burst_p: a.burst_p,
            resident_median_gib: a.resident_median_gib,
            dirty_median_mib: a.dirty_median_mib,
            fs_median_mib: a.fs_median_mib,
            ..Shape::default()
        })
    }

    /// The machine's true cost.
    pub fn truth(&self) -> TrueCost {
        let c = &self.truth;
        TrueCost {
            intercept_s: c.cost_intercept_s,
            s_per_gib_dirty: c.cost_s_per_gib_dirty,
            s_per_gib_resident: c.cost_s_per_gib_resident,
            s_per_gib_fs: c.cost_s_per_gib_fs,
            noise_sigma: c.cost_noise,
            contention: c.contention,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Args, clap::Error> {
        crate::bench::parse_args(&s.split_whitespace().collect::<Vec<_>>())
    }

    #[test]
    fn flags() {
        let a = p("--seed 7 --k 2,10 --burst-p 0 --contention 1 --feed exact").unwrap();
        assert_eq!(
            (
                a.seed,
                a.ks.clone(),
                a.shape().unwrap().burst_p,
                a.truth().contention,
                a.feed
            ),
            (7, vec![2, 10], 0.0, 1.0, Feed::Exact)
        );
        assert_eq!(p("").unwrap().feed, Feed::Rss);
        assert!(p("--seed").is_err());
        assert!(p("--k 0").is_err());
        assert!(p("--bogus").is_err());
        assert!(p("--turns-min 50 --turns-max 10").unwrap().shape().is_err());
    }
}
