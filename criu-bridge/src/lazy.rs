//! Lazy restore: processes run as soon as CRIU has rebuilt them, and their anonymous memory is
//! filled afterwards by a `criu lazy-pages` daemon through userfaultfd — on demand when a page is
//! touched, and in the background for the rest. The restore no longer reads the whole memory
//! image before the container runs, so its time stops growing with the process's memory.
//!
//! The daemon serves pages from the checkpoint's own images (no page server), listens on
//! `lazy-pages.socket` in the restore's work dir, and exits once every page is in place (or the
//! restored processes are gone).

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use std::os::unix::process::CommandExt;

use crate::runc::Runc;

/// Nice value of the lazy-pages daemon.
const LAZY_PAGES_NICE: libc::c_int = 10;

/// Why the lazy-pages daemon did not start.
#[derive(Debug, thiserror::Error)]
pub enum LazyPagesError {
    /// CRIU could not be run.
    #[error("cannot run {criu} lazy-pages")]
    Spawn {
        /// The CRIU binary.
        criu: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// CRIU refused to start the daemon.
    #[error("criu lazy-pages failed ({status}); {log}")]
    Failed {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Relevant lines of its log.
        log: crate::criu::CriuLog,
    },
    /// The daemon started but its pid cannot be held.
    #[error("criu lazy-pages started but its pid file {path} is unusable")]
    Pid {
        /// The pid file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Does this kernel and CRIU support lazy restore (non-cooperative userfaultfd)?
pub fn lazy_pages_supported(runc: &Runc) -> bool {
    crate::criu::supports_feature(runc, "uffd-noncoop")
}

/// A running `criu lazy-pages` daemon, held by pidfd.
#[derive(Debug)]
pub struct LazyPages {
    pid: i32,
    pidfd: OwnedFd,
}

impl LazyPages {
    /// Starts the daemon for the images in `image_dir`, listening in `work_dir` (where the
    /// restore must run too). Returns once it listens.
    pub fn start(runc: &Runc, image_dir: &Path, work_dir: &Path) -> Result<Self, LazyPagesError> {
        let pid_file = work_dir.join("lazy-pages.pid");
        let _ = std::fs::remove_file(&pid_file);
        let _ = std::fs::remove_file(work_dir.join("lazy-pages.socket"));
        let mut c = Command::new(&runc.criu);
        // The background fill is work nobody waits for; on-demand faults are few. At a lower
        // priority it leaves the CPU to restores running beside it (forks) and to the
        // workload.
        // SAFETY: setpriority(2) is async-signal-safe and touches only the child.
        unsafe {
            c.pre_exec(|| {
                if libc::setpriority(libc::PRIO_PROCESS, 0, LAZY_PAGES_NICE) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c.arg("lazy-pages")
            .arg("--daemon")
            .arg("--images-dir")
            .arg(image_dir)
            .arg("--work-dir")
            .arg(work_dir)
            .arg("--pidfile")
            .arg(&pid_file)
            .args(["-o", "lazy-pages.log", "-v2"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let out = runc
            .spawner
            .output(c)
            .map_err(|source| LazyPagesError::Spawn {
                criu: runc.criu.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(LazyPagesError::Failed {
                status: out.status,
                log: crate::criu::CriuLog::read(work_dir.join("lazy-pages.log")),
            });
        }
        let pid_err = |source| LazyPagesError::Pid {
            path: pid_file.clone(),
            source,
        };
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .map_err(pid_err)?
            .trim()
            .parse()
            .map_err(|e| pid_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        // The daemon is a child of a subreaper (the shim) or of init: until it is reaped its pid
        // cannot be reused, and from here on the pidfd names it whatever happens.
        let pidfd = crate::sys::pidfd_open(pid).map_err(pid_err)?;
        Ok(Self { pid, pidfd })
    }

    /// The daemon's pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Has it exited (every page delivered, or the processes gone)?
    pub fn is_done(&self) -> bool {
        crate::sys::pidfd_wait_exit(&self.pidfd, Duration::ZERO)
    }

    /// Waits up to `timeout` for the daemon to finish; true if it did.
    pub fn wait(&self, timeout: Duration) -> bool {
        crate::sys::pidfd_wait_exit(&self.pidfd, timeout)
    }

    /// Stops the daemon (a failed restore leaves it waiting for a connection forever).
    pub fn kill(&self) {
        let _ = crate::sys::pidfd_send_signal(&self.pidfd, libc::SIGKILL);
    }
}
