//! The containerd calls of the CLI: look a container up, and create tasks that restore a
//! checkpoint (a restore of a container without a task, forks, and a pulled checkpoint); and,
//! for `belayer push --kube`, what containerd and its CRI plugin record of a container.

use std::path::{Path, PathBuf};

use containerd_client::services::v1::container::Runtime;
use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::MountsRequest;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteTaskRequest, GetContainerRequest, GetRequest, ListContainersRequest, StartRequest,
    UpdateContainerRequest,
};
use containerd_client::tonic::{Code, Request, transport::Channel};
use containerd_client::with_namespace;

use belayer_api::{RESTORE_ANNOTATION, RUNTIME_ID, RestoreOptions, SHIM_GROUP_ANNOTATION};
use belayer_registry::kube::ContainerRecords;
use k8s_cri::v1::ContainerStatusRequest;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;

use crate::error::{Error, Result};

/// The containerd container extension in which the CRI plugin keeps its metadata of a container.
const CRI_METADATA_EXTENSION: &str = "io.cri-containerd.container.metadata";

/// How long a restore waits for containerd to finish cleaning up after a dead shim.
const DEAD_SHIM_CLEANUP: std::time::Duration = std::time::Duration::from_secs(30);

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

    fn channel(&self) -> Result<Channel> {
        self.rt
            .block_on(containerd_client::connect(&self.address))
            .map_err(|source| Error::Connect {
                address: self.address.clone(),
                source,
            })
    }

    /// The container record, or "not found" naming the namespace.
    pub fn container(&self, id: &str) -> Result<Container> {
        let mut c = ContainersClient::new(self.channel()?);
        let req = GetContainerRequest { id: id.to_string() };
        match self
            .rt
            .block_on(c.get(with_namespace!(req, self.namespace.as_str())))
        {
            Ok(r) => r.into_inner().container.ok_or_else(|| Error::Containerd {
                step: format!("container {id}"),
                status: containerd_client::tonic::Status::unknown("empty answer from containerd"),
            }),
            Err(s) if s.code() == Code::NotFound => Err(Error::ContainerNotFound {
                id: id.to_string(),
                namespace: self.namespace.clone(),
            }),
            Err(status) => Err(Error::Containerd {
                step: "containerd".into(),
                status,
            }),
        }
    }

    /// What containerd records of container `id` that CRI's checkpoint dumps are made from: its
    /// container record (spec, runtime, creation time, the CRI plugin's metadata) and CRI's
    /// `ContainerStatus` of it. A container CRI does not serve is not a Kubernetes one.
    pub fn kube_records(&self, id: &str) -> Result<ContainerRecords> {
        let c = self.container(id)?;
        let spec = c
            .spec
            .as_ref()
            .ok_or_else(|| Error::NoSpec(id.to_string()))?;
        let mut cri = RuntimeServiceClient::new(self.channel()?);
        let req = ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        };
        let status = match self.rt.block_on(cri.container_status(req)) {
            Ok(r) => r.into_inner().status,
            Err(status) if matches!(status.code(), Code::NotFound | Code::Unimplemented) => {
                return Err(Error::NotKube {
                    id: id.to_string(),
                    status,
                });
            }
            Err(status) => {
                return Err(Error::Containerd {
                    step: format!("CRI status of {id}"),
                    status,
                });
            }
        };
        let created = c.created_at.unwrap_or_default();
        Ok(ContainerRecords {
            id: id.to_string(),
            runtime: c.runtime.map(|r| r.name).unwrap_or_default(),
            created_unix_ns: i128::from(created.seconds) * 1_000_000_000
                + i128::from(created.nanos),
            spec: String::from_utf8_lossy(&spec.value).into_owned(),
            cri_metadata: c
                .extensions
                .get(CRI_METADATA_EXTENSION)
                .map(|m| String::from_utf8_lossy(&m.value).into_owned()),
            status: serde_json::to_value(&status).unwrap_or_default(),
        })
    }

    fn restore_annotation(&self, source: &str, seq: u64) -> String {
        let opts = RestoreOptions {
            namespace: self.namespace.clone(),
            container: source.to_string(),
            checkpoint: seq,
        };
        serde_json::to_string(&opts).unwrap_or_default()
    }

    /// Creates and starts a task of container `id` that restores: from the restore annotation
    /// its spec carries, or from the checkpoint directory `options` names.
    fn create_restored_task(&self, id: &str, from: TaskFrom) -> Result<u32> {
        let mut tasks = TasksClient::new(self.channel()?);
        let ns = self.namespace.as_str();
        // After a shim's death containerd no longer lists the task but holds it until the shim
        // binary's `delete` has cleaned up (a second or more): a create meanwhile is refused as
        // "already exists". Wait that cleanup out; a task that answers is a live one.
        let deadline = std::time::Instant::now() + DEAD_SHIM_CLEANUP;
        loop {
            let req = CreateTaskRequest {
                container_id: id.to_string(),
                options: from.options.clone(),
                rootfs: from.rootfs.clone(),
                ..Default::default()
            };
            let s = match self.rt.block_on(tasks.create(with_namespace!(req, ns))) {
                Ok(_) => break,
                Err(s) => s,
            };
            let req = GetRequest {
                container_id: id.to_string(),
                ..Default::default()
            };
            let live = self
                .rt
                .block_on(tasks.get(with_namespace!(req, ns)))
                .is_ok();
            if s.code() != Code::AlreadyExists || live || std::time::Instant::now() > deadline {
                return Err(Error::Containerd {
                    step: format!("create task {id}"),
                    status: s,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let req = StartRequest {
            container_id: id.to_string(),
            ..Default::default()
        };
        match self.rt.block_on(tasks.start(with_namespace!(req, ns))) {
            Ok(r) => Ok(r.into_inner().pid),
            Err(status) => {
                let req = DeleteTaskRequest {
                    container_id: id.to_string(),
                };
                let _ = self.rt.block_on(tasks.delete(with_namespace!(req, ns)));
                Err(Error::Containerd {
                    step: format!("restore {id}"),
                    status,
                })
            }
        }
    }

    /// Container `id`'s record, or an error unless it runs with Belayer's runtime.
    fn belayer_container(&self, id: &str) -> Result<Container> {
        let c = self.container(id)?;
        let runtime = c
            .runtime
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_default();
        if runtime != RUNTIME_ID {
            return Err(Error::OtherRuntime {
                id: id.to_string(),
                runtime,
            });
        }
        Ok(c)
    }

    /// Whether container `id` has a task (of any state).
    fn has_task(&self, id: &str) -> Result<bool> {
        let mut tasks = TasksClient::new(self.channel()?);
        let req = GetRequest {
            container_id: id.to_string(),
            ..Default::default()
        };
        match self
            .rt
            .block_on(tasks.get(with_namespace!(req, self.namespace.as_str())))
        {
            Ok(_) => Ok(true),
            Err(s) if s.code() == Code::NotFound => Ok(false),
            Err(status) => Err(Error::Containerd {
                step: format!("task {id}"),
                status,
            }),
        }
    }

    /// Checks that container `id` can take a task created from a checkpoint directory: it runs
    /// with Belayer's runtime and has no task.
    pub fn check_restorable(&self, id: &str) -> Result<()> {
        self.belayer_container(id)?;
        if self.has_task(id)? {
            return Err(Error::HasTask(id.to_string()));
        }
        Ok(())
    }

    /// Creates and starts container `id`'s task from the checkpoint export in `dir`, the way CRI
    /// restores from a path: containerd hands the runtime options' `criu_image_path` to the shim
    /// as the task's checkpoint, and the shim imports it (every import check) and restores it.
    pub fn create_from_checkpoint_dir(&self, id: &str, dir: &Path) -> Result<u32> {
        let c = self.belayer_container(id)?;
        if self.has_task(id)? {
            return Err(Error::HasTask(id.to_string()));
        }
        // The task's rootfs is the container's image snapshot, as containerd's own clients
        // pass it: the import stacks the checkpoint's layers on that snapshot's lower dirs.
        if c.snapshot_key.is_empty() {
            return Err(Error::NoSnapshot(id.to_string()));
        }
        let mut snapshots = SnapshotsClient::new(self.channel()?);
        let req = MountsRequest {
            snapshotter: c.snapshotter.clone(),
            key: c.snapshot_key.clone(),
        };
        let rootfs = self
            .rt
            .block_on(snapshots.mounts(with_namespace!(req, self.namespace.as_str())))
            .map_err(|status| Error::Containerd {
                step: format!("mounts of snapshot {} of {id}", c.snapshot_key),
                status,
            })?
            .into_inner()
            .mounts;
        self.create_restored_task(
            id,
            TaskFrom {
                options: Some(runc_options_with_image_path(dir)),
                rootfs,
            },
        )
    }

    /// Restores a container that has no task: a new task restoring its checkpoint `seq`.
    pub fn restore_task(&self, id: &str, seq: u64) -> Result<()> {
        let c = self.belayer_container(id)?;
        let containers = ContainersClient::new(self.channel()?);
        let ns = self.namespace.as_str();
        let update = |c: &Container, annotation: Option<String>| -> Result<()> {
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
                .map_err(|status| Error::Containerd {
                    step: format!("update container {id}"),
                    status,
                })
        };
        update(&c, Some(self.restore_annotation(id, seq)))?;
        let restored = self.create_restored_task(id, TaskFrom::default());
        // The annotation is for this restore only: a later start runs the spec as usual.
        let cleared = update(&c, None);
        restored?;
        cleared
    }

    /// `count` new containers running from checkpoint `seq` of `source`; returns their ids.
    pub fn fork(&self, source: &str, seq: u64, count: u32) -> Result<Vec<String>> {
        let orig = self.container(source)?;
        let mut containers = ContainersClient::new(self.channel()?);
        let ns = self.namespace.as_str();
        let existing: Vec<String> = self
            .rt
            .block_on(containers.list(with_namespace!(ListContainersRequest::default(), ns)))
            .map_err(|status| Error::Containerd {
                step: "containerd".into(),
                status,
            })?
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
            if let Err(status) = self
                .rt
                .block_on(containers.create(with_namespace!(req, ns)))
            {
                self.remove_forks(&created);
                return Err(Error::Containerd {
                    step: format!("create container {id}"),
                    status,
                });
            }
            created.push(id.clone());
        }
        // The forks restore side by side: each task's shim verifies, mounts and restores on its own.
        let results: Vec<Result<u32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ids
                .iter()
                .map(|id| {
                    scope.spawn(move || {
                        Containerd::new(&self.address, &self.namespace)
                            .create_restored_task(id, TaskFrom::default())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(Error::Panicked("fork"))))
                .collect()
        });
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
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
) -> Result<Container> {
    let spec_any = with_annotation(orig, Some(annotation))?;
    let spec_error = |source| Error::Spec {
        id: orig.id.clone(),
        source,
    };
    let mut spec: serde_json::Value =
        serde_json::from_slice(&spec_any.value).map_err(spec_error)?;
    spec["root"] = serde_json::json!({"path": "rootfs", "readonly": false});
    // Pods group by their sandbox id already; other forks of one call share a shim.
    if spec["annotations"]["io.kubernetes.cri.sandbox-id"].is_null() {
        spec["annotations"][SHIM_GROUP_ANNOTATION] =
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
            name: RUNTIME_ID.to_string(),
            options: None,
        }),
        spec: Some(prost_types::Any {
            type_url: spec_any.type_url,
            value: serde_json::to_vec(&spec).map_err(spec_error)?,
        }),
        ..Default::default()
    })
}

/// What a restoring task is created with beyond its container's record.
#[derive(Default)]
struct TaskFrom {
    /// Task options (runc's, naming a checkpoint directory).
    options: Option<prost_types::Any>,
    /// The rootfs mounts (a container's image snapshot).
    rootfs: Vec<containerd_client::types::Mount>,
}

/// The part of runc's runtime options (`containerd.runc.v1.Options`, which Belayer's shim
/// reads too) that names a checkpoint directory to create a task from.
#[derive(Clone, PartialEq, prost::Message)]
struct RuncOptions {
    #[prost(string, tag = "10")]
    criu_image_path: String,
}

/// Task options that make containerd create the task from the checkpoint in `dir`.
fn runc_options_with_image_path(dir: &Path) -> prost_types::Any {
    use prost::Message;
    prost_types::Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: RuncOptions {
            criu_image_path: dir.display().to_string(),
        }
        .encode_to_vec(),
    }
}

/// `c`'s spec with the restore annotation set to `value`, or removed.
fn with_annotation(c: &Container, value: Option<String>) -> Result<prost_types::Any> {
    let any = c.spec.clone().ok_or_else(|| Error::NoSpec(c.id.clone()))?;
    let spec_error = |source| Error::Spec {
        id: c.id.clone(),
        source,
    };
    let mut spec: serde_json::Value = serde_json::from_slice(&any.value).map_err(spec_error)?;
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
        value: serde_json::to_vec(&spec).map_err(spec_error)?,
    })
}
