//! Command-line arguments of `belayer-bench rollout`.

use clap::builder::TypedValueParser as _;

use crate::bench::Common;

/// Four runs on the same seed: a baseline without failures and without Belayer (runc-v2, the
/// serving worker alone); the failure schedule with Belayer (automatic checkpoints and recovery,
/// broker + shadow worker); the same schedule without Belayer, where a failed action ends its
/// trajectory (runc-v2; a killed worker is cold-restarted); and the same schedule with what
/// frameworks do, replaying a failed trajectory from its start in a fresh runc container. Needs
/// root, containerd 2.x, runc, CRIU, the images of scripts/images, the model
/// (gpu-broker/scripts/fetch-model) and the workspace's release binaries.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Concurrent sandboxes, one trajectory each
    #[arg(long, default_value_t = 8, default_value_if("quick", "true", "4"),
          value_parser = clap::value_parser!(u64).range(1..).map(|v| v as usize))]
    pub sandboxes: usize,
    /// Turns per trajectory: generate, then run the turn's action
    #[arg(long, default_value_t = 6, default_value_if("quick", "true", "4"),
          value_parser = clap::value_parser!(u64).range(2..).map(|v| v as usize))]
    pub turns: usize,
    /// Seeds the prompts, the sampling and the failure schedule
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Sandbox inits SIGKILLed during the run (one per sandbox at most)
    #[arg(long, default_value_t = 2, default_value_if("quick", "true", "1"))]
    pub sandbox_kills: usize,
    /// Rollout workers SIGKILLed during the run
    #[arg(long, default_value_t = 2, default_value_if("quick", "true", "1"))]
    pub worker_kills: usize,
    /// Tokens generated per turn
    #[arg(long, default_value_t = 24, default_value_if("quick", "true", "16"),
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_new: u32,
    /// 4 sandboxes x 4 turns, 1 kill of each kind, 16 tokens a turn (flags given still apply)
    #[arg(long)]
    pub quick: bool,
    #[command(flatten)]
    pub common: Common,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            sandboxes: 8,
            turns: 6,
            seed: 1,
            sandbox_kills: 2,
            worker_kills: 2,
            max_new: 24,
            quick: false,
            common: Common::default(),
        }
    }
}

impl Args {
    /// Refuses a schedule the sandboxes cannot hold.
    pub fn validate(&self) -> Result<(), String> {
        if self.sandbox_kills > self.sandboxes {
            return Err(format!(
                "--sandbox-kills {} exceeds --sandboxes {} (one kill per sandbox at most)",
                self.sandbox_kills, self.sandboxes
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Args, clap::Error> {
        crate::bench::parse_args(args)
    }

    #[test]
    fn defaults_quick_and_flags() {
        assert_eq!(p(&[]).unwrap(), Args::default());
        let a = p(&["--quick", "--seed=7", "--worker-kills", "0"]).unwrap();
        assert_eq!(
            (a.sandboxes, a.turns, a.seed, a.worker_kills, a.max_new),
            (4, 4, 7, 0, 16)
        );
        assert_eq!(p(&["--quick", "--sandboxes", "8"]).unwrap().sandboxes, 8);
    }

    #[test]
    fn bad_input() {
        assert!(p(&["--turns", "1"]).is_err());
        assert!(p(&["--sandboxes"]).is_err());
        assert!(p(&["--frob"]).is_err());
        let a = p(&["--sandboxes", "2", "--sandbox-kills", "3"]).unwrap();
        assert!(a.validate().unwrap_err().contains("exceeds"));
    }
}
