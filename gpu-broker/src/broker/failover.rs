//! Failure handling: confirm the primary is gone, check health, fence with a new epoch, promote.

use std::time::Instant;

use super::{Adoptable, Broker, ChecksumPolicy, Zombie};

impl Broker {
    /// The primary's connection closed, its lease expired, it sent garbage, or a fence was asked
    /// for. Its lease is revoked; a shadow (if one waits) is promoted under a new epoch.
    pub(super) fn primary_lost(&mut self, reason: &str) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // A fenced primary may still hold a queued acquire (a shadow that asked again after its
        // promotion): it must not be promoted again.
        self.shadows.retain(|w| w.peer != lease.peer);
        // Shared, not taken: the peer may be granted and lost again while its zombie entry lives.
        let pidfd = self.peers.get(&lease.peer).and_then(|p| p.pidfd.clone());
        let dead = pidfd
            .as_ref()
            .is_some_and(|p| p.wait_exited(self.cfg.confirm_timeout));
        tracing::warn!(
            peer = lease.peer,
            epoch = lease.epoch,
            dead,
            reason,
            "primary lost"
        );
        // An older primary's kept pages are superseded: the successor resumes from this one.
        self.drop_adoptable("a newer primary was lost");
        match (dead, pidfd) {
            (true, _) => {
                // No writer is left: its blocks may be adopted (each checked against its
                // checksum by the successor), so its pages stay out of the pool for a while.
                if lease.kv_notes.is_empty() || self.cfg.kv_adopt_keep.is_zero() {
                    if let Some(kv) = self.kv.as_mut() {
                        kv.pages.give_back(&lease.pages);
                    }
                } else if let Some(kv) = self.kv.as_ref() {
                    tracing::info!(
                        blocks = lease.kv_notes.len(),
                        "the dead primary's KV blocks are kept for adoption"
                    );
                    self.adoptable = Some(Adoptable {
                        pages: lease.pages,
                        page_bytes: kv.page_bytes,
                        blocks: lease.kv_notes,
                        until: Instant::now() + self.cfg.kv_adopt_keep,
                    });
                }
            }
            (false, Some(pidfd)) => {
                // Alive (hung, stopped, or misbehaving): fence it. Its pages stay quarantined
                // until its pid is gone, so a zombie cannot scribble on a successor's KV.
                self.zombies.push(Zombie {
                    pidfd,
                    pages: lease.pages,
                });
            }
            (false, None) => {
                // No pidfd (pidfd_open failed at connect): its death can never be confirmed, so
                // its pages are never reused.
                tracing::warn!(
                    peer = lease.peer,
                    "no pidfd: KV pages of the lost primary stay retired"
                );
            }
        }
        // Fence: no grant or commit of the old epoch is accepted from here on.
        self.epoch += 1;
        self.orphaned = true;
        self.health_check();
        self.promote();
    }

    /// Owner, device and weights checks; failed weights are dropped so the next worker cold loads.
    fn health_check(&mut self) {
        let t = Instant::now();
        let device = self.backend.probe();
        let mut weights_ok = device.is_ok();
        if let Err(e) = &device {
            tracing::error!(error = %e, "device probe failed");
        }
        if let Some(w) = &self.weights {
            if w.published {
                match w.region.integrity() {
                    Ok(i) if i.intact => {
                        let verify =
                            self.cfg.checksum == ChecksumPolicy::Always || !i.write_protected;
                        if verify {
                            match w.region.checksum() {
                                Ok(c) if c == w.checksum => {}
                                Ok(c) => {
                                    tracing::error!(
                                        expected = w.checksum,
                                        found = c,
                                        "weights checksum mismatch"
                                    );
                                    weights_ok = false;
                                }
                                Err(e) => {
                                    tracing::error!(error = %e, "weights checksum failed");
                                    weights_ok = false;
                                }
                            }
                        }
                    }
                    Ok(_) => {
                        tracing::error!("weights region metadata changed");
                        weights_ok = false;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "weights region handle check failed");
                        weights_ok = false;
                    }
                }
            } else {
                // Never published: the dead worker was mid cold load.
                weights_ok = false;
            }
        }
        if let Some(k) = &self.kv
            && !k.region.integrity().map(|i| i.intact).unwrap_or(false)
        {
            tracing::error!("KV arena metadata changed; it is rebuilt from the log anyway");
        }
        if !weights_ok && self.weights.is_some() {
            self.weights_refused += 1;
            self.weights = None;
            tracing::warn!("weights refused for reuse: the next worker cold loads");
        }
        self.weights_ok = true;
        self.last_health_us = t.elapsed().as_micros() as u64;
        tracing::info!(us = self.last_health_us, "health check done");
    }

    /// Promotes the oldest waiting shadow, if any.
    pub(super) fn promote(&mut self) {
        while let Some(w) = self.shadows.pop_front() {
            if self.peers.contains_key(&w.peer) {
                tracing::info!(peer = w.peer, "promoting shadow");
                self.grant(w.peer, w.page_bytes, w.pages);
                if self.lease.is_some() {
                    return;
                }
            }
        }
    }

    /// A connection went away (closed, or dropped for a violation).
    pub(super) fn peer_gone(&mut self, peer: u32, reason: &str) {
        self.shadows.retain(|w| w.peer != peer);
        if self.lease.as_ref().is_some_and(|l| l.peer == peer) {
            self.primary_lost(reason);
        }
        self.peers.remove(&peer);
    }

    /// Returns a dead primary's kept KV pages to the pool.
    pub(super) fn drop_adoptable(&mut self, why: &str) {
        if let Some(a) = self.adoptable.take() {
            tracing::info!(why, "the dead primary's KV pages return to the pool");
            if let Some(kv) = self.kv.as_mut() {
                kv.pages.give_back(&a.pages);
            }
        }
    }

    /// Periodic work: lease expiry, zombie reaping, adoption's end.
    pub(super) fn tick(&mut self) {
        if self
            .adoptable
            .as_ref()
            .is_some_and(|a| Instant::now() > a.until)
        {
            self.drop_adoptable("kept for adoption long enough");
        }
        if self
            .lease
            .as_ref()
            .is_some_and(|l| Instant::now() > l.deadline)
        {
            self.primary_lost("lease expired");
        }
        let mut freed = Vec::new();
        self.zombies.retain(|z| {
            if z.pidfd.exited() {
                freed.push(z.pages.clone());
                false
            } else {
                true
            }
        });
        for runs in freed {
            tracing::info!("zombie exited; its KV pages return to the pool");
            if let Some(kv) = self.kv.as_mut() {
                kv.pages.give_back(&runs);
            }
        }
    }

    /// The next deadline the server must wake up for.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let lease = self.lease.as_ref().map(|l| l.deadline);
        let adopt = self.adoptable.as_ref().map(|a| a.until);
        lease.into_iter().chain(adopt).min()
    }
}
