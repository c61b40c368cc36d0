//! Automatic replication (`io.belayer.replicate=REPO`, or the node's `[replication]
//! repository`): every automatic checkpoint is pushed to the registry in the background, off the
//! container's path — as `REPO:<container>-<checkpoint>`, and `REPO:<container>` moved to it —
//! one push at a time per container, at most `max_in_flight` on the node, each at most
//! `max_bytes_per_s`. A push still running when newer checkpoints come is followed by one of
//! the newest only: a node loss loses what is newer than the newest pushed, which
//! `belayer status` reports (`replication.behind`). A failed push is tried again after a pause
//! that doubles up to a minute, unless a newer checkpoint has come meanwhile.
//!
//! A pod's container (one containerd's CRI plugin made: its spec's `io.kubernetes.cri.*`
//! annotations) goes up a second time from the same export, as the Kubernetes checkpoint image
//! `REPO:<container>-<checkpoint>-kube` (`REPO:<container>-kube` and, by the names a user knows,
//! `REPO:<namespace>_<pod>_<container>-kube` moved to it), which a pod on
//! any node with Belayer's handler restores from through CRI. Its dumps are made from the
//! container's own spec (`ContainerRecords::of_cri_spec`): no CRI is asked, so the image exists
//! whatever becomes of the node. It follows a successful artifact push in the same slot and at
//! the same rate; its failure is logged and reported (`kube_failures`, `kube_last_error`) and
//! changes nothing of the container or of the artifact's replication. `[replication]
//! kube_images = false` turns it off on the node.

use std::sync::Arc;
use std::time::Duration;

use belayer_api::RUNTIME_ID;
use belayer_registry::auth::credentials_in;
use belayer_registry::error::CriSpecError;
use belayer_registry::kube::{ContainerRecords, CriDumps};
use belayer_registry::{Client, ClientOptions, PlainHttp, Reference};
use log::{info, warn};

use super::Engine;
use super::push::Form;
use crate::container::Replication;
use crate::error::{Error, Result, registry};

/// What one replication of a checkpoint pushed.
struct Replica {
    /// The artifact's reference, pinned by digest.
    artifact: String,
    /// For a pod's container, the Kubernetes checkpoint image's (pinned), or why it failed.
    kube: Option<Result<String>>,
}

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
                Ok(replica) => {
                    info!(
                        "container {id}: checkpoint {seq} replicated as {}",
                        replica.artifact
                    );
                    match &replica.kube {
                        Some(Ok(reference)) => info!(
                            "container {id}: checkpoint {seq} replicated as the Kubernetes checkpoint image {reference}"
                        ),
                        Some(Err(e)) => warn!(
                            "container {id}: checkpoint {seq} as a Kubernetes checkpoint image to {repository} failed (its artifact is replicated): {}",
                            e.message()
                        ),
                        None => {}
                    }
                    replicated(r, seq, replica);
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

    /// Pushes checkpoint `seq` of `id` to `repository` as `<id>-<seq>`, tagged `<id>` too, and,
    /// for a pod's container, from the same export as the Kubernetes checkpoint image
    /// `<id>-<seq>-kube`, tagged `<id>-kube` and `<namespace>_<pod>_<container>-kube` too.
    /// Fails only if the artifact's push does.
    async fn push_replica(
        self: &Arc<Self>,
        id: &str,
        seq: u64,
        repository: &str,
    ) -> Result<Replica> {
        let settings = &self.settings.replication;
        let parse = |text: String| {
            Reference::parse(&text).map_err(registry(format!("replicate {id} to {repository}")))
        };
        let reference = parse(format!("{repository}:{id}-{seq}"))?;
        // The node's docker config when named, else the client's default (DOCKER_CONFIG, ~).
        // Off the runtime's threads: the config may name a credential helper, a process.
        let credentials = if settings.docker_config.as_os_str().is_empty() {
            None
        } else {
            let (config, host) = (settings.docker_config.clone(), reference.registry.clone());
            tokio::task::spawn_blocking(move || credentials_in(&config, &host))
                .await
                .map_err(crate::error::task("read the registry credentials"))?
                .map_err(registry(format!(
                    "replicate {id}: credentials in {}",
                    settings.docker_config.display()
                )))?
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
        let client = Client::new(&reference.registry, options)
            .map_err(registry(format!("replicate {id} to {repository}")))?;
        let staged = self.stage(id, seq).await?;
        let artifact = Form::Artifact {
            also_tags: &[id.to_string()],
        };
        let info = self
            .push_staged(id, seq, &staged, &client, &reference, artifact)
            .await?;
        let dumps = if settings.kube_images {
            self.kube_dumps(id, seq).await
        } else {
            None
        };
        let kube = match dumps {
            None => None,
            Some(Err(e)) => Some(Err(e)),
            Some(Ok((dumps, also_tags))) => {
                Some(match parse(format!("{repository}:{id}-{seq}-kube")) {
                    Ok(image) => {
                        let form = Form::Kube {
                            dumps,
                            also_tags: &also_tags,
                        };
                        self.push_staged(id, seq, &staged, &client, &image, form)
                            .await
                            .map(|info| info.reference)
                    }
                    Err(e) => Err(e),
                })
            }
        };
        Ok(Replica {
            artifact: info.reference,
            kube,
        })
    }

    /// The dumps of checkpoint `seq` of container `id`'s Kubernetes checkpoint image, made from
    /// the container's own spec (its bundle's `config.json`), its runtime (Belayer's) and when
    /// this shim created it, and the tags its manifest gets besides its own: `<id>-kube`, and
    /// `<namespace>_<pod>_<container>-kube` where those names make a tag. `None` for a
    /// container that is no pod's container (CRI did not make it, or it is a pod's sandbox):
    /// those have no such image.
    async fn kube_dumps(&self, id: &str, seq: u64) -> Option<Result<(CriDumps, Vec<String>)>> {
        let (bundle, created_unix_ns) = {
            let shared = self.get(id).ok()?;
            let c = shared.lock().await;
            (c.bundle.clone(), c.created_unix_ns)
        };
        let path = bundle.join("config.json");
        let spec = match std::fs::read_to_string(&path) {
            Ok(spec) => spec,
            Err(e) => return Some(Err(crate::error::io(format!("read {}", path.display()))(e))),
        };
        let records = match ContainerRecords::of_cri_spec(id, RUNTIME_ID, created_unix_ns, &spec) {
            Ok(records) => records,
            Err(CriSpecError::NotCri { .. } | CriSpecError::NotContainer { .. }) => return None,
            Err(source) => {
                return Some(Err(Error::KubeSpec {
                    id: id.to_string(),
                    path,
                    source,
                }));
            }
        };
        let tags = std::iter::once(format!("{id}-kube"))
            .chain(records.pod_tag("-kube"))
            .collect();
        Some(
            self.store()
                .load(&self.namespace, id, seq)
                .map(|cp| (records.dumps(cp.manifest.created_unix_ms), tags))
                .map_err(Error::from),
        )
    }
}

/// Records in `r` that checkpoint `seq` went up as `replica`: the artifact's replication moves
/// on whatever became of the Kubernetes checkpoint image, which is reported on its own.
fn replicated(r: &mut Replication, seq: u64, replica: Replica) {
    r.newest = Some(seq);
    r.report.newest = Some(seq.to_string());
    r.report.newest_reference = Some(replica.artifact);
    r.report.replicated.push(seq.to_string());
    r.report.pushes += 1;
    r.report.last_error = None;
    match replica.kube {
        Some(Ok(reference)) => {
            r.report.kube_checkpoint = Some(seq.to_string());
            r.report.kube_reference = Some(reference);
            r.report.kube_pushes += 1;
            r.report.kube_last_error = None;
        }
        Some(Err(e)) => {
            r.report.kube_failures += 1;
            r.report.kube_last_error = Some(e.message());
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(artifact: &str, kube: Option<Result<String>>) -> Replica {
        Replica {
            artifact: artifact.into(),
            kube,
        }
    }

    #[test]
    fn a_failed_image_push_leaves_the_artifacts_replication_as_it_goes() {
        let mut r = Replication::default();
        replicated(
            &mut r,
            3,
            replica("R:c-3@sha256:a", Some(Ok("R:c-3-kube@sha256:k".into()))),
        );
        let failed = Error::InvalidArgument("the registry refused the layer".into());
        replicated(&mut r, 5, replica("R:c-5@sha256:b", Some(Err(failed))));
        assert_eq!(r.newest, Some(5), "the artifact of 5 is replicated");
        let report = &r.report;
        assert_eq!(report.newest_reference.as_deref(), Some("R:c-5@sha256:b"));
        assert_eq!(report.replicated, ["3", "5"]);
        assert_eq!((report.pushes, report.failures), (2, 0));
        assert!(report.last_error.is_none());
        // The image stays at 3, its failure reported apart.
        assert_eq!(report.kube_checkpoint.as_deref(), Some("3"));
        assert_eq!(
            report.kube_reference.as_deref(),
            Some("R:c-3-kube@sha256:k")
        );
        assert_eq!((report.kube_pushes, report.kube_failures), (1, 1));
        assert!(
            report
                .kube_last_error
                .as_deref()
                .is_some_and(|e| e.contains("the registry refused the layer")),
            "{report:?}"
        );
        // A container that is no pod's: no image, nothing of it reported.
        let mut r = Replication::default();
        replicated(&mut r, 1, replica("R:c-1@sha256:c", None));
        assert_eq!(r.report.pushes, 1);
        assert_eq!((r.report.kube_pushes, r.report.kube_failures), (0, 0));
        assert!(r.report.kube_checkpoint.is_none());
    }
}
