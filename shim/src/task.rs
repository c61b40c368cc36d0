//! containerd's task API (v2) served over ttrpc: each RPC finds its container, takes its lock
//! and calls into [`container`](crate::container); exits are recorded and published here.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::protos::api::DeleteResponse;
use containerd_shim::protos::api::{
    CheckpointTaskRequest, CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest,
    CreateTaskResponse, DeleteRequest, Empty, ExecProcessRequest, KillRequest, PauseRequest,
    PidsRequest, PidsResponse, ProcessInfo, ResizePtyRequest, ResumeRequest, ShutdownRequest,
    StartRequest, StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, Status,
    UpdateTaskRequest, WaitRequest, WaitResponse,
};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};
use containerd_shim::protos::shim::oci::ProcessDetails;
use containerd_shim::protos::topics::*;
use containerd_shim::{Context, TtrpcContext, TtrpcResult};
use log::{info, warn};
use tokio::sync::Mutex;

use crate::container::{self, Container, PendingRestore};
use crate::error::{Error, Result};
use crate::export::Imported;
use crate::process::{self, DRAIN_LIMIT, Exit, Process};
use crate::reaper;
use crate::runc::Runc;
use crate::stdio::StdioPaths;

/// The exit code journalled for an exec runc could not start (the replay of one meets it too).
pub const EXEC_NOT_STARTED: u32 = 255;

/// The exit status of a process killed by SIGKILL.
pub const SIGKILLED: u32 = 128 + libc::SIGKILL as u32;

type Shared = Arc<Mutex<Container>>;

/// A container in the shim's table, and what can be asked of it without its lock.
#[derive(Clone)]
struct Entry {
    container: Shared,
    busy: crate::checkpoint::BusySlot,
}

/// How long State waits for a container that a checkpoint or restore holds before it answers
/// with the last state it reported. containerd gives State 2 s; a checkpoint's frozen window on a
/// loaded node, or one waiting for a lazy restore's memory fill, can hold the container longer,
/// and `ctr tasks ls` would show it UNKNOWN with pid 0. The container's state does not change
/// while it is held: its exits and execs wait for the same lock.
const STATE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// State shared by the RPC handlers and the exit monitors.
pub struct Inner {
    pub namespace: String,
    pub runc: Runc,
    pub settings: crate::settings::Settings,
    containers: std::sync::Mutex<HashMap<String, Entry>>,
    /// The last State answered per (container, exec): the answer while a checkpoint or restore
    /// holds the container longer than [`STATE_WAIT`].
    last_states: std::sync::Mutex<HashMap<(String, String), StateResponse>>,
    /// The node's checkpoint scheduler (per shim process).
    pub sched: std::sync::Mutex<scheduler::NodeScheduler>,
    /// Automatic checkpoints skipped in a row, per container (one retry pending at most).
    pub skips: std::sync::Mutex<HashMap<String, crate::auto::Skips>>,
    /// Time origin of the scheduler's clock.
    pub epoch: std::time::Instant,
    publisher: RemotePublisher,
    exit: Arc<ExitSignal>,
}

/// The task service containerd talks to.
#[derive(Clone)]
pub struct TaskService(pub Arc<Inner>);

impl TaskService {
    pub fn new(
        namespace: &str,
        runc: Runc,
        settings: crate::settings::Settings,
        publisher: RemotePublisher,
        exit: Arc<ExitSignal>,
    ) -> Self {
        Self(Arc::new(Inner {
            namespace: namespace.to_string(),
            runc,
            sched: std::sync::Mutex::new(
                scheduler::NodeScheduler::new(settings.scheduler.clone()).unwrap_or_else(|_| {
                    scheduler::NodeScheduler::new(Default::default())
                        .expect("default scheduler config is valid")
                }),
            ),
            epoch: std::time::Instant::now(),
            settings,
            containers: Default::default(),
            last_states: Default::default(),
            skips: Default::default(),
            publisher,
            exit,
        }))
    }
}

impl Inner {
    fn entry(&self, id: &str) -> Result<Entry> {
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| Error::ContainerNotFound(id.to_string()))
    }

    pub fn get(&self, id: &str) -> Result<Shared> {
        self.entry(id).map(|e| e.container)
    }

    /// Whether a checkpoint or restore of container `id` is under way (see [`Container::busy`]).
    pub fn busy(&self, id: &str) -> Result<crate::checkpoint::BusySlot> {
        self.entry(id).map(|e| e.busy)
    }

    fn is_empty(&self) -> bool {
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    pub async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.namespace, event)
            .await
        {
            warn!("publish {topic}: {e}");
        }
    }

    /// Watches `pid`; when it exits, drains its output, records the exit and publishes it.
    pub fn monitor(self: &Arc<Self>, id: &str, exec_id: &str, pid: u32) {
        let exited = reaper::watch(pid as i32);
        let (inner, id, exec_id) = (self.clone(), id.to_string(), exec_id.to_string());
        tokio::spawn(async move {
            let code = exited.await.unwrap_or(255);
            let Ok(c) = inner.get(&id) else { return };
            let (pio, _recovering) = {
                let mut guard = c.lock().await;
                // Execs wait from here until the recovery has ended, either way (this task's
                // end): in between, the container's processes are dead.
                let recovering = (exec_id.is_empty()
                    && guard.init.pid == pid
                    && guard.recovers_from(code as u32))
                .then(|| guard.recovery.clone().try_lock_owned().ok())
                .flatten();
                // A process replaced by a restore is no longer the one this exit is about.
                let pio = guard
                    .process_mut(&exec_id)
                    .ok()
                    .filter(|p| p.pid == pid)
                    .and_then(|p| p.io.take());
                (pio, recovering)
            };
            // Held until a recovery has opened the streams again, or no recovery comes.
            let outputs = match pio {
                Some(mut pio) => pio.drained(DRAIN_LIMIT).await,
                None => Vec::new(),
            };
            if exec_id.is_empty() {
                let current = c.lock().await.init.pid == pid;
                if current && let Some(rec) = inner.recover(&id, code as u32).await {
                    drop(outputs);
                    info!(
                        "container {id} recovered from checkpoint {}",
                        rec.restore.checkpoint
                    );
                    inner
                        .publish(
                            crate::auto::RECOVERED_TOPIC,
                            Box::new(TaskStart {
                                container_id: id.clone(),
                                pid: rec.restore.pid,
                                ..Default::default()
                            }),
                        )
                        .await;
                    return;
                }
            }
            drop(outputs);
            let exit = Exit {
                status: code as u32,
                at: process::now(),
            };
            {
                let mut guard = c.lock().await;
                let c = &mut *guard;
                let Ok(p) = c.process_mut(&exec_id) else {
                    return;
                };
                if p.pid != pid {
                    return;
                }
                p.set_exited(exit.clone());
                if !exec_id.is_empty() {
                    inner.exec_exited(c, &exec_id, exit.status);
                }
            }
            info!("container {id} process {exec_id:?} pid {pid} exited with {code}");
            inner
                .publish(
                    TASK_EXIT_EVENT_TOPIC,
                    Box::new(TaskExit {
                        container_id: id.clone(),
                        id: if exec_id.is_empty() {
                            id.clone()
                        } else {
                            exec_id
                        },
                        pid,
                        exit_status: exit.status,
                        exited_at: MessageField::some(exit.at),
                        ..Default::default()
                    }),
                )
                .await;
        });
    }

    async fn create(self: &Arc<Self>, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
        if self.get(&req.id).is_ok() {
            return Err(Error::AlreadyExists(req.id));
        }
        let bundle = PathBuf::from(&req.bundle);
        let (conf_bundle, lock, runc) = (
            bundle.clone(),
            self.settings.network_lock.clone(),
            self.bridge_runc(),
        );
        // Checked before the import below takes containerd's unpacked checkpoint.
        let systemd_option = systemd_cgroup_option(req.options.as_ref())?;
        let id = req.id.clone();
        let (spec, systemd_cgroup) = tokio::task::spawn_blocking(move || {
            let mut spec = crate::spec::Spec::load(&conf_bundle)?;
            let systemd = systemd_option || spec.systemd_cgroups_path();
            crate::criu_conf::apply(&conf_bundle, &mut spec, &id, systemd, &lock, &runc)?;
            Ok::<_, Error>((spec, systemd))
        })
        .await
        .map_err(|e| Error::FailedPrecondition(format!("CRIU configuration: {e}")))??;
        // A task created without stdio for a spec with a terminal (a fork, a restore of a
        // container without a task) still gets one: runc restores it onto a new pty.
        let paths = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal || spec.terminal(),
        };
        let restore = match req.checkpoint.as_str() {
            "" => restore_options(&spec)?.map(Imported::Belayer),
            path => {
                // An import stacks on this container's own image, never on lower dirs it names.
                let lowers = crate::rootfs::snapshot_lowers(&req.rootfs, &spec.root(&bundle));
                Some(self.import_checkpoint(path, &req.id, lowers).await?)
            }
        };
        let journal =
            crate::journal::Journal::open(self.settings.journals(&self.namespace), &req.id);
        let mut c = Container::new(
            &req.id,
            bundle.clone(),
            Process::new("", paths.clone()),
            journal,
        );
        c.policy = crate::auto::ContainerPolicy::from_spec(&spec, &self.settings);
        c.rootfs = spec.root(&bundle);
        c.systemd_cgroup = systemd_cgroup;
        c.mounted_rootfs = crate::rootfs::mount(&bundle, &req.rootfs).await?;
        let pid = match restore {
            Some(Imported::Belayer(opts)) => {
                if let Err(e) = self.prepare_restore(&mut c, &opts).await {
                    c.cleanup(&self.runc).await;
                    return Err(e);
                }
                0
            }
            Some(Imported::Runc(images)) => {
                c.pending_restore = Some(PendingRestore::Runc(images));
                0
            }
            None => {
                let runc = self.runc.for_cgroups(c.systemd_cgroup);
                match container::spawn_process(&runc, &req.id, &bundle, &paths, None).await {
                    Ok((pid, pio)) => {
                        c.init.pid = pid;
                        c.init.io = Some(pio);
                        pid
                    }
                    Err(e) => {
                        c.cleanup(&self.runc).await;
                        return Err(e);
                    }
                }
            }
        };
        let control = crate::control::serve(self.clone(), &req.id).await;
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                req.id.clone(),
                Entry {
                    busy: c.busy.clone(),
                    container: Arc::new(Mutex::new(c)),
                },
            );
        if let Ok(c) = self.get(&req.id) {
            self.track(&*c.lock().await);
        }
        if let Err(e) = control {
            warn!("container {}: no control socket: {e}", req.id);
        }
        if pid != 0 {
            self.monitor(&req.id, "", pid);
        }
        info!("container {} created, init pid {pid}", req.id);
        self.publish(
            TASK_CREATE_EVENT_TOPIC,
            Box::new(TaskCreate {
                container_id: req.id.clone(),
                bundle: req.bundle.clone(),
                rootfs: req.rootfs.clone(),
                io: MessageField::some(TaskIO {
                    stdin: req.stdin,
                    stdout: req.stdout,
                    stderr: req.stderr,
                    terminal: req.terminal,
                    ..Default::default()
                }),
                checkpoint: req.checkpoint,
                pid,
                ..Default::default()
            }),
        )
        .await;
        Ok(CreateTaskResponse {
            pid,
            ..Default::default()
        })
    }

    async fn start(self: &Arc<Self>, req: StartRequest) -> Result<StartResponse> {
        let shared = self.get(&req.id)?;
        let mut c = Container::after_recovery(&shared).await;
        if req.exec_id.is_empty() {
            if c.init.status != Status::CREATED {
                return Err(Error::FailedPrecondition(format!(
                    "container {} is not in created state",
                    req.id
                )));
            }
            match c.pending_restore.take() {
                Some(PendingRestore::Belayer(cp, lease)) => {
                    self.start_restored(&mut c, *cp, lease).await?;
                }
                Some(PendingRestore::Runc(images)) => {
                    self.start_runc_restored(&mut c, images).await?;
                }
                None => {
                    self.runc.start(&req.id).await?;
                    if c.init.exit().is_none() {
                        c.init.status = Status::RUNNING;
                    }
                }
            }
            let pid = c.init.pid;
            self.publish(
                TASK_START_EVENT_TOPIC,
                Box::new(TaskStart {
                    container_id: req.id.clone(),
                    pid,
                    ..Default::default()
                }),
            )
            .await;
            return Ok(StartResponse {
                pid,
                ..Default::default()
            });
        }
        let spec_path = c.exec_spec_path(&req.exec_id);
        let p = c.process_mut(&req.exec_id)?;
        let Some(spec) = p.spec.take() else {
            return Err(Error::FailedPrecondition(format!(
                "exec {} was already started",
                req.exec_id
            )));
        };
        let paths = p.paths.clone();
        let mut retried = false;
        let (pid, pio) = loop {
            if !c.journal.running(&req.exec_id) {
                self.exec_started(&mut c, &req.exec_id, &spec);
            }
            std::fs::write(&spec_path, &spec)
                .map_err(crate::error::io(format!("write {}", spec_path.display())))?;
            let started =
                container::spawn_process(&self.runc, &req.id, &c.bundle, &paths, Some(&spec_path))
                    .await;
            let _ = std::fs::remove_file(&spec_path);
            let _ = std::fs::remove_file(spec_path.with_extension("pid"));
            let failed = match started {
                Ok(s) => break s,
                // The init died between the wait for recovery above and runc's exec (which
                // then meets a stopped container): wait again, once, and run it in the
                // recovered container.
                Err(e) if !retried && c.init_died_unseen() => {
                    info!(
                        "container {} exec {}: the init died as it started ({e}); waiting for \
                         the recovery",
                        req.id, req.exec_id
                    );
                    retried = true;
                    drop(c);
                    c = Container::after_recovery(&shared).await;
                    if c.init.is_running() {
                        continue;
                    }
                    e
                }
                Err(e) => e,
            };
            // The action ended without running: the journal and the scheduler hear so.
            self.exec_exited(&mut c, &req.exec_id, EXEC_NOT_STARTED);
            return Err(failed);
        };
        let p = c.process_mut(&req.exec_id)?;
        p.pid = pid;
        p.io = Some(pio);
        p.status = Status::RUNNING;
        self.monitor(&req.id, &req.exec_id, pid);
        self.publish(
            TASK_EXEC_STARTED_EVENT_TOPIC,
            Box::new(TaskExecStarted {
                container_id: req.id.clone(),
                exec_id: req.exec_id.clone(),
                pid,
                ..Default::default()
            }),
        )
        .await;
        Ok(StartResponse {
            pid,
            ..Default::default()
        })
    }

    async fn exec(&self, req: ExecProcessRequest) -> Result<()> {
        let shared = self.get(&req.id)?;
        let mut c = Container::after_recovery(&shared).await;
        if c.execs.contains_key(&req.exec_id) {
            return Err(Error::AlreadyExists(format!("exec {}", req.exec_id)));
        }
        if !c.init.is_running() {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running",
                req.id
            )));
        }
        let spec = req
            .spec
            .as_ref()
            .map(|s| s.value.clone())
            .unwrap_or_default();
        if serde_json::from_slice::<oci_spec::runtime::Process>(&spec).is_err() {
            return Err(Error::InvalidArgument(format!(
                "exec {}: invalid process spec",
                req.exec_id
            )));
        }
        let mut p = Process::new(
            &req.exec_id,
            StdioPaths {
                stdin: req.stdin,
                stdout: req.stdout,
                stderr: req.stderr,
                terminal: req.terminal,
            },
        );
        p.spec = Some(spec);
        c.execs.insert(req.exec_id.clone(), p);
        self.publish(
            TASK_EXEC_ADDED_EVENT_TOPIC,
            Box::new(TaskExecAdded {
                container_id: req.id,
                exec_id: req.exec_id,
                ..Default::default()
            }),
        )
        .await;
        Ok(())
    }

    async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
        let shared = self.get(&req.id)?;
        let mut c = shared.lock().await;
        if !req.exec_id.is_empty() {
            let p = c.process(&req.exec_id)?;
            if p.is_running() {
                return Err(Error::FailedPrecondition(format!(
                    "exec {} is still running",
                    req.exec_id
                )));
            }
            let exit = p.exit();
            let pid = p.pid;
            c.execs.remove(&req.exec_id);
            self.last_states
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&(req.id.clone(), req.exec_id.clone()));
            let (exit_status, exited_at) = exit
                .map(|e| (e.status, e.at))
                .unwrap_or_else(|| (0, process::zero_time()));
            return Ok(DeleteResponse {
                pid,
                exit_status,
                exited_at: MessageField::some(exited_at),
                ..Default::default()
            });
        }
        if c.init.is_running() {
            return Err(Error::FailedPrecondition(format!(
                "container {} is still running",
                req.id
            )));
        }
        let rx = c.init.subscribe();
        // Nothing brings it back from here: not a recovery of the init `runc delete --force`
        // kills (one created, never started), not a restore queued behind this lock.
        c.killed = true;
        c.deleted = true;
        c.cleanup(&self.runc).await;
        drop(c);
        // A created-but-never-started init is killed by `runc delete --force`; collect its exit.
        let exit = tokio::time::timeout(DRAIN_LIMIT * 2, process::wait_exit(rx))
            .await
            .ok()
            .flatten();
        let (exit_status, exited_at) = exit
            .map(|e| (e.status, e.at))
            .unwrap_or((137, process::now()));
        let pid = shared.lock().await.init.pid;
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&req.id);
        self.last_states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(id, _), _| *id != req.id);
        crate::control::remove(&self.namespace, &req.id);
        self.untrack(&req.id);
        info!("container {} deleted", req.id);
        self.publish(
            TASK_DELETE_EVENT_TOPIC,
            Box::new(TaskDelete {
                container_id: req.id.clone(),
                id: req.id.clone(),
                pid,
                exit_status,
                exited_at: MessageField::some(exited_at.clone()),
                ..Default::default()
            }),
        )
        .await;
        Ok(DeleteResponse {
            pid,
            exit_status,
            exited_at: MessageField::some(exited_at),
            ..Default::default()
        })
    }

    async fn state(&self, req: StateRequest) -> Result<StateResponse> {
        let shared = self.get(&req.id)?;
        let key = (req.id.clone(), req.exec_id.clone());
        let c = match tokio::time::timeout(STATE_WAIT, shared.lock()).await {
            Ok(c) => c,
            Err(_) => {
                let last = self
                    .last_states
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                    .cloned();
                match last {
                    Some(last) => return Ok(last),
                    None => shared.lock().await,
                }
            }
        };
        let p = c.process(&req.exec_id)?;
        let (exit_status, exited_at) = p
            .exit()
            .map(|e| (e.status, e.at))
            .unwrap_or_else(|| (0, process::zero_time()));
        let exited_at = MessageField::some(exited_at);
        let state = StateResponse {
            id: if req.exec_id.is_empty() {
                req.id.clone()
            } else {
                req.exec_id.clone()
            },
            bundle: c.bundle.display().to_string(),
            pid: p.pid,
            status: p.status.into(),
            stdin: p.paths.stdin.clone(),
            stdout: p.paths.stdout.clone(),
            stderr: p.paths.stderr.clone(),
            terminal: p.paths.terminal,
            exit_status,
            exited_at,
            exec_id: req.exec_id,
            ..Default::default()
        };
        self.last_states
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, state.clone());
        Ok(state)
    }

    async fn pause_resume(&self, id: &str, pause: bool) -> Result<()> {
        let shared = self.get(id)?;
        let mut c = shared.lock().await;
        let want_from = if pause {
            Status::RUNNING
        } else {
            Status::PAUSED
        };
        if c.init.status != want_from {
            let state = format!("{:?}", c.init.status).to_lowercase();
            return Err(Error::FailedPrecondition(format!(
                "container {id} is {state}"
            )));
        }
        if pause {
            self.runc.pause(id).await?;
            c.init.status = Status::PAUSED;
            self.publish(
                TASK_PAUSED_EVENT_TOPIC,
                Box::new(TaskPaused {
                    container_id: id.into(),
                    ..Default::default()
                }),
            )
            .await;
        } else {
            self.runc.resume(id).await?;
            c.init.status = Status::RUNNING;
            self.publish(
                TASK_RESUMED_EVENT_TOPIC,
                Box::new(TaskResumed {
                    container_id: id.into(),
                    ..Default::default()
                }),
            )
            .await;
        }
        Ok(())
    }

    async fn pids(&self, id: &str) -> Result<PidsResponse> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let pids = self.runc.ps(id).await?;
        let by_pid: HashMap<u32, &str> = c
            .execs
            .values()
            .map(|p| (p.pid, p.exec_id.as_str()))
            .collect();
        let processes = pids
            .into_iter()
            .map(|pid| {
                let info = by_pid.get(&pid).and_then(|exec_id| {
                    let details = ProcessDetails {
                        exec_id: exec_id.to_string(),
                        ..Default::default()
                    };
                    containerd_shim::util::convert_to_any(Box::new(details)).ok()
                });
                ProcessInfo {
                    pid,
                    info: info.into(),
                    ..Default::default()
                }
            })
            .collect();
        Ok(PidsResponse {
            processes,
            ..Default::default()
        })
    }

    async fn stats(&self, id: &str) -> Result<StatsResponse> {
        let shared = self.get(id)?;
        let pid = {
            let c = shared.lock().await;
            if !c.init.is_running() {
                return Err(Error::FailedPrecondition(format!(
                    "container {id} is not running"
                )));
            }
            c.init.pid
        };
        let any = tokio::task::spawn_blocking(move || crate::cgroup::metrics(pid))
            .await
            .map_err(|e| Error::FailedPrecondition(format!("collect metrics: {e}")))??;
        Ok(StatsResponse {
            stats: MessageField::some(any),
            ..Default::default()
        })
    }

    async fn update(&self, req: UpdateTaskRequest) -> Result<()> {
        let shared = self.get(&req.id)?;
        let c = shared.lock().await;
        if !c.init.is_running() {
            return Err(Error::FailedPrecondition(format!(
                "container {} is not running",
                req.id
            )));
        }
        let resources = req
            .resources
            .as_ref()
            .map(|r| r.value.clone())
            .unwrap_or_default();
        if serde_json::from_slice::<oci_spec::runtime::LinuxResources>(&resources).is_err() {
            return Err(Error::InvalidArgument(
                "update: resources are not an OCI LinuxResources document".into(),
            ));
        }
        self.runc.update(&req.id, resources).await
    }
}

#[async_trait]
impl containerd_shim::Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        Ok(self.0.create(req).await?)
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        Ok(self.0.start(req).await?)
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        self.0.exec(req).await?;
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        let shared = self.0.get(&req.id)?;
        let mut c = shared.lock().await;
        c.kill(&self.0.runc, &req.exec_id, req.signal, req.all)
            .await?;
        // Still under the lock: the init's monitor sees the death as intended.
        if req.exec_id.is_empty() {
            c.note_signal(req.signal, req.all);
        }
        Ok(Empty::new())
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        Ok(self.0.delete(req).await?)
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        let rx = {
            let shared = self.0.get(&req.id)?;
            let c = shared.lock().await;
            c.process(&req.exec_id)?.subscribe()
        };
        let exit = process::wait_exit(rx)
            .await
            .ok_or_else(|| Error::FailedPrecondition(format!("container {} went away", req.id)))?;
        Ok(WaitResponse {
            exit_status: exit.status,
            exited_at: MessageField::some(exit.at),
            ..Default::default()
        })
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        Ok(self.0.state(req).await?)
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        Ok(self.0.pids(&req.id).await?)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        self.0.pause_resume(&req.id, true).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        self.0.pause_resume(&req.id, false).await?;
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        Ok(self.0.stats(&req.id).await?)
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        let options = req.options.as_ref().map(|o| o.value.as_slice());
        self.0
            .checkpoint_for_containerd(&req.id, &req.path, options)
            .await?;
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        self.0.update(req).await?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        let shared = self.0.get(&req.id)?;
        let c = shared.lock().await;
        if let Some(pio) = &c.process(&req.exec_id)?.io {
            pio.close_stdin();
        }
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        let shared = self.0.get(&req.id)?;
        let c = shared.lock().await;
        let p = c.process(&req.exec_id)?;
        if p.status == Status::STOPPED {
            return Err(
                Error::FailedPrecondition("cannot resize a stopped container".into()).into(),
            );
        }
        if let Some(pio) = &p.io {
            pio.resize(req.width, req.height)?;
        }
        Ok(Empty::new())
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        let task_pid = match self.0.get(&req.id) {
            Ok(c) => c.lock().await.init.pid,
            Err(_) => 0,
        };
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        if self.0.is_empty() {
            self.0.exit.signal();
        }
        Ok(Empty::new())
    }
}

/// runc's `SystemdCgroup` among a create request's options, when they are runc's
/// (`containerd.runc.v1.Options`, as `ctr --runc-systemd-cgroup` and containerd's runc
/// configuration send them); other option types say nothing about it.
fn systemd_cgroup_option(
    options: Option<&containerd_shim::protos::protobuf::well_known_types::any::Any>,
) -> Result<bool> {
    use containerd_shim::protos::protobuf::Message;
    use containerd_shim::protos::shim::oci::Options;
    let Some(any) = options.filter(|a| a.type_url.ends_with("containerd.runc.v1.Options")) else {
        return Ok(false);
    };
    Options::parse_from_bytes(&any.value)
        .map(|o| o.systemd_cgroup)
        .map_err(|e| Error::InvalidArgument(format!("runtime options ({}): {e}", any.type_url)))
}

/// The Belayer restore options a task was created with (its spec's annotation), if any.
fn restore_options(spec: &crate::spec::Spec) -> Result<Option<crate::api::RestoreOptions>> {
    match spec.annotation(crate::api::RESTORE_ANNOTATION) {
        Some(text) => serde_json::from_str(text).map(Some).map_err(|e| {
            Error::InvalidArgument(format!(
                "invalid {} annotation: {e}",
                crate::api::RESTORE_ANNOTATION
            ))
        }),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::systemd_cgroup_option;
    use containerd_shim::protos::protobuf::Message;
    use containerd_shim::protos::protobuf::well_known_types::any::Any;
    use containerd_shim::protos::shim::oci::Options;

    fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    #[test]
    fn runcs_systemd_cgroup_option_is_read() {
        let on = Options {
            systemd_cgroup: true,
            ..Default::default()
        };
        let bytes = on.write_to_bytes().unwrap();
        assert!(
            systemd_cgroup_option(Some(&any("containerd.runc.v1.Options", bytes.clone()))).unwrap()
        );
        assert!(!systemd_cgroup_option(Some(&any("containerd.runc.v1.Options", vec![]))).unwrap());
        // Another runtime's options type says nothing about it.
        assert!(!systemd_cgroup_option(Some(&any("runtimeoptions.v1.Options", bytes))).unwrap());
        assert!(!systemd_cgroup_option(None).unwrap());
        let bad = systemd_cgroup_option(Some(&any("containerd.runc.v1.Options", vec![0xff])))
            .unwrap_err();
        assert!(bad.to_string().contains("runtime options"), "{bad}");
    }
}
