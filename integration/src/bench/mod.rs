//! `belayer-bench env`: Belayer's environment checkpoint, restore and fork against what a
//! framework has today (replaying the episode in a fresh container), containerd's own
//! checkpoint/restore and podman's, all on the reference episode and in one run.

pub mod args;
pub mod belayer;
pub mod check;
pub mod control;
pub mod ctrd;
pub mod openai;
pub mod podman;
pub mod report;
pub mod rollout;
pub mod stats;
pub mod svg;

use std::time::{Duration, Instant};

/// Start-up shared by the benchmark binaries: refuses to run unless root (containerd, runc and
/// CRIU need it), and points the harness at the workspace binaries beside this one
/// (`$BELAYER_BIN_DIR`, unless set). Call first thing in `main`, while single-threaded.
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

/// The `main` of a benchmark binary `name`: `parsed` is its command line (`None`: it asked for
/// `--help`, and `usage` is printed). Then [`start_as_root`], `prepare` (set-up done while still
/// single-threaded) and `bench`. Exits 0 when every check passed, 1 when one failed or the run
/// broke, 2 for a bad command line or a failed set-up; errors are one line on stderr.
pub fn run_main<A>(
    name: &str,
    usage: &str,
    parsed: Result<Option<A>, String>,
    prepare: impl FnOnce() -> Result<(), String>,
    bench: impl FnOnce(&A) -> Result<bool, String>,
) -> std::process::ExitCode {
    use std::process::ExitCode;
    let args = match parsed {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{usage}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = start_as_root(name) {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    if let Err(e) = prepare() {
        eprintln!("{name}: {e}");
        return ExitCode::from(2);
    }
    match bench(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::from(1)
        }
    }
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
