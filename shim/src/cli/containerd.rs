//! The containerd calls of the CLI: look a container up, and create tasks that restore a
//! checkpoint (a restore of a container without a task, and forks).

use std::path::{Path, PathBuf};

use containerd_client::services::v1::container::Runtime;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteTaskRequest, GetContainerRequest, ListContainersRequest, StartRequest,
    UpdateContainerRequest,
};
use containerd_client::tonic::{Code, Request, transport::Channel};
use containerd_client::with_namespace;

use crate::api::{RESTORE_ANNOTATION, RestoreOptions};

pub struct Containerd {
    address: PathBuf,
    namespace: String,
    rt: tokio::runtime::Runtime,
}

impl Containerd {
    pub fn new(address: &Path, namespace: &str) -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        Self {
            address: address.to_path_buf(),
            namespace: namespace.to_string(),
            rt,
        }
    }

    fn channel(&self) -> Result<Channel, String> {
        self.rt
            .block_on(containerd_client::connect(&self.address))
            .map_err(|e| {
                format!(
                    "cannot connect to containerd at {}: {e}",
                    self.address.display()
                )
            })
    }

    /// The container record, or "not found" naming the namespace.
    pub fn container(&self, id: &str) -> Result<Container, String> {
        let mut c = ContainersClient::new(self.channel()?);
        let req = GetContainerRequest { id: id.to_string() };
        match self
            .rt
            .block_on(c.get(with_namespace!(req, self.namespace.as_str())))
        {
            Ok(r) => r
                .into_inner()
                .container
                .ok_or_else(|| format!("container {id}: empty answer from containerd")),
            Err(s) if s.code() == Code::NotFound => Err(format!(
                "container {id} not found in namespace {}",
                self.namespace
            )),
            Err(s) => Err(format!("containerd: {}", s.message())),
        }
    }

    fn restore_annotation(&self, source: &str, seq: u64) -> String {
        let opts = RestoreOptions {
            namespace: self.namespace.clone(),
            container: source.to_string(),
            checkpoint: seq,
        };
        serde_json::to_string(&opts).unwrap_or_default()
    }

    /// Creates and starts a task of container `id`, whose spec carries the restore annotation.
    fn create_restored_task(&self, id: &str) -> Result<u32, String> {
        let mut tasks = TasksClient::new(self.channel()?);
        let ns = self.namespace.as_str();
        let req = CreateTaskRequest {
            container_id: id.to_string(),
            ..Default::default()
        };
        self.rt
            .block_on(tasks.create(with_namespace!(req, ns)))
            .map_err(|s| format!("create task {id}: {}", s.message()))?;
        let req = StartRequest {
            container_id: id.to_string(),
            ..Default::default()
        };
        match self.rt.block_on(tasks.start(with_namespace!(req, ns))) {
            Ok(r) => Ok(r.into_inner().pid),
            Err(s) => {
                let req = DeleteTaskRequest {
                    container_id: id.to_string(),
                };
                let _ = self.rt.block_on(tasks.delete(with_namespace!(req, ns)));
                Err(format!("restore {id}: {}", s.message()))
            }
        }
    }

    /// Restores a container that has no task: a new task restoring its checkpoint `seq`.
    pub fn restore_task(&self, id: &str, seq: u64) -> Result<(), String> {
        let c = self.container(id)?;
        let runtime = c
            .runtime
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default();
        if runtime != crate::service::RUNTIME_ID {
            return Err(format!(
                "container {id} runs with runtime {runtime:?}, not {}",
                crate::service::RUNTIME_ID
            ));
        }
        let containers = ContainersClient::new(self.channel()?);
        let ns = self.namespace.as_str();
        let update = |c: &Container, annotation: Option<String>| -> Result<(), String> {
            let mut c = c.clone();
            c.spec = Some(with_annotation(&c, annotation)?);
            let req = UpdateContainerRequest {
                container: Some(c),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["spec".into()],
                }),
            };
            let mut containers = containers.clone();
            self.rt
                .block_on(containers.update(with_namespace!(req, ns)))
                .map(drop)
                .map_err(|s| format!("update container {id}: {}", s.message()))
        };
        update(&c, Some(self.restore_annotation(id, seq)))?;
        let restored = self.create_restored_task(id);
        // The annotation is for this restore only: a later start runs the spec as usual.
        let cleared = update(&c, None);
        restored?;
        cleared
    }

    /// `count` new containers running from checkpoint `seq` of `source`; returns their ids.
    pub fn fork(&self, source: &str, seq: u64, count: u32) -> Result<Vec<String>, String> {
        let orig = self.container(source)?;
        let mut containers = ContainersClient::new(self.channel()?);
        let ns = self.namespace.as_str();
        let existing: Vec<String> = self
            .rt
            .block_on(containers.list(with_namespace!(ListContainersRequest::default(), ns)))
            .map_err(|s| format!("containerd: {}", s.message()))?
            .into_inner()
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect();
        let mut ids = Vec::new();
        let mut n = 0;
        while ids.len() < count as usize {
            n += 1;
            let id = format!("{source}-fork{seq}-{n}");
            if !existing.contains(&id) {
                ids.push(id);
            }
        }
        let mut created = Vec::new();
        // Unique per call: a group's shim may still be shutting down after its last container
        // went, and a new container must not join it.
        let group = format!(
            "{}-{}",
            ids.first().map(String::as_str).unwrap_or(source),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        );
        for id in &ids {
            let fork = fork_record(&orig, id, seq, self.restore_annotation(source, seq), &group)?;
            let req = CreateContainerRequest {
                container: Some(fork),
            };
            if let Err(s) = self
                .rt
                .block_on(containers.create(with_namespace!(req, ns)))
            {
                self.remove_forks(&created);
                return Err(format!("create container {id}: {}", s.message()));
            }
            created.push(id.clone());
        }
        // The forks restore side by side: each task's shim verifies, mounts and restores on its own.
        let results: Vec<Result<u32, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    scope.spawn(move || {
                        Containerd::new(&self.address, &self.namespace).create_restored_task(id)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("fork thread panicked".into()))
                })
                .collect()
        });
        if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
            self.remove_forks(&ids);
            return Err(e);
        }
        Ok(ids)
    }
}

impl Containerd {
    /// Removes forks that could not all be started: their tasks, then their records.
    fn remove_forks(&self, ids: &[String]) {
        let (Ok(channel), ns) = (self.channel(), self.namespace.as_str()) else {
            return;
        };
        let mut tasks = TasksClient::new(channel.clone());
        let mut containers = ContainersClient::new(channel);
        for id in ids {
            let kill = containerd_client::services::v1::KillRequest {
                container_id: id.clone(),
                signal: 9,
                all: true,
                ..Default::default()
            };
            let _ = self.rt.block_on(tasks.kill(with_namespace!(kill, ns)));
            let req = DeleteTaskRequest {
                container_id: id.clone(),
            };
            let _ = self.rt.block_on(tasks.delete(with_namespace!(req, ns)));
            let req = DeleteContainerRequest { id: id.clone() };
            let _ = self
                .rt
                .block_on(containers.delete(with_namespace!(req, ns)));
        }
    }
}

/// The container record of a fork: the source's spec with its own rootfs (mounted by the shim
/// from the checkpoint) and its own cgroup.
fn fork_record(
    orig: &Container,
    id: &str,
    seq: u64,
    annotation: String,
    shim_group: &str,
) -> Result<Container, String> {
    let spec_any = with_annotation(orig, Some(annotation))?;
    let mut spec: serde_json::Value =
        serde_json::from_slice(&spec_any.value).map_err(|e| format!("spec of {}: {e}", orig.id))?;
    spec["root"] = serde_json::json!({"path": "rootfs", "readonly": false});
    // Pods group by their sandbox id already; other forks of one call share a shim.
    if spec["annotations"]["io.kubernetes.cri.sandbox-id"].is_null() {
        spec["annotations"][crate::api::SHIM_GROUP_ANNOTATION] =
            serde_json::Value::String(shim_group.to_string());
    }
    if let Some(cg) = spec["linux"]["cgroupsPath"].as_str() {
        let cg = match cg.rsplit_once(&orig.id) {
            Some((head, tail)) => format!("{head}{id}{tail}"),
            None => format!("{cg}-{id}"),
        };
        spec["linux"]["cgroupsPath"] = serde_json::Value::String(cg);
    }
    let mut labels = orig.labels.clone();
    labels.insert("io.belayer.fork-of".into(), orig.id.clone());
    labels.insert("io.belayer.fork-checkpoint".into(), seq.to_string());
    Ok(Container {
        id: id.to_string(),
        labels,
        image: orig.image.clone(),
        runtime: Some(Runtime {
            name: crate::service::RUNTIME_ID.to_string(),
            options: None,
        }),
        spec: Some(prost_types::Any {
            type_url: spec_any.type_url,
            value: serde_json::to_vec(&spec).map_err(|e| e.to_string())?,
        }),
        ..Default::default()
    })
}

/// `c`'s spec with the restore annotation set to `value`, or removed.
fn with_annotation(c: &Container, value: Option<String>) -> Result<prost_types::Any, String> {
    let any = c
        .spec
        .clone()
        .ok_or_else(|| format!("container {} has no spec", c.id))?;
    let mut spec: serde_json::Value =
        serde_json::from_slice(&any.value).map_err(|e| format!("spec of {}: {e}", c.id))?;
    match value {
        Some(v) => {
            if !spec["annotations"].is_object() {
                spec["annotations"] = serde_json::json!({});
            }
            spec["annotations"][RESTORE_ANNOTATION] = serde_json::Value::String(v);
        }
        None => {
            if let Some(a) = spec["annotations"].as_object_mut() {
                a.remove(RESTORE_ANNOTATION);
            }
        }
    }
    Ok(prost_types::Any {
        type_url: any.type_url,
        value: serde_json::to_vec(&spec).map_err(|e| e.to_string())?,
    })
}
