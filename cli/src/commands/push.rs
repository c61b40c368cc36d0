//! `belayer push CONTAINER [CHECKPOINT] REF [--plain-http] [--json]`: the container's shim
//! exports the checkpoint (default: the newest) and pushes it to an OCI registry as an artifact,
//! uploading only the blobs the registry lacks. Credentials are read here, as docker's and
//! containerd's clients read them (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`),
//! and handed to the shim with the request (a root-only socket). Prints the reference pinned to
//! the manifest's digest, then what went up and what the registry had already.
//!
//! `belayer push --kube CONTAINER [CHECKPOINT] REF`: the same checkpoint, pushed as the OCI
//! checkpoint image a pod on another node restores from through CRI (what `checkpointctl build`
//! makes of Kubernetes' own checkpoint archive) instead of as Belayer's artifact. The container
//! must be a Kubernetes one (CRI serves it): the dumps CRI writes beside a checkpoint
//! (`config.dump`, `spec.dump`, `status.dump`) are made here from containerd's container record
//! and CRI's status of it, checked, and handed to the shim, which builds the image around its
//! export.
//!
//! `belayer push --cri-archive ARCHIVE REF [--plain-http] [--json]`: a checkpoint archive that
//! Kubernetes wrote (the kubelet's checkpoint API, CRI `CheckpointContainer`) is pushed from
//! this process, with no shim, as the OCI checkpoint image a pod on another node restores from
//! (`belayer_registry::kube`: what `checkpointctl build` makes of it). The archive is untrusted
//! input; its image's layer is written to a private dir under `$TMPDIR` (about the archive's
//! size) and removed afterwards. Prints the pinned reference and the bytes, as above.

use std::path::Path;

use belayer_api::{KubeDumps, PushInfo, PushRequest, RegistryCredentials, parse_checkpoint_id};
use belayer_registry::Reference;
use belayer_registry::kube::{CriArchiveLimits, push_cri_archive};

use super::Context;
use crate::error::{Error, Result};

pub fn run(
    cx: &Context,
    container: &str,
    checkpoint: Option<&str>,
    reference: &str,
    plain_http: bool,
    kube: bool,
    json: bool,
) -> Result<()> {
    let seq = checkpoint.map(parse_checkpoint_id).transpose()?;
    let registry_error = |source| Error::Registry {
        what: format!("push {container} to {reference}"),
        source,
    };
    let parsed = Reference::parse(reference).map_err(registry_error)?;
    let credentials = belayer_registry::auth::credentials_for(&parsed.registry)
        .map_err(registry_error)?
        .map(|c| RegistryCredentials {
            username: c.username,
            password: c.password,
        });
    let ctl = cx.require_control(container)?;
    let (seq, kube) = if kube {
        let (seq, dumps) = kube_dumps(cx, container, seq)?;
        (Some(seq), Some(dumps))
    } else {
        (seq, None)
    };
    let info: PushInfo = ctl.call(
        "POST",
        "push",
        Some(&PushRequest {
            checkpoint: seq,
            reference: reference.to_string(),
            credentials,
            plain_http,
            kube,
        }),
    )?;
    if json {
        println!("{}", serde_json::to_value(&info).unwrap_or_default());
    } else {
        println!("{}", info.reference);
        println!(
            "checkpoint {}: uploaded {} blobs ({} bytes), skipped {} the registry had ({} bytes)",
            info.checkpoint, info.uploaded, info.uploaded_bytes, info.skipped, info.skipped_bytes
        );
    }
    Ok(())
}

/// Checkpoint `seq` of `container` (the newest when `None`) and the dumps its Kubernetes
/// checkpoint image holds: containerd's records of the container, at the checkpoint's instant.
/// Records that make no image (no base image by digest, no container name) are refused here,
/// before the shim exports anything.
fn kube_dumps(cx: &Context, container: &str, seq: Option<u64>) -> Result<(u64, KubeDumps)> {
    let seq = cx.checkpoint_or_newest(container, seq)?;
    let cp = cx
        .store
        .load(&cx.namespace, container, seq)
        .map_err(|e| cx.not_found_or(container, e))?;
    let dumps = cx
        .containerd
        .kube_records(container)?
        .dumps(cp.manifest.created_unix_ms);
    dumps
        .annotations(&CriArchiveLimits::default())
        .map_err(|source| Error::KubeRecords {
            id: container.to_string(),
            source,
        })?;
    Ok((
        seq,
        KubeDumps {
            config: dumps.config,
            spec: dumps.spec,
            status: dumps.status,
        },
    ))
}

pub fn run_cri_archive(
    archive: &Path,
    reference: &str,
    plain_http: bool,
    json: bool,
) -> Result<()> {
    let registry_error = |source| Error::Registry {
        what: format!("push {} to {reference}", archive.display()),
        source,
    };
    let parsed = Reference::parse(reference).map_err(registry_error)?;
    let (rt, client) = super::pull::registry_client(&parsed, plain_http, registry_error)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let work =
        std::env::temp_dir().join(format!("belayer-cri-push.{}.{nanos}", std::process::id()));
    let report = rt
        .block_on(push_cri_archive(
            &client,
            &parsed,
            archive,
            &work,
            &CriArchiveLimits::default(),
        ))
        .map_err(registry_error)?;
    if json {
        let info = serde_json::json!({
            "reference": report.reference.to_string(),
            "digest": report.digest.as_str(),
            "uploaded": report.uploaded.len(),
            "uploaded_bytes": report.uploaded_bytes,
            "skipped": report.skipped.len(),
            "skipped_bytes": report.skipped_bytes,
        });
        println!("{info}");
    } else {
        println!("{}", report.reference);
        println!(
            "{}: uploaded {} blobs ({} bytes), skipped {} the registry had ({} bytes)",
            archive.display(),
            report.uploaded.len(),
            report.uploaded_bytes,
            report.skipped.len(),
            report.skipped_bytes
        );
    }
    Ok(())
}
