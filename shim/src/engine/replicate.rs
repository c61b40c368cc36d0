//! Automatic replication (`io.belayer.replicate=REPO`, or the node's `[replication]
//! repository`): every automatic checkpoint is pushed to the registry in the background, off the
//! container's path — as `REPO:<container>-<checkpoint>`, and `REPO:<container>` moved to it —
//! one push at a time per container, at most `max_in_flight` on the node, each at most
//! `max_bytes_per_s`. A push still running when newer checkpoints come is followed by one of
//! the newest only: a node loss loses what is newer than the newest pushed, which
//! `belayer status` reports (`replication.behind`). A failed push is tried again after a pause
//! that doubles up to a minute, unless a newer checkpoint has come meanwhile.

use std::sync::Arc;
use std::time::Duration;

use belayer_registry::auth::credentials_in;
use belayer_registry::{ClientOptions, PlainHttp, Reference};
use log::{info, warn};

use super::Engine;
use crate::error::{Error, Result};

/// The first pause after a failed push; it doubles up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(60);

impl Engine {
    /// Asks for checkpoint `seq` of container `id` to be replicated, if its policy names a
    /// repository; returns at once.
    pub(super) fn replicate_soon(self: &Arc<Self>, id: &str, seq: u64) {
        let (engine, id) = (Arc::clone(self), id.to_string());
        tokio::spawn(async move { engine.replicate(&id, seq).await });
    }

    async fn replicate(self: Arc<Self>, id: &str, seq: u64) {
        let Ok(shared) = self.get(id) else { return };
        {
            let mut c = shared.lock().await;
            let Some(repository) = c.policy.replicate.clone() else {
                return;
            };
            let r = &mut c.replication;
            r.report.repository = repository;
            r.wanted = r.wanted.max(Some(seq));
            if r.running {
                return;
            }
            r.running = true;
        }
        let mut pause = RETRY_FIRST;
        loop {
            let Ok(shared) = self.get(id) else { return };
            let (seq, repository) = {
                let mut c = shared.lock().await;
                let repository = c.policy.replicate.clone().unwrap_or_default();
                let r = &mut c.replication;
                match r.wanted.take() {
                    Some(seq) if r.newest.is_none_or(|n| seq > n) => {
                        r.report.pushing = Some(seq.to_string());
                        (seq, repository)
                    }
                    _ => {
                        r.running = false;
                        return;
                    }
                }
            };
            let pushed = {
                let _slot = self.replicate_slots.acquire().await;
                self.push_replica(id, seq, &repository).await
            };
            let Ok(shared) = self.get(id) else { return };
            let mut c = shared.lock().await;
            let r = &mut c.replication;
            r.report.pushing = None;
            match pushed {
                Ok(reference) => {
                    info!("container {id}: checkpoint {seq} replicated as {reference}");
                    r.newest = Some(seq);
                    r.report.newest = Some(seq.to_string());
                    r.report.newest_reference = Some(reference);
                    r.report.replicated.push(seq.to_string());
                    r.report.pushes += 1;
                    r.report.last_error = None;
                    pause = RETRY_FIRST;
                }
                Err(e) => {
                    let gone = matches!(
                        &e,
                        Error::Store(criu_bridge::store::StoreError::NotFound { .. })
                    );
                    warn!(
                        "container {id}: replication of checkpoint {seq} to {repository} failed: {}",
                        e.message()
                    );
                    r.report.failures += 1;
                    r.report.last_error = Some(e.message());
                    // Tried again, unless a newer one is due anyway or it is gone (retention).
                    if r.wanted.is_none() && !gone {
                        r.wanted = Some(seq);
                        drop(c);
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(RETRY_MAX);
                    }
                }
            }
        }
    }

    /// Pushes checkpoint `seq` of `id` to `repository` as `<id>-<seq>`, tagged `<id>` too;
    /// returns the reference pinned by digest.
    async fn push_replica(
        self: &Arc<Self>,
        id: &str,
        seq: u64,
        repository: &str,
    ) -> Result<String> {
        let settings = &self.settings.replication;
        let text = format!("{repository}:{id}-{seq}");
        let reference = Reference::parse(&text).map_err(|source| Error::Registry {
            what: format!("replicate {id} to {repository}"),
            source,
        })?;
        // The node's docker config when named, else the client's default (DOCKER_CONFIG, ~).
        // Off the runtime's threads: the config may name a credential helper, a process.
        let credentials = if settings.docker_config.as_os_str().is_empty() {
            None
        } else {
            let (config, registry) = (settings.docker_config.clone(), reference.registry.clone());
            tokio::task::spawn_blocking(move || credentials_in(&config, &registry))
                .await
                .map_err(crate::error::task("read the registry credentials"))?
                .map_err(|source| Error::Registry {
                    what: format!(
                        "replicate {id}: credentials in {}",
                        settings.docker_config.display()
                    ),
                    source,
                })?
        };
        let options = ClientOptions {
            plain_http: if settings.plain_http {
                PlainHttp::Any
            } else {
                PlainHttp::Loopback
            },
            credentials,
            max_bytes_per_s: settings.max_bytes_per_s,
            ..Default::default()
        };
        let info = self
            .push_checkpoint(id, seq, &reference, options, Some(id), None)
            .await?;
        Ok(info.reference)
    }
}
