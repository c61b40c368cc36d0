//! Belayer's benchmarks, in one home: `belayer-bench SUITE` runs one of them. Each suite takes
//! its arguments through clap (with [`Common`]'s `--out`), keeps its samples in
//! [`stats::Samples`], writes its record through [`record::Record`] (results.json, table.md,
//! plot.svg, and one JSON object as the last stdout line) and draws with [`plot`].
//!
//! - `env`: environment checkpoint, restore and fork against replay, containerd and podman;
//! - `auto`: what automatic checkpoints cost an agent episode, against runc-v2;
//! - `gateway`: the latency `belayer gateway` adds to a request;
//! - `rollout`: an end-to-end rollout with injected failures, with and without Belayer;
//! - `worker`: the rollout worker's recovery (shadow takeover + KV rebuild vs a cold start);
//! - `vllm`: an unchanged vLLM losing its worker (shadow takeover through the broker vs a cold
//!   restart);
//! - `sched`: the checkpoint-scheduling simulator;
//! - `push`: checkpoints through a real registry to another node, and the replication lag,
//!   against `ctr` pushing containerd's own checkpoint image;
//! - `openhands`: an unchanged OpenHands conversation on runc against Belayer with automatic
//!   checkpoints, where each checkpoint fell, and the sandbox's checkpoint and restore by phase;
//! - `chaos`, `zdtm`: the fault-injection soak and CRIU's ZDTM suite through Belayer.

pub mod auto;
pub mod belayer;
pub mod chaos;
pub mod check;
pub mod ctrd;
pub mod env;
pub mod gateway;
pub mod openai;
pub mod openhands;
pub mod plot;
pub mod podman;
pub mod procs;
pub mod push;
pub mod record;
pub mod replication;
pub mod report;
pub mod rollout;
pub mod sched;
pub mod stats;
pub mod vllm;
pub mod worker;
pub mod zdtm;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Arguments every suite takes.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct Common {
    /// Where results.json, table.md and plot.svg go [default: bench-out/SUITE]
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl Common {
    /// `--out`, or `bench-out/SUITE`.
    pub fn out(&self, suite: &str) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| PathBuf::from("bench-out").join(suite))
    }
}

/// Start-up of the suites that drive containerd: refuses to run unless root (containerd, runc
/// and CRIU need it), and points the harness at the workspace binaries beside this one
/// (`$BELAYER_BIN_DIR`, unless set). Call first thing, while single-threaded.
pub fn start_as_root(bench: &str) -> Result<(), String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "{bench}: must run as root (containerd, runc and CRIU need it)"
        ));
    }
    if std::env::var_os("BELAYER_BIN_DIR").is_none()
        && let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|p| p.to_path_buf()))
    {
        // The harness looks for the shim beside a test binary's parent dir; a benchmark binary
        // sits beside the shim itself. SAFETY: the caller is still single-threaded, nothing
        // reads the environment concurrently.
        unsafe { std::env::set_var("BELAYER_BIN_DIR", dir) };
    }
    Ok(())
}

/// Runs suite `name`: [`start_as_root`] first when it needs `root`, then `bench`. Exits 0
/// when every check passed, 1 when one failed or the run broke, 2 for a failed set-up; errors
/// are one line on stderr.
pub fn run_main(name: &str, root: bool, bench: impl FnOnce() -> Result<bool, String>) -> ExitCode {
    if root && let Err(e) = start_as_root(name) {
        eprintln!("belayer-bench {e}");
        return ExitCode::from(2);
    }
    match bench() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("belayer-bench {name}: {e}");
            ExitCode::from(1)
        }
    }
}

/// The private copy of the binaries under test [`snapshot_bins`] made; the directory goes when
/// this is dropped (keep it until the benchmark's processes are done with it).
pub struct BinSnapshot(PathBuf);

impl Drop for BinSnapshot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Hard-links (or copies) the binaries under test into a private directory beside them and
/// points `$BELAYER_BIN_DIR` there: the target dir is shared with builds that replace them
/// while a benchmark runs. Call while single-threaded; dropping the result removes the
/// directory.
pub fn snapshot_bins(names: &[&str]) -> Result<BinSnapshot, String> {
    let from = crate::prereq::bin_dir();
    let to = from.join(format!(".bench-{}", std::process::id()));
    std::fs::create_dir_all(&to).map_err(|e| format!("create {}: {e}", to.display()))?;
    for b in names {
        let (src, dst) = (from.join(b), to.join(b));
        if !src.is_file() {
            return Err(format!(
                "{} is missing: build the workspace (cargo build --release --workspace --bins)",
                src.display()
            ));
        }
        let _ = std::fs::remove_file(&dst);
        if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(|e| format!("copy {}: {e}", src.display()))?;
        }
    }
    // SAFETY: the caller is single-threaded, nothing reads the environment concurrently.
    unsafe { std::env::set_var("BELAYER_BIN_DIR", &to) };
    Ok(BinSnapshot(to))
}

/// Polls `f` every 20 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// Parses `argv` (without the program name) as a suite's arguments `A`, as `belayer-bench
/// SUITE` would: for the suites' tests of their flags.
pub fn parse_args<A: clap::Args + clap::FromArgMatches>(argv: &[&str]) -> Result<A, clap::Error> {
    let cmd = A::augment_args(clap::Command::new("belayer-bench"));
    let m =
        cmd.try_get_matches_from(std::iter::once("belayer-bench").chain(argv.iter().copied()))?;
    A::from_arg_matches(&m)
}
