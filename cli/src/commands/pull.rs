//! `belayer pull REF --into CONTAINER` and `belayer pull REF --output DIR`: a checkpoint pushed
//! by `belayer push`, fetched from an OCI registry with the credentials docker's clients use.
//!
//! `--into` continues it in CONTAINER, a container created with Belayer's runtime and no task
//! (`ctr container create --runtime io.containerd.belayer.v1 IMAGE CONTAINER …`, from the image
//! the checkpointed container ran): the artifact is rebuilt into a private directory in this
//! node's store (every blob bounded and checked against its digest, every member confined),
//! then a task is created from that directory the way CRI restores from a path, so the shim
//! imports it with every check of an import and restores it; the directory goes afterwards,
//! whatever happened. `--output` only rebuilds the export into DIR (which must not exist).
//! The artifact's journal position (actions completed at the checkpoint's instant) is written
//! into CONTAINER's journal positions first, so that the restore reports it (`belayer status`:
//! "checkpoint N, taken after action k"); the actions themselves stay in the pushing node's
//! journal, so there is nothing to replay. A pull that fails leaves nothing behind: no
//! directory, no task, no checkpoint, no position.

use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use belayer_api::PULL_STAGING_PREFIX;
use belayer_registry::checkpoint::{PullLimits, PulledCheckpoint, pull_to_archive};
use belayer_registry::{Client, ClientOptions, PlainHttp, Reference};
use criu_bridge::store::RemoveOnDrop;

use super::Context;
use crate::error::{Error, Result};

/// Where the pulled checkpoint goes.
pub enum Target<'a> {
    /// A task of this container, restored from it.
    Into(&'a str),
    /// An export directory.
    Output(&'a Path),
}

pub fn run(
    cx: &Context,
    reference: &str,
    target: Target<'_>,
    plain_http: bool,
    json: bool,
) -> Result<()> {
    let registry_error = |source| Error::Registry {
        what: format!("pull {reference}"),
        source,
    };
    let parsed = Reference::parse(reference).map_err(registry_error)?;
    if let Target::Into(container) = target {
        // Before anything is fetched.
        cx.containerd.check_restorable(container)?;
    }
    let (rt, client) = registry_client(&parsed, plain_http, registry_error)?;
    let pull = |dest: &Path| -> Result<PulledCheckpoint> {
        rt.block_on(pull_to_archive(
            &client,
            &parsed,
            dest,
            &PullLimits::default(),
        ))
        .map_err(registry_error)
    };
    match target {
        Target::Output(dir) => {
            let pulled = pull(dir)?;
            print(json, &pulled, None, None);
        }
        Target::Into(container) => {
            cx.store.secure()?;
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let staging = cx.store.root().join(format!(
                "{PULL_STAGING_PREFIX}{}-{stamp}",
                std::process::id()
            ));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&staging)
                .map_err(|source| Error::PullStaging {
                    path: staging.clone(),
                    source,
                })?;
            let _remove = RemoveOnDrop(staging.clone());
            let pulled = pull(&staging.join("export"))?;
            // Read by the shim when it creates the task: the restore then reports which actions
            // the environment reflects, as after a restore on the pushing node.
            let mut seeded = pulled
                .config
                .journal_position
                .map(|k| SeededPosition::write(&cx.journals, container, pulled.config.newest, k))
                .transpose()?;
            cx.containerd
                .create_from_checkpoint_dir(container, &pulled.dir)?;
            if let Some(s) = seeded.as_mut() {
                s.keep = true;
            }
            let newest = cx.store.list(&cx.namespace, container)?.last().copied();
            print(json, &pulled, Some(container), newest);
        }
    }
    Ok(())
}

/// A pulled checkpoint's journal position written into the pulling container's positions file
/// (`belayer_api::journal::positions_path`); the file is put back as it was when dropped unless
/// `keep` (the task was created).
struct SeededPosition {
    path: PathBuf,
    before: Option<Vec<u8>>,
    keep: bool,
}

impl SeededPosition {
    fn write(journals: &Path, container: &str, seq: u64, position: u64) -> Result<Self> {
        let path = belayer_api::journal::positions_path(journals, container);
        let fail = |source| Error::PullStaging {
            path: path.clone(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(journals)
            .map_err(fail)?;
        let before = match std::fs::read(&path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(fail(e)),
        };
        // A file from an earlier container of this id is kept but for this checkpoint's entry.
        let mut positions: BTreeMap<u64, u64> = before
            .as_deref()
            .and_then(|b| serde_json::from_slice(b).ok())
            .unwrap_or_default();
        positions.insert(seq, position);
        let bytes = serde_json::to_vec(&positions).unwrap_or_default();
        std::fs::write(&path, bytes).map_err(fail)?;
        Ok(Self {
            path,
            before,
            keep: false,
        })
    }
}

impl Drop for SeededPosition {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        let _ = match &self.before {
            Some(bytes) => std::fs::write(&self.path, bytes),
            None => std::fs::remove_file(&self.path),
        };
    }
}

/// The pinned reference and what it holds (as JSON with `--json`).
fn print(json: bool, pulled: &PulledCheckpoint, container: Option<&str>, checkpoint: Option<u64>) {
    let reference = pulled.reference.to_string();
    if json {
        let out = serde_json::json!({
            "reference": reference,
            "source": format!("{}/{}", pulled.config.namespace, pulled.config.container),
            "source_checkpoint": pulled.config.newest.to_string(),
            "chain": pulled.config.members.iter().map(u64::to_string).collect::<Vec<_>>(),
            "journal_position": pulled.config.journal_position,
            "container": container,
            "checkpoint": checkpoint.map(|c| c.to_string()),
            "dir": container.is_none().then(|| pulled.dir.display().to_string()),
        });
        println!("{out}");
        return;
    }
    println!("{reference}");
    match (container, checkpoint) {
        (Some(c), Some(cp)) => println!(
            "{c} restored from checkpoint {} of {}/{} (here checkpoint {cp})",
            pulled.config.newest, pulled.config.namespace, pulled.config.container
        ),
        _ => println!(
            "checkpoint {} of {}/{} in {}",
            pulled.config.newest,
            pulled.config.namespace,
            pulled.config.container,
            pulled.dir.display()
        ),
    }
}

/// A runtime to run a registry client on, and a client of `reference`'s registry (plain HTTP to
/// loopback only, unless `plain_http`; credentials from the docker config), its error mapped by
/// `registry_error`.
pub(super) fn registry_client(
    reference: &Reference,
    plain_http: bool,
    registry_error: impl Fn(belayer_registry::Error) -> Error,
) -> Result<(tokio::runtime::Runtime, Client)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::ControlIo)?;
    let client = Client::new(
        &reference.registry,
        ClientOptions {
            plain_http: if plain_http {
                PlainHttp::Any
            } else {
                PlainHttp::Loopback
            },
            ..Default::default()
        },
    )
    .map_err(registry_error)?;
    Ok((rt, client))
}
