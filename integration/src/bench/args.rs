//! Command-line arguments of `belayer-bench-env`.

use std::path::PathBuf;

pub const USAGE: &str =
    "usage: belayer-bench-env [--runs R] [--holder-mb N] [--out DIR] [--no-podman]

  --runs R       repetitions of every measurement (default 3); medians and all samples reported
  --holder-mb N  memory of the episode's background process in MB (default 300)
  --out DIR      where results.json, table.md and plot.svg go (default ./bench-out/env)
  --no-podman    skip podman even when it is installed

Run as root. Needs containerd 2.x, runc, CRIU ≥ 4.2, the images of scripts/images, and the
workspace's binaries (containerd-shim-belayer-v1, belayer) beside this one or in $BELAYER_BIN_DIR.";

/// What one benchmark run measures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub runs: u32,
    pub holder_mb: u32,
    pub out: PathBuf,
    pub podman: bool,
}

impl Default for Args {
    fn default() -> Self {
        Self {
            runs: 3,
            holder_mb: 300,
            out: PathBuf::from("bench-out/env"),
            podman: true,
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
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Parsed::Help),
            "--runs" => args.runs = number("--runs", &value("--runs")?)?,
            "--holder-mb" => args.holder_mb = number("--holder-mb", &value("--holder-mb")?)?,
            "--out" => args.out = PathBuf::from(value("--out")?),
            "--no-podman" => args.podman = false,
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    Ok(Parsed::Run(args))
}

fn number(name: &str, v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{name} wants a positive integer, not {v:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Parsed, String> {
        parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_flags() {
        assert_eq!(p(&[]).unwrap(), Parsed::Run(Args::default()));
        let want = Args {
            runs: 5,
            holder_mb: 64,
            out: "x".into(),
            podman: false,
        };
        assert_eq!(
            p(&["--runs", "5", "--holder-mb=64", "--out", "x", "--no-podman"]).unwrap(),
            Parsed::Run(want)
        );
        assert_eq!(p(&["--help"]).unwrap(), Parsed::Help);
    }

    #[test]
    fn bad_input_is_one_line() {
        assert!(p(&["--runs", "0"]).unwrap_err().contains("positive"));
        assert!(p(&["--runs"]).unwrap_err().contains("needs a value"));
        assert!(p(&["--frob"]).unwrap_err().contains("unknown"));
    }
}
