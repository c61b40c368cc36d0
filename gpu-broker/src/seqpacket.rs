//! `SOCK_SEQPACKET` Unix sockets carrying one [`Msg`] per packet, with fds by `SCM_RIGHTS`.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr, sockopt,
};
use thiserror::Error;

use crate::wire::{self, DecodeError, MAX_FRAME, Msg};

/// Most fds one packet may carry.
pub const MAX_FDS: usize = 4;

/// Failure on a packet socket.
#[derive(Debug, Error)]
pub enum SocketError {
    /// A socket call failed.
    #[error("{op} on the broker socket {path} failed")]
    Sys {
        /// The call.
        op: &'static str,
        /// The socket path, if known.
        path: String,
        /// Errno.
        #[source]
        source: Errno,
    },
    /// The peer closed the connection.
    #[error("the peer closed the connection")]
    Closed,
    /// Non-blocking socket with nothing to read, or no room to send.
    #[error("the socket would block")]
    WouldBlock,
    /// The packet did not fit the size bound (the kernel truncated it).
    #[error("packet larger than the {MAX_FRAME}-byte bound")]
    Truncated,
    /// The packet did not decode.
    #[error("malformed packet")]
    Malformed(#[from] DecodeError),
    /// The message to send is larger than the bound.
    #[error("message of {0} bytes exceeds the {MAX_FRAME}-byte bound")]
    TooLarge(usize),
}

fn sys<'a>(op: &'static str, path: &'a str) -> impl FnOnce(Errno) -> SocketError + 'a {
    move |source| SocketError::Sys {
        op,
        path: path.to_string(),
        source,
    }
}

fn io_err(op: &'static str, path: &str, e: std::io::Error) -> SocketError {
    SocketError::Sys {
        op,
        path: path.to_string(),
        source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// Binds `fd` at `staged` (in a private directory), sets its mode and group, and renames it to
/// `path`: the socket is never reachable at `path` with a mode the umask chose.
fn bind_staged(
    fd: &OwnedFd,
    staged: &Path,
    path: &Path,
    mode: u32,
    group: Option<u32>,
    p: &str,
) -> Result<(), SocketError> {
    let addr = UnixAddr::new(staged).map_err(sys("address", p))?;
    socket::bind(fd.as_raw_fd(), &addr).map_err(sys("bind", p))?;
    if let Some(gid) = group {
        std::os::unix::fs::chown(staged, None, Some(gid))
            .map_err(|e| io_err("chown the socket to its group", p, e))?;
    }
    std::fs::set_permissions(staged, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_err("chmod the socket", p, e))?;
    std::fs::rename(staged, path).map_err(|e| io_err("rename the socket into place", p, e))
}

/// A listening broker socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
}

impl Listener {
    /// Binds `path` (replacing a stale socket file) and listens. The socket file gets `mode`
    /// (and group `group`) before it appears at `path`, whatever the umask: it is bound in a
    /// private (0700) directory beside `path`, given its mode there, then renamed into place.
    pub fn bind(path: &Path, mode: u32, group: Option<u32>) -> Result<Self, SocketError> {
        let p = path.display().to_string();
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(sys("socket", &p))?;
        // A live broker on this path keeps it; only a stale socket file is replaced.
        if Conn::connect(path).is_ok() {
            return Err(SocketError::Sys {
                op: "bind (another broker is listening)",
                path: p,
                source: Errno::EADDRINUSE,
            });
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|e| io_err("create the socket's directory", &p, e))?;
        }
        let staging = nix::unistd::mkdtemp(&dir.join(".belayer-broker-XXXXXX"))
            .map_err(sys("mkdtemp beside the socket", &p))?;
        let r = bind_staged(&fd, &staging.join("s"), path, mode, group, &p);
        let _ = std::fs::remove_dir_all(&staging);
        r?;
        socket::listen(&fd, Backlog::new(64).map_err(sys("listen", &p))?)
            .map_err(sys("listen", &p))?;
        Ok(Self { fd })
    }

    /// Accepts one pending connection, `None` when none is pending.
    pub fn accept(&self) -> Result<Option<Conn>, SocketError> {
        match socket::accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(fd) => {
                // SAFETY: accept4 returned a fresh fd that nothing else owns.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                Ok(Some(Conn { fd }))
            }
            Err(Errno::EAGAIN) => Ok(None),
            Err(e) => Err(sys("accept", "")(e)),
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A peer's credentials (`SO_PEERCRED`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id.
    pub pid: i32,
    /// Effective uid.
    pub uid: u32,
    /// Effective gid.
    pub gid: u32,
}

/// One connected packet socket.
#[derive(Debug)]
pub struct Conn {
    fd: OwnedFd,
}

impl Conn {
    /// Connects to a broker socket.
    pub fn connect(path: &Path) -> Result<Self, SocketError> {
        let p = path.display().to_string();
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(sys("socket", &p))?;
        let addr = UnixAddr::new(path).map_err(sys("address", &p))?;
        socket::connect(fd.as_raw_fd(), &addr).map_err(sys("connect", &p))?;
        Ok(Self { fd })
    }

    /// The peer's pid as the kernel recorded it at connect time (`SO_PEERCRED`).
    pub fn peer_pid(&self) -> Result<i32, SocketError> {
        Ok(self.peer_cred()?.pid)
    }

    /// The peer's pid, uid and gid as the kernel recorded them at connect time (`SO_PEERCRED`):
    /// what the peer cannot lie about.
    pub fn peer_cred(&self) -> Result<PeerCred, SocketError> {
        let cred = socket::getsockopt(&self.fd, sockopt::PeerCredentials)
            .map_err(sys("SO_PEERCRED", ""))?;
        Ok(PeerCred {
            pid: cred.pid(),
            uid: cred.uid(),
            gid: cred.gid(),
        })
    }

    /// Sends raw bytes as one packet (tests use this to send malformed frames).
    pub fn send_raw(&self, bytes: &[u8], fds: &[RawFd]) -> Result<(), SocketError> {
        let iov = [IoSlice::new(bytes)];
        let cmsg = [ControlMessage::ScmRights(fds)];
        let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
        loop {
            match socket::sendmsg::<()>(
                self.fd.as_raw_fd(),
                &iov,
                cmsgs,
                MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(Errno::EPIPE | Errno::ECONNRESET) => return Err(SocketError::Closed),
                Err(Errno::EAGAIN) => return Err(SocketError::WouldBlock),
                Err(e) => return Err(sys("sendmsg", "")(e)),
            }
        }
    }

    /// Sends one message with fds attached.
    pub fn send(&self, msg: &Msg, fds: &[BorrowedFd<'_>]) -> Result<(), SocketError> {
        let frame = wire::encode(msg);
        if frame.len() > MAX_FRAME {
            return Err(SocketError::TooLarge(frame.len()));
        }
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        self.send_raw(&frame, &raw)
    }

    /// Receives one packet: its raw bytes and the fds it carried.
    pub fn recv_raw(&self) -> Result<(Vec<u8>, Vec<OwnedFd>), SocketError> {
        let mut buf = vec![0u8; MAX_FRAME + 1];
        let mut space = nix::cmsg_space!([RawFd; MAX_FDS]);
        loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let r = socket::recvmsg::<()>(
                self.fd.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_CMSG_CLOEXEC,
            );
            let msg = match r {
                Ok(m) => m,
                Err(Errno::EINTR) => continue,
                Err(Errno::ECONNRESET) => return Err(SocketError::Closed),
                Err(Errno::EAGAIN) => return Err(SocketError::WouldBlock),
                Err(e) => return Err(sys("recvmsg", "")(e)),
            };
            let mut fds = Vec::new();
            if let Ok(cmsgs) = msg.cmsgs() {
                for c in cmsgs {
                    if let ControlMessageOwned::ScmRights(rs) = c {
                        for f in rs {
                            // SAFETY: SCM_RIGHTS gave us new fds that nothing else owns.
                            fds.push(unsafe { OwnedFd::from_raw_fd(f) });
                        }
                    }
                }
            }
            let n = msg.bytes;
            let truncated = msg
                .flags
                .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC);
            if n == 0 && fds.is_empty() {
                return Err(SocketError::Closed);
            }
            if truncated || n > MAX_FRAME {
                return Err(SocketError::Truncated);
            }
            buf.truncate(n);
            return Ok((buf, fds));
        }
    }

    /// Receives and decodes one message.
    pub fn recv(&self) -> Result<(Msg, Vec<OwnedFd>), SocketError> {
        let (buf, fds) = self.recv_raw()?;
        Ok((wire::decode(&buf)?, fds))
    }

    /// A connected pair of packet sockets (in-process peers, tests).
    pub fn pair() -> Result<(Self, Self), SocketError> {
        let (a, b) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(sys("socketpair", ""))?;
        Ok((Self { fd: a }, Self { fd: b }))
    }

    /// Shuts the connection down both ways: the peer reads end-of-file, and so does this side's
    /// next `recv` (the broker then drops the connection as closed).
    pub fn shutdown(&self) -> Result<(), SocketError> {
        socket::shutdown(self.fd.as_raw_fd(), socket::Shutdown::Both).map_err(sys("shutdown", ""))
    }

    /// Puts the socket in non-blocking mode (the broker's side).
    pub fn set_nonblocking(&self) -> Result<(), SocketError> {
        use nix::fcntl::{FcntlArg, OFlag, fcntl};
        let fl = fcntl(self.fd.as_raw_fd(), FcntlArg::F_GETFL).map_err(sys("F_GETFL", ""))?;
        let fl = OFlag::from_bits_truncate(fl) | OFlag::O_NONBLOCK;
        fcntl(self.fd.as_raw_fd(), FcntlArg::F_SETFL(fl)).map_err(sys("F_SETFL", ""))?;
        Ok(())
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
