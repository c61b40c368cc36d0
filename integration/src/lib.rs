//! End-to-end test harness: a private containerd (and dockerd) that tests start themselves, the
//! locally built images, and checks for anything a test leaves behind.
//!
//! A missing prerequisite (containerd, runc, an image) fails the test with a message naming it:
//! nothing here skips.

pub mod bench;
pub mod chaos;
pub mod client;
pub mod containerd;
pub mod docker;
pub mod episode;
pub mod leaks;
pub mod openhands;
pub mod prereq;
pub mod registry;
pub mod zdtm;

pub use containerd::{Containerd, Flavor, Out};
pub use docker::Docker;

/// A scratch directory under the system's temp dir, removed on drop.
pub struct Scratch(std::path::PathBuf);

impl Scratch {
    /// `$TMPDIR/belayer-fw-PID-NAME`, emptied if it was there.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("belayer-fw-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// CPU time of the whole machine so far, all cores together, in seconds (`/proc/stat`): busy
/// (user, nice, system, irq, softirq) and stolen (steal: time the hypervisor ran something else
/// on a virtual CPU that had work, which is not this machine's CPU to spend).
pub fn machine_cpu_s() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal] = ticks[..] else {
        return None;
    };
    // SAFETY: sysconf(3) has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let secs = |t: u64| t as f64 / hz as f64;
    (hz > 0).then(|| (secs(user + nice + system + irq + softirq), secs(steal)))
}

/// The machine's busy and stolen CPU seconds since `before` (a [`machine_cpu_s`] reading).
pub fn machine_cpu_since(before: Option<(f64, f64)>) -> Option<(f64, f64)> {
    before
        .zip(machine_cpu_s())
        .map(|((busy0, steal0), (busy1, steal1))| (busy1 - busy0, steal1 - steal0))
}

/// Sends `signal` to process `pid`: a sandbox's init (the failure a test injects), a leftover
/// daemon, one a test stops and continues. A pid below 1 is refused: kill(2) reads 0 as "my
/// process group" and -1 as "every process I may signal", so a pid parsed from a status line that
/// said 0 (`ctr tasks ls` shows 0 when the shim did not answer in time) would kill the test run
/// itself, cargo and CI included.
pub fn signal(pid: i64, signal: i32) -> std::io::Result<()> {
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("refusing to signal pid {pid}: not a single process"),
        )
    })?;
    // SAFETY: kill(2) of one process (pid > 0); a pid that is gone is ESRCH.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// [`signal`] with SIGKILL.
pub fn sigkill(pid: i64) -> std::io::Result<()> {
    signal(pid, libc::SIGKILL)
}
