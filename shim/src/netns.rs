//! Network namespace fix-ups after a restore. runc restores a container's own network namespace
//! empty (CRIU does not carry its links), so its loopback comes back down and a process
//! listening on 127.0.0.1 is unreachable; the shim brings `lo` up again.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

/// Brings the loopback interface of `pid`'s network namespace up, unless `pid` shares the
/// shim's namespace.
pub fn loopback_up(pid: u32) -> std::io::Result<()> {
    let theirs = File::open(format!("/proc/{pid}/ns/net"))?;
    let ours = std::fs::metadata("/proc/self/ns/net")?;
    if theirs.metadata()?.ino() == ours.ino() {
        return Ok(());
    }
    // setns changes only the calling thread: do it on a thread of its own.
    std::thread::spawn(move || -> std::io::Result<()> {
        nix::sched::setns(theirs.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(std::io::Error::from)?;
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor we own from here on.
        let sock = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the `ifreq` we pass, which outlives
        // both calls; the flags member of the union is the one these requests use.
        unsafe {
            if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    })
    .join()
    .unwrap_or_else(|_| Err(std::io::Error::other("loopback thread panicked")))
}
