//! A container: its bundle, the rootfs the shim mounted, its init and its execs, and the runc
//! operations on them. Callers hold the container's lock across each operation, which keeps a
//! process's start and exit in order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use containerd_shim::protos::api::{Mount, Status};
use log::warn;

use crate::error::{Error, Result, io};
use crate::process::Process;
use crate::runc::{Runc, StartOpts};
use crate::stdio::{ConsoleSocket, ProcessIo, StdioPaths};

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    /// The rootfs the shim mounted from containerd's mounts (none when the spec names one).
    pub mounted_rootfs: Option<PathBuf>,
    pub init: Process,
    pub execs: HashMap<String, Process>,
}

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs`, in order.
pub async fn mount_rootfs(bundle: &Path, mounts: &[Mount]) -> Result<Option<PathBuf>> {
    if mounts.is_empty() {
        return Ok(None);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target).map_err(io(format!("create {}", target.display())))?;
    for m in mounts {
        if let Err(source) = containerd_shim::util::mount_rootfs(m, &target).await {
            unmount_rootfs(&target);
            return Err(Error::Shim {
                context: format!(
                    "mount rootfs ({} from {}) at {}",
                    m.type_,
                    m.source,
                    target.display()
                ),
                source,
            });
        }
    }
    Ok(Some(target))
}

/// Unmounts everything at and below `target`.
pub fn unmount_rootfs(target: &Path) {
    if let Err(e) = containerd_shim::mount::umount_recursive(target.to_str(), libc::MNT_DETACH) {
        warn!("unmount {}: {e}", target.display());
    }
}

/// Starts a process through runc (`create` for an init, `exec` for others) with its streams
/// wired to containerd's paths. Returns its pid and the shim's side of its streams.
pub async fn spawn_process(
    runc: &Runc,
    id: &str,
    bundle: &Path,
    paths: &StdioPaths,
    exec: Option<&Path>,
) -> Result<(u32, ProcessIo)> {
    let pid_file = match exec {
        None => bundle.join("init.pid"),
        Some(spec) => spec.with_extension("pid"),
    };
    let console = if paths.terminal {
        Some(ConsoleSocket::new()?)
    } else {
        None
    };
    let (stdio, pipes) = if paths.terminal {
        (Default::default(), None)
    } else {
        let (stdio, pio) = ProcessIo::pipes(paths)?;
        (stdio, Some(pio))
    };
    let opts = StartOpts {
        pid_file: &pid_file,
        console_socket: console.as_ref().map(|c| c.path.as_path()),
        stdio,
    };
    match exec {
        None => runc.create(id, bundle, opts).await?,
        Some(spec) => runc.exec(id, spec, opts).await?,
    }
    let pid = std::fs::read_to_string(&pid_file)
        .map_err(io(format!("read {}", pid_file.display())))?
        .trim()
        .parse::<u32>()
        .map_err(|e| {
            Error::FailedPrecondition(format!("bad pid in {}: {e}", pid_file.display()))
        })?;
    let pio = match (pipes, console) {
        (Some(pio), _) => pio,
        (None, Some(console)) => ProcessIo::terminal(paths, &console)?,
        (None, None) => unreachable!("a process has pipes or a terminal"),
    };
    Ok((pid, pio))
}

impl Container {
    pub fn process(&self, exec_id: &str) -> Result<&Process> {
        if exec_id.is_empty() {
            return Ok(&self.init);
        }
        self.execs.get(exec_id).ok_or_else(|| Error::ExecNotFound {
            id: self.id.clone(),
            exec_id: exec_id.to_string(),
        })
    }

    pub fn process_mut(&mut self, exec_id: &str) -> Result<&mut Process> {
        if exec_id.is_empty() {
            return Ok(&mut self.init);
        }
        let id = self.id.clone();
        self.execs
            .get_mut(exec_id)
            .ok_or_else(|| Error::ExecNotFound {
                id,
                exec_id: exec_id.to_string(),
            })
    }

    /// Where an exec's process spec is written for `runc exec --process`.
    pub fn exec_spec_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.json"))
    }

    /// Sends `signal` to a process. Signalling a finished process is NOT_FOUND, as with runc-v2.
    pub async fn kill(&self, runc: &Runc, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let p = self.process(exec_id)?;
        if p.status == Status::STOPPED || (p.pid == 0 && !exec_id.is_empty()) {
            return Err(Error::ProcessFinished);
        }
        if exec_id.is_empty() {
            return runc.kill(&self.id, signal, all).await;
        }
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| Error::InvalidArgument(format!("invalid signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid as i32), sig).map_err(|e| match e {
            nix::errno::Errno::ESRCH => Error::ProcessFinished,
            e => io(format!("kill pid {}", p.pid))(e.into()),
        })
    }

    /// Removes what the container left on the host: runc's state, the rootfs mount, pid files.
    pub async fn cleanup(&self, runc: &Runc) {
        if let Err(e) = runc.delete(&self.id, true).await
            && !e.to_string().contains("does not exist")
        {
            warn!("runc delete {}: {e}", self.id);
        }
        if let Some(rootfs) = &self.mounted_rootfs {
            unmount_rootfs(rootfs);
        }
        let _ = std::fs::remove_file(self.bundle.join("init.pid"));
    }
}
