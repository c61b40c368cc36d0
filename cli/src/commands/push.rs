//! `belayer push CONTAINER [CHECKPOINT] REF [--plain-http] [--json]`: the container's shim
//! exports the checkpoint (default: the newest) and pushes it to an OCI registry as an artifact,
//! uploading only the blobs the registry lacks. Credentials are read here, as docker's and
//! containerd's clients read them (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`),
//! and handed to the shim with the request (a root-only socket). Prints the reference pinned to
//! the manifest's digest, then what went up and what the registry had already.

use belayer_api::{PushInfo, PushRequest, RegistryCredentials, parse_checkpoint_id};
use belayer_registry::Reference;

use super::Context;
use crate::error::{Error, Result};

pub fn run(
    cx: &Context,
    container: &str,
    checkpoint: Option<&str>,
    reference: &str,
    plain_http: bool,
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
    let info: PushInfo = ctl.call(
        "POST",
        "push",
        Some(&PushRequest {
            checkpoint: seq,
            reference: reference.to_string(),
            credentials,
            plain_http,
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
