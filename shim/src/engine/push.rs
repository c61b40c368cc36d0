//! `belayer push`: a checkpoint leaves the node as an OCI artifact (belayer-registry's README has
//! the format). The checkpoint is exported into a private directory in the store root under the
//! store's lease on its chain, so retention and `belayer rm` cannot take a member while it is
//! read; its CRIU images are hardlinked (a checkpoint's files never change), the chain archived.
//! The artifact's config also carries the checkpoint's journal position. The push then reads
//! only that directory: the container runs on, checkpoints and restores as
//! usual, and a failed push leaves it and its checkpoints as they were.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use belayer_api::{PUSH_STAGING_PREFIX, PushInfo, PushRequest};
use belayer_registry::auth::Credentials;
use belayer_registry::{Client, ClientOptions, PlainHttp, Reference};

use super::Engine;
use crate::error::{Error, Result};
use crate::export::{Placing, remove_dead_staging};

impl Engine {
    /// Pushes checkpoint `req.checkpoint` (the newest when absent) of container `id` to
    /// `req.reference`: only the blobs the registry lacks go up.
    pub async fn push(self: &Arc<Self>, id: &str, req: PushRequest) -> Result<PushInfo> {
        let reference = Reference::parse(&req.reference).map_err(|source| Error::Registry {
            what: format!("push {id} to {}", req.reference),
            source,
        })?;
        self.get(id)?;
        let seq = match req.checkpoint {
            Some(seq) => seq,
            None => *self
                .store()
                .list(&self.namespace, id)?
                .last()
                .ok_or_else(|| Error::NoCheckpoints(id.to_string()))?,
        };
        let options = ClientOptions {
            plain_http: if req.plain_http {
                PlainHttp::Any
            } else {
                PlainHttp::Loopback
            },
            credentials: req.credentials.clone().map(|c| Credentials {
                username: c.username,
                password: c.password,
            }),
            ..Default::default()
        };
        self.push_checkpoint(id, seq, &reference, options, None)
            .await
    }

    /// Pushes checkpoint `seq` of container `id` as `reference` with a client of `options`, and
    /// tags the same manifest `also_tag` too.
    pub(super) async fn push_checkpoint(
        self: &Arc<Self>,
        id: &str,
        seq: u64,
        reference: &Reference,
        options: ClientOptions,
        also_tag: Option<&str>,
    ) -> Result<PushInfo> {
        let registry_error = |source| Error::Registry {
            what: format!("push {id} to {reference}"),
            source,
        };
        let store = self.store();
        let client = Client::new(&reference.registry, options).map_err(registry_error)?;

        let started = Instant::now();
        remove_dead_staging(store.root());
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let staging = store.root().join(format!(
            "{PUSH_STAGING_PREFIX}{}-{stamp}",
            std::process::id()
        ));
        let _remove = criu_bridge::store::RemoveOnDrop(staging.clone());
        let exported: PathBuf = staging.join("export");
        store.secure()?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging)
            .map_err(crate::error::io(format!("create {}", staging.display())))?;
        self.export_to(id, seq, exported.clone(), Placing::Link)
            .await?;
        let export_ms = started.elapsed().as_millis() as u64;
        let pushing = Instant::now();
        // The journal position goes in the artifact's config: the pulling node reports it.
        let journal_position =
            crate::journal::Journal::open(self.settings.journals(&self.namespace), id)
                .positions
                .get(&seq)
                .copied();
        let blobs = exported.with_file_name("blobs");
        let parts = {
            let (exported, blobs) = (exported.clone(), blobs.clone());
            tokio::task::spawn_blocking(move || {
                belayer_registry::checkpoint::archive_parts(&exported, &blobs)
            })
            .await
            .map_err(crate::error::task("split the export into blobs"))?
        };
        let mut parts = parts.map_err(registry_error)?;
        parts.set_journal_position(journal_position);
        let report = belayer_registry::checkpoint::push_archive_parts(&client, reference, &parts)
            .await
            .map_err(registry_error)?;
        if let Some(tag) = also_tag {
            client
                .push_manifest(
                    &reference.repository,
                    tag,
                    belayer_registry::oci::OCI_MANIFEST,
                    parts.manifest().to_bytes(),
                )
                .await
                .map_err(registry_error)?;
        }
        let info = PushInfo {
            container: id.to_string(),
            checkpoint: seq.to_string(),
            reference: report.reference.to_string(),
            digest: report.digest.to_string(),
            uploaded: report.uploaded.len(),
            uploaded_bytes: report.uploaded_bytes,
            skipped: report.skipped.len(),
            skipped_bytes: report.skipped_bytes,
            journal_position,
            export_ms,
            push_ms: pushing.elapsed().as_millis() as u64,
        };
        log::info!(
            "container {id}: checkpoint {seq} pushed as {} ({} blobs, {} bytes uploaded; {} blobs, {} bytes there already)",
            info.reference,
            info.uploaded,
            info.uploaded_bytes,
            info.skipped,
            info.skipped_bytes
        );
        Ok(info)
    }
}
