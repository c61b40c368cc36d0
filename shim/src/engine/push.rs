//! `belayer push`: a checkpoint leaves the node as an OCI artifact (belayer-registry's README has
//! the format). The checkpoint is exported into a private directory in the store root under the
//! store's lease on its chain, so retention and `belayer rm` cannot take a member while it is
//! read; its CRIU images are hardlinked (a checkpoint's files never change), the chain archived.
//! The artifact's config also carries the checkpoint's journal position. The push then reads
//! only that directory: the container runs on, checkpoints and restores as
//! usual, and a failed push leaves it and its checkpoints as they were.
//!
//! `belayer push --kube` pushes the same export as a Kubernetes checkpoint image instead
//! (`belayer_registry::kube::export_image`: the export as CRI's archive holds it, with the dumps
//! the CLI made from containerd's records), which a pod restores from through CRI. It carries
//! no journal position: nothing on that path reads one. Automatic replication pushes one export
//! in both forms ([`Engine::stage`], then [`Engine::push_staged`] once per [`Form`]).

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use belayer_api::{PUSH_STAGING_PREFIX, PushInfo, PushRequest};
use belayer_registry::auth::Credentials;
use belayer_registry::kube::{CriArchiveLimits, CriDumps};
use belayer_registry::oci::Manifest;
use belayer_registry::{Client, ClientOptions, PlainHttp, PushReport, Reference};

use super::Engine;
use crate::error::{Error, Result, registry};
use crate::export::{Placing, remove_dead_staging};

impl Engine {
    /// Pushes checkpoint `req.checkpoint` (the newest when absent) of container `id` to
    /// `req.reference`: only the blobs the registry lacks go up.
    pub async fn push(self: &Arc<Self>, id: &str, req: PushRequest) -> Result<PushInfo> {
        let reference = Reference::parse(&req.reference)
            .map_err(registry(format!("push {id} to {}", req.reference)))?;
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
        let form = match req.kube {
            Some(d) => Form::Kube {
                dumps: CriDumps {
                    config: d.config,
                    spec: d.spec,
                    status: d.status,
                },
                also_tags: &[],
            },
            None => Form::Artifact { also_tags: &[] },
        };
        self.push_checkpoint(id, seq, &reference, options, form)
            .await
    }

    /// Pushes checkpoint `seq` of container `id` as `reference` with a client of `options`, in
    /// `form`: exported once into a private dir, pushed from there.
    async fn push_checkpoint(
        self: &Arc<Self>,
        id: &str,
        seq: u64,
        reference: &Reference,
        options: ClientOptions,
        form: Form<'_>,
    ) -> Result<PushInfo> {
        let client = Client::new(&reference.registry, options)
            .map_err(registry(format!("push {id} to {reference}")))?;
        let staged = self.stage(id, seq).await?;
        self.push_staged(id, seq, &staged, &client, reference, form)
            .await
    }

    /// Exports checkpoint `seq` of container `id` into a private dir of the store root (removed
    /// when the result is dropped), under the store's lease on its chain: what a push reads.
    pub(super) async fn stage(self: &Arc<Self>, id: &str, seq: u64) -> Result<Staged> {
        let started = Instant::now();
        let store = self.store();
        remove_dead_staging(store.root());
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = store.root().join(format!(
            "{PUSH_STAGING_PREFIX}{}-{stamp}",
            std::process::id()
        ));
        let remove = criu_bridge::store::RemoveOnDrop(dir.clone());
        store.secure()?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(crate::error::io(format!("create {}", dir.display())))?;
        let export = dir.join("export");
        self.export_to(id, seq, export.clone(), Placing::Link)
            .await?;
        Ok(Staged {
            dir,
            export,
            export_ms: started.elapsed().as_millis() as u64,
            _remove: remove,
        })
    }

    /// Pushes the staged export of checkpoint `seq` of container `id` as `reference` with
    /// `client`, in `form`.
    pub(super) async fn push_staged(
        self: &Arc<Self>,
        id: &str,
        seq: u64,
        staged: &Staged,
        client: &Client,
        reference: &Reference,
        form: Form<'_>,
    ) -> Result<PushInfo> {
        let what = format!("push {id} to {reference}");
        let pushing = Instant::now();
        let (report, journal_position) = match form {
            Form::Kube { dumps, also_tags } => {
                let work = staged.dir.join("image");
                let export = staged.export.clone();
                let report =
                    push_kube_image(client, reference, export, dumps, work, also_tags, &what)
                        .await?;
                (report, None)
            }
            Form::Artifact { also_tags } => {
                // The journal position goes in the artifact's config: the pulling node reports it.
                let journal_position =
                    crate::journal::Journal::open(self.settings.journals(&self.namespace), id)
                        .positions
                        .get(&seq)
                        .copied();
                let report = push_artifact(
                    client,
                    reference,
                    &staged.export,
                    journal_position,
                    also_tags,
                    &what,
                )
                .await?;
                (report, journal_position)
            }
        };
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
            export_ms: staged.export_ms,
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

/// A checkpoint's export in a private dir of the store root, for pushes to read; the dir goes
/// when this is dropped.
pub(super) struct Staged {
    /// The private dir.
    dir: PathBuf,
    /// The export in it.
    export: PathBuf,
    /// How long the export took.
    export_ms: u64,
    _remove: criu_bridge::store::RemoveOnDrop,
}

/// What a checkpoint goes up as.
pub(super) enum Form<'a> {
    /// Belayer's artifact (carrying the checkpoint's journal position), its manifest also
    /// tagged `also_tags`.
    Artifact { also_tags: &'a [String] },
    /// A Kubernetes checkpoint image with these dumps, its manifest also tagged `also_tags`.
    Kube {
        dumps: CriDumps,
        also_tags: &'a [String],
    },
}

/// Pushes the export in `exported` as Belayer's artifact carrying `journal_position` (split into
/// blobs beside it, off the runtime's threads), and tags its manifest `also_tags` too; `what`
/// names the push in an error.
async fn push_artifact(
    client: &Client,
    reference: &Reference,
    exported: &Path,
    journal_position: Option<u64>,
    also_tags: &[String],
    what: &str,
) -> Result<PushReport> {
    let registry_error = registry(what);
    let blobs = exported.with_file_name("blobs");
    let parts = {
        let exported = exported.to_path_buf();
        tokio::task::spawn_blocking(move || {
            belayer_registry::checkpoint::archive_parts(&exported, &blobs)
        })
        .await
        .map_err(crate::error::task("split the export into blobs"))?
    };
    let mut parts = parts.map_err(&registry_error)?;
    parts.set_journal_position(journal_position);
    let report = belayer_registry::checkpoint::push_archive_parts(client, reference, &parts).await;
    // Another push may follow from the same export (replication's image of a pod's container).
    let _ = std::fs::remove_dir_all(exported.with_file_name("blobs"));
    let report = report.map_err(&registry_error)?;
    tag_too(client, reference, also_tags, &parts.manifest(), what).await?;
    Ok(report)
}

/// Pushes the export in `exported` as a Kubernetes checkpoint image with `dumps`, its layer
/// written into `work` (created here, removed afterwards) off the runtime's threads, and tags
/// its manifest `also_tags` too; `what` names the push in an error.
async fn push_kube_image(
    client: &Client,
    reference: &Reference,
    exported: PathBuf,
    dumps: CriDumps,
    work: PathBuf,
    also_tags: &[String],
    what: &str,
) -> Result<PushReport> {
    let registry_error = registry(what);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&work)
        .map_err(crate::error::io(format!("create {}", work.display())))?;
    let _remove = criu_bridge::store::RemoveOnDrop(work.clone());
    let image = tokio::task::spawn_blocking(move || {
        belayer_registry::kube::export_image(&exported, &dumps, &work, &CriArchiveLimits::default())
    })
    .await
    .map_err(crate::error::task("make the checkpoint image"))?
    .map_err(&registry_error)?;
    let report = image
        .push(client, reference)
        .await
        .map_err(&registry_error)?;
    tag_too(client, reference, also_tags, &image.manifest(), what).await?;
    Ok(report)
}

/// Tags `manifest`, pushed as `reference`, `tags` too in the same repository; `what` names the
/// push in an error.
async fn tag_too(
    client: &Client,
    reference: &Reference,
    tags: &[String],
    manifest: &Manifest,
    what: &str,
) -> Result<()> {
    for tag in tags {
        client
            .push_manifest(
                &reference.repository,
                tag,
                belayer_registry::oci::OCI_MANIFEST,
                manifest.to_bytes(),
            )
            .await
            .map_err(registry(what))?;
    }
    Ok(())
}
