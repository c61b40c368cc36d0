//! Region handlers: the manifest, the KV arena's creation, and the weights' cold path
//! (allocate, publish with checksum verification and seals).

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use super::handlers::err;
use super::{Broker, Kv, Weights};
use crate::backend::BackendError;
use crate::wire::{ErrorCode, Msg, RegionInfo, RegionKind};

/// Smallest KV page the arena accepts (a page is also a multiple of the OS page size).
pub(super) const MIN_KV_PAGE: u64 = 4096;

impl Broker {
    /// The regions `peer` may map: published, healthy weights for everyone (sealed against
    /// writes on the host backend); the KV arena only for the lease holder, so an observer or a
    /// waiting shadow never holds a writable handle to another worker's KV (prompts, outputs).
    fn region_infos(&self, peer: u32) -> (Vec<RegionInfo>, Vec<BorrowedFd<'_>>) {
        let mut infos = Vec::new();
        let mut fds = Vec::new();
        let holder = self.lease.as_ref().is_some_and(|l| l.peer == peer);
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
            fds.push(match &w.read_only {
                Some(ro) if !holder => ro.as_fd(),
                _ => w.region.handle(),
            });
        }
        if let Some(k) = &self.kv
            && holder
        {
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

    pub(super) fn on_manifest(&mut self, peer: u32) {
        let (regions, fds) = self.region_infos(peer);
        self.reply(peer, &Msg::Manifest { regions }, &fds);
    }

    /// Takes `pages` KV pages of `page_bytes` bytes for a grant. The first grant fixes the
    /// arena's page size, but only once it succeeds: a refused one leaves no arena behind.
    pub(super) fn take_kv_pages(
        &mut self,
        page_bytes: u64,
        pages: u32,
    ) -> Result<Vec<(u32, u32)>, Msg> {
        let no_room = || {
            err(
                ErrorCode::NoCapacity,
                format!("{pages} KV pages are not free"),
            )
        };
        if let Some(k) = self.kv.as_mut() {
            if k.page_bytes != page_bytes {
                return Err(err(
                    ErrorCode::BadRequest,
                    format!("KV arena has {}-byte pages, not {page_bytes}", k.page_bytes),
                ));
            }
            return k.pages.take(pages).ok_or_else(no_room);
        }
        let os_page = crate::mapping::page_size();
        if page_bytes < MIN_KV_PAGE || !page_bytes.is_multiple_of(os_page) {
            return Err(err(
                ErrorCode::BadRequest,
                format!(
                    "KV page size {page_bytes} must be at least {MIN_KV_PAGE} bytes and a \
                     multiple of the {os_page}-byte OS page"
                ),
            ));
        }
        if page_bytes > self.cfg.kv_bytes {
            return Err(err(
                ErrorCode::BadRequest,
                format!(
                    "KV page size {page_bytes} exceeds the {}-byte arena",
                    self.cfg.kv_bytes
                ),
            ));
        }
        let Ok(n) = u32::try_from(self.cfg.kv_bytes / page_bytes) else {
            return Err(err(
                ErrorCode::BadRequest,
                format!(
                    "a {}-byte KV arena of {page_bytes}-byte pages has more than {} pages",
                    self.cfg.kv_bytes,
                    u32::MAX
                ),
            ));
        };
        if pages > n {
            return Err(no_room());
        }
        let bytes = u64::from(n) * page_bytes;
        let mut region = self
            .backend
            .create("kv", bytes)
            .map_err(|e| err(ErrorCode::Backend, e.to_string()))?;
        region
            .seal(false)
            .map_err(|e| err(ErrorCode::Backend, e.to_string()))?;
        let mut kv = Kv {
            region,
            page_bytes,
            pages: super::pages::Pages::new(n),
        };
        let runs = kv.pages.take(pages).ok_or_else(no_room)?;
        tracing::info!(pages = n, page_bytes, "KV arena created");
        self.kv = Some(kv);
        Ok(runs)
    }

    pub(super) fn on_alloc_weights(&mut self, peer: u32, epoch: u64, version: u64, bytes: u64) {
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
                    read_only: None,
                    version,
                    checksum: 0,
                    published: false,
                    meta: Vec::new(),
                });
                self.weights_ok = true;
                let (regions, fds) = self.region_infos_unpublished();
                self.reply(peer, &Msg::Manifest { regions }, &fds);
            }
            Err(e @ BackendError::TooLarge { .. }) => {
                self.reply(peer, &err(ErrorCode::NoCapacity, e.to_string()), &[])
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

    pub(super) fn on_publish(
        &mut self,
        peer: u32,
        epoch: u64,
        version: u64,
        checksum: u64,
        meta: Vec<u8>,
    ) {
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
                            w.read_only = w.region.read_only_handle().unwrap_or_else(|e| {
                                tracing::warn!(error = %e, "no read-only handle: peers get the region's own");
                                None
                            });
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
        // The checksum ran in this loop and may have outlasted the lease: the holder was waiting
        // on us, not silent, so its lease runs from now.
        let lease = self.cfg.lease;
        if let Some(l) = self.lease.as_mut()
            && l.peer == peer
        {
            l.deadline = Instant::now() + lease;
        }
        self.reply(peer, &r, &[]);
    }
}
