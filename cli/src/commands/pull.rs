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
//! A pull that fails leaves nothing behind: no directory, no task, no checkpoint.

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

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
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::ControlIo)?;
    let client = Client::new(
        &parsed.registry,
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
            cx.containerd
                .create_from_checkpoint_dir(container, &pulled.dir)?;
            let newest = cx.store.list(&cx.namespace, container)?.last().copied();
            print(json, &pulled, Some(container), newest);
        }
    }
    Ok(())
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
