//! Network namespace fix-ups for restores. runc has CRIU restore a container's own network
//! namespace empty (runc dumps it with `--empty-ns network`: CRIU does not carry its links), so
//! its loopback would come back down: a process listening on 127.0.0.1 unreachable, and CRIU
//! itself unable to restore a socket bound or connected to 127.0.0.1 ("Network is
//! unreachable", "Cannot assign requested address"). So `lo` is brought up *inside* the
//! restore: the shim adds a `createRuntime` hook to the spec of every container whose network
//! namespace runc creates ([`install_hook`]); runc runs it on CRIU's `setup-namespaces`
//! notification, when the new namespace exists and no socket has been restored yet. The hook
//! is the shim binary itself, called with [`HOOK_ARG`] ([`run_hook`]). It runs at create too,
//! where runc has already brought `lo` up, and costs one exec there; nothing runs on a dump.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;

use crate::error::{Error, Result};
use crate::spec::Spec;

/// The argument (`argv[1]`) that makes the shim binary run as the loopback hook.
pub const HOOK_ARG: &str = "belayer-loopback-hook";

/// Adds the loopback hook ([`run_hook`], this binary at `exe`) to `spec` when runc creates the
/// container's network namespace; a namespace it joins (docker's, a pod's) is left alone.
pub fn install_hook(spec: &mut Spec, exe: &std::path::Path) -> Result<()> {
    if !spec.owns_netns() {
        return Ok(());
    }
    let exe = exe.to_str().ok_or_else(|| {
        Error::FailedPrecondition(format!("shim path {} is not UTF-8", exe.display()))
    })?;
    spec.add_create_runtime_hook(exe, &[exe, HOOK_ARG])
}

/// Why the loopback hook failed (runc prints it and fails the create or restore).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{HOOK_ARG}: cannot read the OCI state on stdin")]
    Read(#[source] std::io::Error),
    #[error("{HOOK_ARG}: the OCI state on stdin is not JSON")]
    Json(#[source] serde_json::Error),
    #[error("{HOOK_ARG}: the OCI state names no pid: {0}")]
    NoPid(String),
    #[error("{HOOK_ARG}: bringing up lo of pid {pid}")]
    Loopback {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// The hook's body: reads the OCI state runc writes on stdin and brings `lo` up in the network
/// namespace of its `pid`.
pub fn run_hook(mut state: impl Read) -> std::result::Result<(), HookError> {
    let mut text = String::new();
    state.read_to_string(&mut text).map_err(HookError::Read)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(HookError::Json)?;
    let pid = value["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or(HookError::NoPid(text))?;
    loopback_up(pid).map_err(|source| HookError::Loopback { pid, source })
}

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
