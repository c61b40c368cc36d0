//! The broker's single-threaded poll loop: accept, read one packet per ready connection, dispatch,
//! and watch the lease deadline.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use thiserror::Error;

use super::{Broker, Peer};
use crate::pidfd::PidFd;
use crate::seqpacket::{Conn, Listener, SocketError};
use crate::wire::{ErrorCode, Msg};

/// Why the server stopped.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Binding the socket failed.
    #[error("cannot listen on the broker socket")]
    Listen(#[source] SocketError),
    /// `poll` failed.
    #[error("poll failed")]
    Poll(#[source] nix::errno::Errno),
}

const TICK: Duration = Duration::from_millis(100);

/// Runs the broker until `stop` returns true (checked every tick).
pub fn serve(mut b: Broker, stop: &dyn Fn() -> bool) -> Result<(), ServeError> {
    let access = &b.cfg.access;
    let listener = Listener::bind(&b.cfg.socket, access.socket_mode(), access.group)
        .map_err(ServeError::Listen)?;
    tracing::info!(
        socket = %b.cfg.socket.display(),
        mode = format!("{:o}", access.socket_mode()),
        group = ?access.group,
        uids = ?access.uids,
        operators = ?access.operator_uids,
        max_peers = access.max_peers,
        instance = format!("{:016x}", b.instance),
        backend = b.backend.name(),
        "broker listening"
    );
    // Set when accept ran out of fds: the listener stays readable while the connection waits in
    // the backlog, so it is left out of the poll set until the next tick instead of spinning.
    let mut accept_paused_until: Option<Instant> = None;
    while !stop() {
        let ids: Vec<u32> = b.peers.keys().copied().collect();
        let timeout = b
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()).min(TICK))
            .unwrap_or(TICK);
        let holder = b.lease.as_ref().map(|l| l.peer);
        let ready = {
            let paused = accept_paused_until.is_some_and(|t| Instant::now() < t);
            let listen_for = if paused {
                PollFlags::empty()
            } else {
                PollFlags::POLLIN
            };
            let mut fds = vec![PollFd::new(listener.as_fd(), listen_for)];
            for id in &ids {
                fds.push(PollFd::new(b.peers[id].conn.as_fd(), PollFlags::POLLIN));
            }
            // The lease holder's pidfd: death is seen even if its socket is shared with a child.
            if let Some(p) = holder
                .and_then(|h| b.peers.get(&h))
                .and_then(|p| p.pidfd.as_ref())
            {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
            }
            let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(ServeError::Poll(e)),
            }
            let rev: Vec<bool> = fds
                .iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect();
            rev
        };
        if ready[0] {
            accept_paused_until = match accept_all(&mut b, &listener) {
                Accepted::Drained => None,
                Accepted::OutOfFds => {
                    if accept_paused_until.is_none() {
                        tracing::warn!(
                            peers = b.peers.len(),
                            "accept: out of file descriptors; new connections wait until some close"
                        );
                    }
                    Some(Instant::now() + TICK)
                }
            };
        }
        for (i, id) in ids.iter().enumerate() {
            if ready[i + 1] {
                read_one(&mut b, *id);
            }
        }
        // Only if the peer whose pidfd fired still holds the lease: a socket hang-up handled above
        // may already have promoted a successor in this same iteration.
        let still_holder = b.lease.as_ref().map(|l| l.peer) == holder;
        if ready.len() > ids.len() + 1 && ready[ids.len() + 1] && still_holder {
            b.primary_lost("pid exited");
        }
        b.tick();
    }
    let _ = std::fs::remove_file(&b.cfg.socket);
    tracing::info!("broker stopped");
    Ok(())
}

/// How an accept round ended.
enum Accepted {
    /// No connection is pending any more.
    Drained,
    /// The process (or system) is out of fds: the pending connection stays in the backlog.
    OutOfFds,
}

fn accept_all(b: &mut Broker, listener: &Listener) -> Accepted {
    loop {
        match listener.accept() {
            Ok(Some(conn)) => admit(b, conn),
            Ok(None) => return Accepted::Drained,
            Err(SocketError::Sys {
                source: Errno::EMFILE | Errno::ENFILE | Errno::ENOBUFS | Errno::ENOMEM,
                ..
            }) => return Accepted::OutOfFds,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return Accepted::Drained;
            }
        }
    }
}

/// Takes a new connection as a peer, or refuses it (with an error it can read) when its uid is
/// not allowed or the broker serves as many peers as it may.
fn admit(b: &mut Broker, conn: Conn) {
    let access = &b.cfg.access;
    let (code, message) = match conn.peer_cred() {
        Err(e) => (
            ErrorCode::Forbidden,
            format!("cannot tell who connected: {e}"),
        ),
        Ok(c) if !access.uids.contains(&c.uid) => (
            ErrorCode::Forbidden,
            format!("uid {} may not use this broker", c.uid),
        ),
        Ok(_) if b.peers.len() >= access.max_peers => (
            ErrorCode::NoCapacity,
            format!("the broker serves {} connections at most", access.max_peers),
        ),
        Ok(c) => {
            if conn.set_nonblocking().is_err() {
                return;
            }
            let pidfd = PidFd::open(c.pid).ok().map(Arc::new);
            let id = b.next_peer;
            b.next_peer += 1;
            tracing::debug!(peer = id, pid = c.pid, uid = c.uid, "connection accepted");
            b.peers.insert(
                id,
                Peer {
                    conn,
                    pidfd,
                    pid: c.pid,
                    uid: c.uid,
                    role: None,
                },
            );
            return;
        }
    };
    let cred = conn.peer_cred().ok();
    tracing::warn!(
        pid = cred.map(|c| c.pid),
        uid = cred.map(|c| c.uid),
        reason = %message,
        "connection refused"
    );
    // Non-blocking: a peer that does not read its refusal cannot stall the loop.
    if conn.set_nonblocking().is_ok() {
        let _ = conn.send(&Msg::Error { code, message }, &[]);
    }
}

fn read_one(b: &mut Broker, id: u32) {
    let Some(p) = b.peers.get(&id) else {
        return;
    };
    // Fds a worker sends are never used: they are closed when `_fds` drops.
    let r = p.conn.recv();
    match r {
        Ok((msg, _fds)) => {
            if let Err(v) = b.handle(id, msg) {
                tracing::warn!(peer = id, violation = %v, "protocol violation: dropping connection");
                b.peer_gone(id, "protocol violation");
            }
        }
        Err(SocketError::WouldBlock) => {}
        Err(SocketError::Closed) => b.peer_gone(id, "connection closed"),
        Err(e) => {
            tracing::warn!(peer = id, error = %e, "bad packet: dropping connection");
            b.peer_gone(id, "malformed packet");
        }
    }
}
