//! One handler per message kind. A handler replies on the sender's connection; a protocol
//! violation returns `Err` and the server drops that connection.

use std::os::fd::BorrowedFd;
use std::time::Instant;

use super::{Broker, Lease, MAX_KV_NOTES, Waiting};
use crate::seqpacket::SocketError;
use crate::wire::{ErrorCode, KvBlock, MAX_FRAME, MAX_KV_BLOCKS, Msg, Role};

/// Why a connection is dropped.
pub(super) type Violation = String;

pub(super) fn err(code: ErrorCode, message: impl Into<String>) -> Msg {
    Msg::Error {
        code,
        message: message.into(),
    }
}

impl Broker {
    /// Sends `msg` to `peer`. A reply is never lost in silence (the peer waits for it): one
    /// too large for a frame becomes an error reply, and a send that fails otherwise (no room,
    /// peer gone) shuts the connection down, so the peer reads end-of-file and the poll loop
    /// drops it.
    pub(super) fn reply(&self, peer: u32, msg: &Msg, fds: &[BorrowedFd<'_>]) {
        let Some(p) = self.peers.get(&peer) else {
            return;
        };
        let e = match p.conn.send(msg, fds) {
            Ok(()) => return,
            Err(SocketError::TooLarge(n)) => {
                let m = err(
                    ErrorCode::Backend,
                    format!(
                        "the broker's reply is {n} bytes, over the {MAX_FRAME}-byte frame bound"
                    ),
                );
                match p.conn.send(&m, &[]) {
                    Ok(()) => {
                        tracing::warn!(peer, bytes = n, "reply too large: sent an error instead");
                        return;
                    }
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        tracing::warn!(peer, error = %e, "reply failed: shutting the connection down");
        if let Err(e) = p.conn.shutdown() {
            tracing::warn!(peer, error = %e, "shutdown failed");
        }
    }

    /// Dispatches one decoded message from `peer`.
    pub(super) fn handle(&mut self, peer: u32, msg: Msg) -> Result<(), Violation> {
        let role = self.peers.get(&peer).and_then(|p| p.role);
        match (role, msg) {
            (
                None,
                Msg::Hello {
                    role,
                    known_instance,
                },
            ) => self.on_hello(peer, role, known_instance),
            (None, m) => Err(format!("{m:?} before hello")),
            (Some(_), Msg::Hello { .. }) => Err("second hello".into()),
            (Some(_), Msg::ManifestReq) => {
                self.on_manifest(peer);
                Ok(())
            }
            (Some(Role::Observer | Role::Operator), Msg::Acquire { .. }) => {
                Err("observer cannot acquire".into())
            }
            (Some(r), Msg::Acquire { page_bytes, pages }) => {
                self.on_acquire(peer, r, page_bytes, pages)
            }
            (Some(_), Msg::Heartbeat { epoch }) => {
                if let Some(m) = self.check_lease(peer, epoch) {
                    self.reply(peer, &m, &[]);
                } else {
                    self.reply(peer, &Msg::Ok { epoch }, &[]);
                }
                Ok(())
            }
            (
                Some(_),
                Msg::AllocWeights {
                    epoch,
                    version,
                    bytes,
                },
            ) => {
                self.on_alloc_weights(peer, epoch, version, bytes);
                Ok(())
            }
            (
                Some(_),
                Msg::Publish {
                    epoch,
                    version,
                    checksum,
                    meta,
                },
            ) => {
                self.on_publish(peer, epoch, version, checksum, meta);
                Ok(())
            }
            (
                Some(_),
                Msg::Admit {
                    epoch,
                    request_id,
                    params,
                    sampler_state,
                    prompt,
                },
            ) => {
                let r = match self.check_lease(peer, epoch) {
                    Some(m) => m,
                    None => match self.log.admit(request_id, params, sampler_state, prompt) {
                        Ok(()) => Msg::Ok { epoch },
                        Err(e) => err(ErrorCode::BadRequest, e.to_string()),
                    },
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(_), Msg::Commit { epoch, entries }) => {
                let r = match self.check_lease(peer, epoch) {
                    Some(m) => m,
                    None => match self.log.commit(&entries) {
                        Ok(()) => Msg::Ok { epoch },
                        Err(e) => err(ErrorCode::BadRequest, e.to_string()),
                    },
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(_), Msg::KvNote { epoch, blocks }) => {
                let r = match self.check_lease(peer, epoch) {
                    Some(m) => m,
                    None => self.on_kv_note(epoch, &blocks),
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(_), Msg::KvAdoptReq { epoch, from }) => {
                let r = match self.check_lease(peer, epoch) {
                    Some(m) => m,
                    None => self.kv_adoptable(from),
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(_), Msg::KvAdoptDone { epoch }) => {
                let r = match self.check_lease(peer, epoch) {
                    Some(m) => m,
                    None => {
                        self.drop_adoptable("the successor is done adopting");
                        Msg::Ok { epoch }
                    }
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(_), Msg::LogList) => {
                self.reply(
                    peer,
                    &Msg::LogIds {
                        ids: self.log.ids(),
                    },
                    &[],
                );
                Ok(())
            }
            (Some(_), Msg::LogGet { request_id }) => {
                let r = match self.log.get(request_id) {
                    Some(l) => Msg::LogEntry(l.clone()),
                    None => err(ErrorCode::BadRequest, format!("no request {request_id}")),
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(_), Msg::Release { epoch }) => {
                let r = match self.check_lease(peer, epoch) {
                    Some(m) => m,
                    None => {
                        if let Some(l) = self.lease.take()
                            && let Some(kv) = self.kv.as_mut()
                        {
                            kv.pages.give_back(&l.pages);
                        }
                        tracing::info!(peer, epoch, "lease released");
                        Msg::Ok { epoch }
                    }
                };
                self.reply(peer, &r, &[]);
                Ok(())
            }
            (Some(r), Msg::Fence) if r != Role::Operator => {
                tracing::warn!(peer, role = ?r, "fence refused: not an operator");
                let m = err(
                    ErrorCode::Forbidden,
                    format!("a {r:?} connection cannot fence; say hello as an operator"),
                );
                self.reply(peer, &m, &[]);
                Ok(())
            }
            (Some(_), Msg::Fence) => {
                tracing::info!(peer, "fence requested by an operator");
                if self.lease.is_some() {
                    self.primary_lost("fenced on request");
                } else {
                    self.epoch += 1;
                }
                self.reply(peer, &Msg::Ok { epoch: self.epoch }, &[]);
                Ok(())
            }
            (Some(_), Msg::StatusReq) => {
                self.reply(peer, &Msg::StatusReply(self.status()), &[]);
                Ok(())
            }
            (Some(_), m) => Err(format!("{m:?} is not a request")),
        }
    }

    fn on_hello(&mut self, peer: u32, role: Role, known: u64) -> Result<(), Violation> {
        if known != 0 && known != self.instance {
            let m = err(
                ErrorCode::BrokerRestarted,
                format!(
                    "broker restarted: this worker was attached to broker instance {known:016x}, \
                     this is instance {:016x}; its weights, KV arena and token log are gone",
                    self.instance
                ),
            );
            self.reply(peer, &m, &[]);
            return Err("hello for another broker instance".into());
        }
        let Some(p) = self.peers.get_mut(&peer) else {
            return Ok(());
        };
        if role == Role::Operator && !self.cfg.access.operator_uids.contains(&p.uid) {
            let uid = p.uid;
            let m = err(
                ErrorCode::Forbidden,
                format!("uid {uid} may not connect as an operator"),
            );
            self.reply(peer, &m, &[]);
            return Err(format!("operator hello from uid {uid}"));
        }
        p.role = Some(role);
        let pid = p.pid as u32;
        tracing::info!(peer, pid, ?role, "hello");
        let m = Msg::HelloOk {
            instance: self.instance,
            worker_id: peer,
            epoch: self.epoch,
            pid,
        };
        self.reply(peer, &m, &[]);
        Ok(())
    }

    /// `Some(refusal)` unless `peer` holds the current lease at `epoch`; renews the lease.
    pub(super) fn check_lease(&mut self, peer: u32, epoch: u64) -> Option<Msg> {
        let lease_ms = self.cfg.lease;
        match self.lease.as_mut() {
            Some(l) if l.peer == peer && l.epoch == epoch && epoch == self.epoch => {
                l.deadline = Instant::now() + lease_ms;
                None
            }
            _ if epoch != self.epoch => Some(err(
                ErrorCode::StaleEpoch,
                format!(
                    "epoch {epoch} is stale: the current epoch is {}",
                    self.epoch
                ),
            )),
            _ => Some(err(ErrorCode::NotPrimary, "this connection holds no lease")),
        }
    }

    fn on_acquire(
        &mut self,
        peer: u32,
        role: Role,
        page_bytes: u64,
        pages: u32,
    ) -> Result<(), Violation> {
        if role == Role::Shadow && !self.orphaned {
            // One pending acquire per connection: a second one, sent before the first was
            // answered, breaks request/reply pairing, and would queue the peer twice.
            if self.shadows.iter().any(|w| w.peer == peer) {
                return Err("second acquire while waiting for promotion".into());
            }
            tracing::info!(peer, "shadow waiting for promotion");
            self.shadows.push_back(Waiting {
                peer,
                pages,
                page_bytes,
            });
            return Ok(());
        }
        if let Some(l) = &self.lease {
            let m = err(
                ErrorCode::NotPrimary,
                format!("the lease is held by worker {}", l.peer),
            );
            self.reply(peer, &m, &[]);
            return Ok(());
        }
        self.grant(peer, page_bytes, pages);
        Ok(())
    }

    /// Records the lease holder's full KV blocks (its lease was checked).
    fn on_kv_note(&mut self, epoch: u64, blocks: &[KvBlock]) -> Msg {
        let Some(l) = self.lease.as_mut() else {
            return err(ErrorCode::NotPrimary, "this connection holds no lease");
        };
        for b in blocks {
            if l.kv_notes.len() >= MAX_KV_NOTES && !l.kv_notes.contains_key(&b.block) {
                return err(
                    ErrorCode::BadRequest,
                    format!("more than {MAX_KV_NOTES} KV block records for one lease"),
                );
            }
            l.kv_notes.insert(b.block, *b);
        }
        Msg::Ok { epoch }
    }

    /// The dead predecessor's pages and block records from block index `from` on.
    fn kv_adoptable(&self, from: u32) -> Msg {
        let Some(a) = self.adoptable.as_ref() else {
            return Msg::KvAdoptable {
                page_bytes: 0,
                pages: Vec::new(),
                blocks: Vec::new(),
                more: false,
            };
        };
        let mut blocks: Vec<KvBlock> = a
            .blocks
            .range(from..)
            .take(MAX_KV_BLOCKS + 1)
            .map(|(_, b)| *b)
            .collect();
        let more = blocks.len() > MAX_KV_BLOCKS;
        blocks.truncate(MAX_KV_BLOCKS);
        Msg::KvAdoptable {
            page_bytes: a.page_bytes,
            pages: a.pages.clone(),
            blocks,
            more,
        }
    }

    /// Grants the lease to `peer` under a new epoch.
    pub(super) fn grant(&mut self, peer: u32, page_bytes: u64, pages: u32) {
        let mut taken = self.take_kv_pages(page_bytes, pages);
        if taken.is_err() && self.adoptable.is_some() {
            // The arena has no room for a fresh run beside the dead primary's: the successor
            // rebuilds its KV instead of adopting it.
            self.drop_adoptable("no room for a new primary beside them");
            taken = self.take_kv_pages(page_bytes, pages);
        }
        let runs = match taken {
            Ok(runs) => runs,
            Err(m) => {
                self.reply(peer, &m, &[]);
                return;
            }
        };
        self.epoch += 1;
        let takeover = self.orphaned || self.log.inflight() > 0;
        if self.orphaned {
            self.takeovers += 1;
        }
        self.orphaned = false;
        let weights_ok = self.weights_ok && self.weights.as_ref().is_some_and(|w| w.published);
        self.lease = Some(Lease {
            peer,
            epoch: self.epoch,
            pages: runs.clone(),
            deadline: Instant::now() + self.cfg.lease,
            kv_notes: Default::default(),
        });
        tracing::info!(
            peer,
            epoch = self.epoch,
            takeover,
            weights_ok,
            "lease granted"
        );
        let m = Msg::Grant {
            epoch: self.epoch,
            lease_ms: self.cfg.lease.as_millis() as u32,
            pages: runs,
            weights_ok,
            takeover,
        };
        self.reply(peer, &m, &[]);
    }
}
