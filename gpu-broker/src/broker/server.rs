//! The broker's single-threaded poll loop: accept, read one packet per ready connection, dispatch,
//! and watch the lease deadline.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use thiserror::Error;

use super::{Broker, Peer};
use crate::pidfd::PidFd;
use crate::seqpacket::{Listener, SocketError};

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
    let listener = Listener::bind(&b.cfg.socket).map_err(ServeError::Listen)?;
    tracing::info!(socket = %b.cfg.socket.display(), instance = format!("{:016x}", b.instance), backend = b.backend.name(), "broker listening");
    while !stop() {
        let ids: Vec<u32> = b.peers.keys().copied().collect();
        let timeout = b
            .next_deadline()
            .map(|d| d.saturating_duration_since(Instant::now()).min(TICK))
            .unwrap_or(TICK);
        let holder = b.lease.as_ref().map(|l| l.peer);
        let ready = {
            let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
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
            accept_all(&mut b, &listener);
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

fn accept_all(b: &mut Broker, listener: &Listener) {
    loop {
        match listener.accept() {
            Ok(Some(conn)) => {
                let pid = conn.peer_pid().unwrap_or(0);
                let pidfd = PidFd::open(pid).ok().map(Arc::new);
                if conn.set_nonblocking().is_err() {
                    continue;
                }
                let id = b.next_peer;
                b.next_peer += 1;
                tracing::debug!(peer = id, pid, "connection accepted");
                b.peers.insert(
                    id,
                    Peer {
                        conn,
                        pidfd,
                        pid,
                        role: None,
                    },
                );
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return;
            }
        }
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
