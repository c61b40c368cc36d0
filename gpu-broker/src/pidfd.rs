//! Process handles that cannot be confused by pid reuse (`pidfd_open`, `pidfd_send_signal`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

/// A pidfd: readable once the process has exited.
#[derive(Debug)]
pub struct PidFd {
    fd: OwnedFd,
    pid: i32,
}

impl PidFd {
    /// Opens a pidfd for `pid`.
    pub fn open(pid: i32) -> Result<Self, Errno> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no memory is shared.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if r < 0 {
            return Err(Errno::last());
        }
        // SAFETY: the syscall returned a fresh fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(r as i32) };
        Ok(Self { fd, pid })
    }

    /// The pid this handle refers to.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether the process has exited (waits at most `timeout`).
    pub fn wait_exited(&self, timeout: Duration) -> bool {
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
        matches!(poll(&mut fds, PollTimeout::from(ms)), Ok(n) if n > 0)
    }

    /// Whether the process has exited, without waiting.
    pub fn exited(&self) -> bool {
        self.wait_exited(Duration::ZERO)
    }

    /// Sends `SIGKILL` through the pidfd (never hits a recycled pid).
    pub fn kill(&self) -> Result<(), Errno> {
        // SAFETY: pidfd_send_signal with a valid pidfd, a signal number and null siginfo.
        let r = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if r < 0 { Err(Errno::last()) } else { Ok(()) }
    }
}

impl AsFd for PidFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
