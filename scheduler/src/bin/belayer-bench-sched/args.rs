//! Command-line flags of `belayer-bench sched`.

use std::path::PathBuf;

use crate::sim::TrueCost;
use crate::synth::Shape;

/// Everything the command line sets.
#[derive(Debug, Clone)]
pub struct Args {
    /// Base seed of synthetic traces, cost noise and failures.
    pub seed: u64,
    /// Number of simulated nodes (synthetic traces only).
    pub nodes: u64,
    /// Episodes (containers) per node.
    pub containers: usize,
    /// Periods of the every-k baselines.
    pub ks: Vec<u32>,
    /// Poisson failure rate per container-hour.
    pub failures_per_h: f64,
    /// Replay this trace instead of generating episodes.
    pub trace: Option<PathBuf>,
    /// Also write the episodes simulated to this trace file.
    pub write_trace: Option<PathBuf>,
    /// Output directory for results.json and plot.svg.
    pub out: PathBuf,
    /// Scheduler config file (JSON); defaults otherwise.
    pub config: Option<PathBuf>,
    /// Overrides the config's max_concurrent.
    pub max_concurrent: Option<u32>,
    /// Synthetic episode shape.
    pub shape: Shape,
    /// The simulated machine's checkpoint cost.
    pub truth: TrueCost,
}

/// Usage text.
pub const USAGE: &str = "\
usage: belayer-bench sched [FLAGS]

Simulates checkpoint policies on synthetic or recorded agent episodes and compares visible
overhead with expected work lost per failure. Prints a Markdown table, writes results.json and
plot.svg to --out.

  --seed N                base seed (default 1)
  --seeds N               synthetic nodes to simulate (default 100)
  --containers N          episodes per node sharing its checkpoint permits (default 4)
  --k LIST                periods of the every-k baselines, comma-separated (default 5)
  --failures-per-h F      Poisson failure rate per container-hour (default 2)
  --trace FILE            replay a trace file (format: scheduler/README.md) instead of synthetic
  --write-trace FILE      write the simulated episodes as a trace file
  --out DIR               output directory (default target/belayer-bench/sched)
  --config FILE           scheduler config, JSON (default: built-in defaults)
  --max-concurrent N      override the config's node-wide checkpoint limit
synthetic shape:
  --turns-min N --turns-max N           model turns per episode (16, 100)
  --llm-median-s F --llm-sigma F        lognormal generation time (6, 0.8)
  --action-min-s F --action-max-s F     log-uniform action time (0.3, 3)
  --burst-p F                           chance of a follow-up action without a model call (0.2)
  --resident-median-gib F               initial resident memory (0.5)
  --dirty-median-mib F                  memory dirtied per action (30)
  --fs-median-mib F                     files written per writing action (5)
true checkpoint cost of the simulated machine:
  --cost-intercept-s F (0.4)  --cost-s-per-gib-dirty F (1)  --cost-s-per-gib-resident F (0.5)
  --cost-s-per-gib-fs F (2)   --cost-noise F (0.2)          --contention F (0.5)
";

impl Default for Args {
    fn default() -> Self {
        Self {
            seed: 1,
            nodes: 100,
            containers: 4,
            ks: vec![5],
            failures_per_h: 2.0,
            trace: None,
            write_trace: None,
            out: PathBuf::from("target/belayer-bench/sched"),
            config: None,
            max_concurrent: None,
            shape: Shape::default(),
            truth: TrueCost::default(),
        }
    }
}

/// Parses flags; `Ok(None)` for `--help`.
pub fn parse(argv: &[String]) -> Result<Option<Args>, String> {
    let mut a = Args::default();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            return Ok(None);
        }
        if !USAGE.contains(&format!("{flag} ")) || !flag.starts_with("--") {
            return Err(format!("unknown flag {flag}"));
        }
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let s = &mut a.shape;
        let c = &mut a.truth;
        match flag.as_str() {
            "--seed" => a.seed = num(flag, v)?,
            "--seeds" => a.nodes = num(flag, v)?,
            "--containers" => a.containers = num(flag, v)?,
            "--k" => {
                a.ks = v
                    .split(',')
                    .map(|k| num(flag, k))
                    .collect::<Result<_, _>>()?;
                if a.ks.contains(&0) {
                    return Err("--k: periods must be ≥ 1".into());
                }
            }
            "--failures-per-h" => a.failures_per_h = num(flag, v)?,
            "--trace" => a.trace = Some(v.into()),
            "--write-trace" => a.write_trace = Some(v.into()),
            "--out" => a.out = v.into(),
            "--config" => a.config = Some(v.into()),
            "--max-concurrent" => a.max_concurrent = Some(num(flag, v)?),
            "--turns-min" => s.turns_min = num(flag, v)?,
            "--turns-max" => s.turns_max = num(flag, v)?,
            "--llm-median-s" => s.llm_median_s = num(flag, v)?,
            "--llm-sigma" => s.llm_sigma = num(flag, v)?,
            "--action-min-s" => s.action_min_s = num(flag, v)?,
            "--action-max-s" => s.action_max_s = num(flag, v)?,
            "--burst-p" => s.burst_p = num(flag, v)?,
            "--resident-median-gib" => s.resident_median_gib = num(flag, v)?,
            "--dirty-median-mib" => s.dirty_median_mib = num(flag, v)?,
            "--fs-median-mib" => s.fs_median_mib = num(flag, v)?,
            "--cost-intercept-s" => c.intercept_s = num(flag, v)?,
            "--cost-s-per-gib-dirty" => c.s_per_gib_dirty = num(flag, v)?,
            "--cost-s-per-gib-resident" => c.s_per_gib_resident = num(flag, v)?,
            "--cost-s-per-gib-fs" => c.s_per_gib_fs = num(flag, v)?,
            "--cost-noise" => c.noise_sigma = num(flag, v)?,
            "--contention" => c.contention = num(flag, v)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.containers == 0 || a.nodes == 0 {
        return Err("--seeds and --containers must be ≥ 1".into());
    }
    if a.shape.turns_min == 0 || a.shape.turns_min > a.shape.turns_max {
        return Err("need 1 ≤ --turns-min ≤ --turns-max".into());
    }
    if !(a.shape.action_min_s > 0.0 && a.shape.action_min_s <= a.shape.action_max_s) {
        return Err("need 0 < --action-min-s ≤ --action-max-s".into());
    }
    Ok(Some(a))
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{flag}: cannot parse {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Option<Args>, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn flags() {
        let a = p("--seed 7 --k 2,10 --burst-p 0 --contention 1")
            .unwrap()
            .unwrap();
        assert_eq!(
            (a.seed, a.ks.clone(), a.shape.burst_p, a.truth.contention),
            (7, vec![2, 10], 0.0, 1.0)
        );
        assert!(p("--help").unwrap().is_none());
        assert!(p("--seed").is_err());
        assert!(p("--k 0").is_err());
        assert_eq!(p("--bogus").unwrap_err(), "unknown flag --bogus");
        assert_eq!(p("--seed").unwrap_err(), "--seed needs a value");
        assert!(p("--turns-min 50 --turns-max 10").is_err());
    }
}
