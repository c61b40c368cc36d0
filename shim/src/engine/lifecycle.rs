//! A container's life as containerd's task API drives it: create (a plain start, or a restore
//! from a Belayer checkpoint or runc's images), start, exec, kill, delete, state, pause and
//! resume, pids, stats, update; and the exit monitors that record and publish each exit.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use containerd_shim::protos::api::{
    CreateTaskRequest, CreateTaskResponse, DeleteRequest, DeleteResponse, ExecProcessRequest,
    PidsResponse, ProcessInfo, StartRequest, StartResponse, StateRequest, StateResponse,
    StatsResponse, Status, UpdateTaskRequest, WaitResponse,
};
use containerd_shim::protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::protos::shim::oci::ProcessDetails;
use containerd_shim::protos::topics::*;
use log::info;
use tokio::sync::Mutex;

use super::{EXEC_NOT_STARTED, Engine, Entry};
use crate::container::{self, Container, PendingRestore};
use crate::error::{Error, Result, task};
use crate::export::Imported;
use crate::process::{self, DRAIN_LIMIT, Exit, Process};
use crate::reaper;
use crate::stdio::StdioPaths;

/// How long State waits for a container that a checkpoint or restore holds before it answers
/// with the last state it reported. containerd gives State 2 s; a checkpoint's frozen window on a
/// loaded node, or one waiting for a lazy restore's memory fill, can hold the container longer,
/// and `ctr tasks ls` would show it UNKNOWN with pid 0. The container's state does not change
/// while it is held: its exits and execs wait for the same lock.
pub(super) const STATE_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

impl Engine {
    /// Watches `pid`; when it exits, drains its output, records the exit and publishes it.
    pub(super) fn monitor(self: &Arc<Self>, id: &str, exec_id: &str, pid: u32) {
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
                            belayer_api::annotations::RECOVERED_TOPIC,
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

    /// Creates task `req.id`; the caller serves its control socket once this returns.
    pub async fn create(self: &Arc<Self>, req: CreateTaskRequest) -> Result<CreateTaskResponse> {
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
            let exe = std::env::current_exe().map_err(crate::error::io("find the shim binary"))?;
            crate::netns::install_hook(&mut spec, &exe)?;
            Ok::<_, Error>((spec, systemd))
        })
        .await
        .map_err(task("CRIU configuration"))??;
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
        c.policy =
            belayer_api::ContainerPolicy::from_annotations(|k| spec.annotation(k), &self.settings);
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

    pub async fn start(self: &Arc<Self>, req: StartRequest) -> Result<StartResponse> {
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

    pub async fn exec(&self, req: ExecProcessRequest) -> Result<()> {
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

    /// Deletes an exec, or the container; the caller removes its control socket.
    pub async fn delete(&self, req: DeleteRequest) -> Result<DeleteResponse> {
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

    pub async fn state(&self, req: StateRequest) -> Result<StateResponse> {
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

    pub async fn pause_resume(&self, id: &str, pause: bool) -> Result<()> {
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

    pub async fn pids(&self, id: &str) -> Result<PidsResponse> {
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

    pub async fn stats(&self, id: &str) -> Result<StatsResponse> {
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
            .map_err(task("collect metrics"))??;
        Ok(StatsResponse {
            stats: MessageField::some(any),
            ..Default::default()
        })
    }

    pub async fn update(&self, req: UpdateTaskRequest) -> Result<()> {
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

    /// Signals an exec, or the init (and with `all`, every process of the container).
    pub async fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let shared = self.get(id)?;
        let mut c = shared.lock().await;
        c.kill(&self.runc, exec_id, signal, all).await?;
        // Still under the lock: the init's monitor sees the death as intended.
        if exec_id.is_empty() {
            c.note_signal(signal, all);
        }
        Ok(())
    }

    /// Waits for a process's exit.
    pub async fn wait(&self, id: &str, exec_id: &str) -> Result<WaitResponse> {
        let rx = {
            let shared = self.get(id)?;
            let c = shared.lock().await;
            c.process(exec_id)?.subscribe()
        };
        let exit = process::wait_exit(rx)
            .await
            .ok_or_else(|| Error::FailedPrecondition(format!("container {id} went away")))?;
        Ok(WaitResponse {
            exit_status: exit.status,
            exited_at: MessageField::some(exit.at),
            ..Default::default()
        })
    }

    /// Closes a process's stdin.
    pub async fn close_io(&self, id: &str, exec_id: &str) -> Result<()> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        if let Some(pio) = &c.process(exec_id)?.io {
            pio.close_stdin();
        }
        Ok(())
    }

    /// Resizes a process's terminal.
    pub async fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let p = c.process(exec_id)?;
        if p.status == Status::STOPPED {
            return Err(Error::FailedPrecondition(
                "cannot resize a stopped container".into(),
            ));
        }
        if let Some(pio) = &p.io {
            pio.resize(width, height)?;
        }
        Ok(())
    }

    /// The pid of container `id`'s init, 0 when there is none.
    pub async fn task_pid(&self, id: &str) -> u32 {
        match self.get(id) {
            Ok(c) => c.lock().await.init.pid,
            Err(_) => 0,
        }
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
        .map_err(|source| Error::RuntimeOptions {
            type_url: any.type_url.clone(),
            source,
        })
}

/// The Belayer restore options a task was created with (its spec's annotation), if any.
fn restore_options(spec: &crate::spec::Spec) -> Result<Option<belayer_api::RestoreOptions>> {
    match spec.annotation(belayer_api::RESTORE_ANNOTATION) {
        Some(text) => serde_json::from_str(text)
            .map(Some)
            .map_err(|source| Error::Annotation {
                name: belayer_api::RESTORE_ANNOTATION,
                source,
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

    pub(super) fn any(type_url: &str, value: Vec<u8>) -> Any {
        let mut a = Any::new();
        a.type_url = type_url.into();
        a.value = value;
        a
    }

    #[test]
    pub(super) fn runcs_systemd_cgroup_option_is_read() {
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
