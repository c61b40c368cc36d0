//! Command-line arguments of `belayer-bench-rollout`.

use std::path::PathBuf;

pub const USAGE: &str = "usage: belayer-bench-rollout [--sandboxes N] [--turns T] [--seed S] \
[--sandbox-kills K] [--worker-kills K] [--max-new N] [--out DIR] [--quick]

  --sandboxes N      concurrent sandboxes, one trajectory each (default 8)
  --turns T          turns per trajectory: generate, then run the turn's action (default 6)
  --seed S           seeds the prompts, the sampling and the failure schedule (default 1)
  --sandbox-kills K  sandbox inits SIGKILLed during the run (default 2)
  --worker-kills K   rollout workers SIGKILLed during the run (default 2)
  --max-new N        tokens generated per turn (default 24)
  --out DIR          where results.json, table.md and plot.svg go (default ./bench-out/rollout)
  --quick            4 sandboxes x 4 turns, 1 kill of each kind, 16 tokens a turn

Three runs on the same seed: a baseline without failures and without Belayer (runc-v2, the
serving worker alone), the failure schedule with Belayer (belayer runtime with automatic
checkpoints and recovery, broker + shadow worker), and the same schedule without Belayer
(runc-v2; a killed worker is cold-restarted). Run as root; needs containerd 2.x, runc, CRIU, the
images of scripts/images, the model (gpu-broker/scripts/fetch-model) and the workspace's release
binaries (containerd-shim-belayer-v1, belayer, belayer-gpu-broker, belayer-worker) beside this one
or in $BELAYER_BIN_DIR.";

/// What one benchmark run does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub sandboxes: usize,
    pub turns: usize,
    pub seed: u64,
    pub sandbox_kills: usize,
    pub worker_kills: usize,
    pub max_new: u32,
    pub out: PathBuf,
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
            out: PathBuf::from("bench-out/rollout"),
        }
    }
}

impl Args {
    /// The `--quick` sizes (flags given after `--quick` still apply).
    pub fn quick(self) -> Self {
        Self {
            sandboxes: 4,
            turns: 4,
            sandbox_kills: 1,
            worker_kills: 1,
            max_new: 16,
            ..self
        }
    }
}

/// What the command line asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    Run(Args),
    Help,
}

/// Parses the arguments after the program name; the error is one line for stderr.
pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Parsed, String> {
    let mut args = Args::default();
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--quick" => args = args.quick(),
            "--sandboxes" => args.sandboxes = number(&flag, &value()?, 1)?,
            "--turns" => args.turns = number(&flag, &value()?, 2)?,
            "--seed" => args.seed = number(&flag, &value()?, 0)? as u64,
            "--sandbox-kills" => args.sandbox_kills = number(&flag, &value()?, 0)?,
            "--worker-kills" => args.worker_kills = number(&flag, &value()?, 0)?,
            "--max-new" => args.max_new = number(&flag, &value()?, 1)? as u32,
            "--out" => args.out = PathBuf::from(value()?),
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    if args.sandbox_kills > args.sandboxes {
        return Err(format!(
            "--sandbox-kills {} exceeds --sandboxes {} (one kill per sandbox at most)",
            args.sandbox_kills, args.sandboxes
        ));
    }
    Ok(Parsed::Run(args))
}

fn number(name: &str, v: &str, min: usize) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n >= min => Ok(n),
        _ => Err(format!("{name} wants an integer ≥ {min}, not {v:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Parsed, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_quick_and_flags() {
        assert_eq!(p(&[]).unwrap(), Parsed::Run(Args::default()));
        let Parsed::Run(a) = p(&["--quick", "--seed=7", "--worker-kills", "0"]).unwrap() else {
            panic!()
        };
        assert_eq!((a.sandboxes, a.turns, a.seed, a.worker_kills), (4, 4, 7, 0));
        assert_eq!(p(&["--help"]).unwrap(), Parsed::Help);
    }

    #[test]
    fn bad_input_is_one_line() {
        assert!(p(&["--turns", "1"]).unwrap_err().contains("≥ 2"));
        assert!(p(&["--sandboxes"]).unwrap_err().contains("needs a value"));
        assert!(
            p(&["--sandboxes", "2", "--sandbox-kills", "3"])
                .unwrap_err()
                .contains("exceeds")
        );
        assert!(p(&["--frob"]).unwrap_err().contains("unknown"));
    }
}
