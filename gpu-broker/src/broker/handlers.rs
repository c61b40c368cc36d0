//! One handler per message kind. A handler replies on the sender's connection; a protocol
//! violation returns `Err` and the server drops that connection.

use std::os::fd::BorrowedFd;
use std::time::Instant;

use super::{Broker, Kv, Lease, Waiting, Weights};
use crate::wire::{ErrorCode, Msg, RegionInfo, RegionKind, Role};

/// Why a connection is dropped.
pub(super) type Violation = String;

fn err(code: ErrorCode, message: impl Into<String>) -> Msg {
    Msg::Error {
        code,
        message: message.into(),
    }
}

impl Broker {
    /// Sends `msg` to `peer`; a failed send drops the peer later (its socket reports an error).
    pub(super) fn reply(&self, peer: u32, msg: &Msg, fds: &[BorrowedFd<'_>]) {
        if let Some(p) = self.peers.get(&peer)
            && let Err(e) = p.conn.send(msg, fds)
        {
            tracing::warn!(peer, error = %e, "reply failed");
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
            (Some(Role::Observer), Msg::Acquire { .. }) => Err("observer cannot acquire".into()),
            (Some(r), Msg::Acquire { page_bytes, pages }) => {
                self.on_acquire(peer, r, page_bytes, pages);
                Ok(())
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
            (Some(_), Msg::Fence) => {
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

    fn region_infos(&self) -> (Vec<RegionInfo>, Vec<BorrowedFd<'_>>) {
        let mut infos = Vec::new();
        let mut fds = Vec::new();
        if let Some(w) = &self.weights
            && w.published
            && self.weights_ok
        {
            infos.push(RegionInfo {
                kind: RegionKind::Weights,
                bytes: w.region.bytes(),
                version: w.version,
                checksum: w.checksum,
                published: true,
                page_bytes: 0,
                meta: w.meta.clone(),
            });
            fds.push(w.region.handle());
        }
        if let Some(k) = &self.kv {
            infos.push(RegionInfo {
                kind: RegionKind::Kv,
                bytes: k.region.bytes(),
                version: 0,
                checksum: 0,
                published: true,
                page_bytes: k.page_bytes,
                meta: Vec::new(),
            });
            fds.push(k.region.handle());
        }
        (infos, fds)
    }

    fn on_manifest(&mut self, peer: u32) {
        let (regions, fds) = self.region_infos();
        self.reply(peer, &Msg::Manifest { regions }, &fds);
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

    fn ensure_kv(&mut self, page_bytes: u64) -> Result<(), Msg> {
        if let Some(k) = &self.kv {
            if k.page_bytes != page_bytes {
                return Err(err(
                    ErrorCode::BadRequest,
                    format!("KV arena has {}-byte pages, not {page_bytes}", k.page_bytes),
                ));
            }
            return Ok(());
        }
        if page_bytes == 0 || page_bytes > self.cfg.kv_bytes {
            return Err(err(ErrorCode::BadRequest, "bad KV page size"));
        }
        let n = (self.cfg.kv_bytes / page_bytes) as u32;
        let bytes = u64::from(n) * page_bytes;
        let mut region = self
            .backend
            .create("kv", bytes)
            .map_err(|e| err(ErrorCode::Backend, e.to_string()))?;
        region
            .seal(false)
            .map_err(|e| err(ErrorCode::Backend, e.to_string()))?;
        tracing::info!(pages = n, page_bytes, "KV arena created");
        self.kv = Some(Kv {
            region,
            page_bytes,
            pages: super::pages::Pages::new(n),
        });
        Ok(())
    }

    fn on_acquire(&mut self, peer: u32, role: Role, page_bytes: u64, pages: u32) {
        if role == Role::Shadow && !self.orphaned {
            tracing::info!(peer, "shadow waiting for promotion");
            self.shadows.push_back(Waiting {
                peer,
                pages,
                page_bytes,
            });
            return;
        }
        if let Some(l) = &self.lease {
            let m = err(
                ErrorCode::NotPrimary,
                format!("the lease is held by worker {}", l.peer),
            );
            self.reply(peer, &m, &[]);
            return;
        }
        self.grant(peer, page_bytes, pages);
    }

    /// Grants the lease to `peer` under a new epoch.
    pub(super) fn grant(&mut self, peer: u32, page_bytes: u64, pages: u32) {
        if let Err(m) = self.ensure_kv(page_bytes) {
            self.reply(peer, &m, &[]);
            return;
        }
        let Some(runs) = self.kv.as_mut().and_then(|k| k.pages.take(pages)) else {
            let m = err(
                ErrorCode::NoCapacity,
                format!("{pages} KV pages are not free"),
            );
            self.reply(peer, &m, &[]);
            return;
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

    fn on_alloc_weights(&mut self, peer: u32, epoch: u64, version: u64, bytes: u64) {
        if let Some(m) = self.check_lease(peer, epoch) {
            self.reply(peer, &m, &[]);
            return;
        }
        if self.weights_ok && self.weights.as_ref().is_some_and(|w| w.published) {
            let m = err(ErrorCode::BadRequest, "valid weights are already published");
            self.reply(peer, &m, &[]);
            return;
        }
        let r = self.backend.create("weights", bytes).and_then(|mut r| {
            r.seal(false)?;
            Ok(r)
        });
        match r {
            Ok(region) => {
                tracing::info!(peer, version, bytes, "weights region allocated (cold load)");
                self.weights = Some(Weights {
                    region,
                    version,
                    checksum: 0,
                    published: false,
                    meta: Vec::new(),
                });
                self.weights_ok = true;
                let (regions, fds) = self.region_infos_unpublished();
                self.reply(peer, &Msg::Manifest { regions }, &fds);
            }
            Err(e) => self.reply(peer, &err(ErrorCode::Backend, e.to_string()), &[]),
        }
    }

    fn region_infos_unpublished(&self) -> (Vec<RegionInfo>, Vec<BorrowedFd<'_>>) {
        match &self.weights {
            Some(w) => (
                vec![RegionInfo {
                    kind: RegionKind::Weights,
                    bytes: w.region.bytes(),
                    version: w.version,
                    checksum: 0,
                    published: false,
                    page_bytes: 0,
                    meta: Vec::new(),
                }],
                vec![w.region.handle()],
            ),
            None => (Vec::new(), Vec::new()),
        }
    }

    fn on_publish(&mut self, peer: u32, epoch: u64, version: u64, checksum: u64, meta: Vec<u8>) {
        if let Some(m) = self.check_lease(peer, epoch) {
            self.reply(peer, &m, &[]);
            return;
        }
        let seal = self.cfg.seal_weights;
        let r = match self.weights.as_mut() {
            Some(w) if !w.published && w.version == version => {
                match w.region.checksum() {
                    Ok(c) if c == checksum => match w.region.seal(seal) {
                        Ok(()) => {
                            w.checksum = c;
                            w.published = true;
                            w.meta = meta;
                            tracing::info!(
                                version,
                                checksum = c,
                                sealed = seal,
                                "weights published"
                            );
                            Msg::Ok { epoch }
                        }
                        // EBUSY: someone still maps the region writable.
                        Err(e) => err(
                            ErrorCode::BadRequest,
                            format!("cannot seal the weights: {e}"),
                        ),
                    },
                    Ok(c) => err(
                        ErrorCode::BadRequest,
                        format!(
                            "weights checksum mismatch: worker says {checksum:016x}, region holds {c:016x}"
                        ),
                    ),
                    Err(e) => err(ErrorCode::Backend, e.to_string()),
                }
            }
            _ => err(
                ErrorCode::BadRequest,
                "no unpublished weights of that version",
            ),
        };
        self.reply(peer, &r, &[]);
    }
}
