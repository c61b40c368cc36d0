//! A container: its bundle, the rootfs the shim mounted, its init and its execs, and the runc
//! operations on them. Callers hold the container's lock across each operation, which keeps a
//! process's start and exit in order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use containerd_shim::protos::api::Status;
use log::warn;

use crate::error::{Error, Result, io};
use crate::process::Process;
use crate::runc::{Runc, StartOpts};
use crate::stdio::{PendingIo, ProcessIo, StdioPaths};

/// How long an exec waits for the shim to see an init's death it has not seen yet (then it goes
/// on, and meets the dead container).
const UNSEEN_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub struct Container {
    pub id: String,
    pub bundle: PathBuf,
    /// The rootfs path the spec names (its overlay is what checkpoints capture and restores
    /// replace).
    pub rootfs: PathBuf,
    /// runc manages the container's cgroup through systemd (`--systemd-cgroup`): the runtime
    /// option `SystemdCgroup`, or a cgroups path in systemd's form. Restores need it too.
    pub systemd_cgroup: bool,
    /// The rootfs the shim mounted (containerd's mounts, or a checkpoint's chain); none when the
    /// spec names one mounted by someone else.
    pub mounted_rootfs: Option<PathBuf>,
    pub init: Process,
    pub execs: HashMap<String, Process>,
    /// The filesystem a checkpoint captures; found on first use.
    pub fs: Option<FsState>,
    /// Whether a checkpoint or restore runs; the shim's table holds it too, for callers
    /// without the container's lock ([`crate::busy::BusySlot`]).
    pub busy: crate::busy::BusySlot,
    /// Held from the moment the init is seen dead, in a container that recovers from crashes,
    /// until its recovery has ended either way: an exec waits for it rather than meet a dead
    /// container ([`Container::after_recovery`]).
    pub recovery: Arc<tokio::sync::Mutex<()>>,
    /// What to restore at start instead of running the spec's process.
    pub pending_restore: Option<PendingRestore>,
    /// The lease on the checkpoints whose layers the mounted rootfs stacks on (dropped once it
    /// is unmounted): nobody removes them from under the container.
    pub lease: Option<criu_bridge::store::Lease>,
    /// Belayer's own upper/work dirs of a restored rootfs, removed at delete.
    pub owned_upper: Option<PathBuf>,
    /// The checkpoints whose layers the mounted rootfs stacks (kept while mounted).
    pub mount_chain: Vec<u64>,
    pub policy: belayer_api::ContainerPolicy,
    pub journal: crate::journal::Journal,
    /// Where the journal stands after the last restore.
    pub position: Option<belayer_api::Position>,
    pub recoveries: Vec<belayer_api::Recovery>,
    /// Its init's death is intended, no crash to recover from: containerd sent it a stopping
    /// signal, an exit-mode checkpoint ends it, or the task is being deleted.
    pub killed: bool,
    /// Other signals containerd sent init (a bit per signal, [`signal_bit`]): a death by one of
    /// them was asked for too; the init may also live on (a reload on SIGHUP, say).
    pub signalled: u64,
    /// The task is deleted: no restore may bring it back.
    pub deleted: bool,
    /// The daemon still filling memory after a lazy restore; a checkpoint waits for it (a dump
    /// would see the pages not yet filled as absent), without holding the container.
    pub lazy_fill: Option<Arc<criu_bridge::lazy::LazyPages>>,
    /// Why the shim last killed the container itself: the memory fill of a lazy restore died.
    pub fill_failure: Option<String>,
    /// The exec'd processes the last checkpoint warned it does not hold.
    pub uncaptured_warned: Vec<criu_bridge::UncapturedExec>,
    /// The automatic replication of its checkpoints (`io.belayer.replicate`).
    pub replication: Replication,
    /// When this shim created it (its task), nanoseconds since the Unix epoch.
    pub created_unix_ns: i128,
}

/// Where a container's automatic replication stands; the engine's pusher runs it.
#[derive(Default)]
pub struct Replication {
    /// The newest checkpoint asked to go up and not taken by the pusher yet.
    pub wanted: Option<u64>,
    /// A pusher runs for the container.
    pub running: bool,
    /// The newest checkpoint replicated.
    pub newest: Option<u64>,
    /// What the status reports (`behind` is filled in from the store when asked).
    pub report: belayer_api::ReplicationStatus,
}

/// What a task created from a checkpoint restores at start.
pub enum PendingRestore {
    /// A Belayer checkpoint, verified and leased.
    Belayer(Box<criu_bridge::Checkpoint>, criu_bridge::store::Lease),
    /// runc's CRIU images alone, restored onto the task's own rootfs.
    Runc(crate::export::RuncImages),
}

/// What the next checkpoint captures and stacks on.
#[derive(Clone, Debug)]
pub struct FsState {
    /// The overlay's upper dir.
    pub upper: PathBuf,
    /// Lower dirs below the checkpoint chain, newest first.
    pub image_lowers: Vec<PathBuf>,
    /// The checkpoint the current upper descends from.
    pub parent: Option<criu_bridge::Checkpoint>,
    /// The rootfs mount is shared (see [`crate::rootfs::Overlay::shared`]).
    pub rootfs_shared: bool,
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
    let (stdio, pending) = PendingIo::new(paths)?;
    let opts = StartOpts {
        pid_file: &pid_file,
        console_socket: pending.console_socket(),
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
        .map_err(|source| Error::BadPid {
            path: pid_file.clone(),
            source,
        })?;
    Ok((pid, pending.finish(paths)?))
}

/// The bit of signal `n` (1 to 64) in [`Container::signalled`].
fn signal_bit(n: u32) -> Option<u64> {
    (1..=64).contains(&n).then(|| 1 << (n - 1))
}

impl Container {
    pub fn new(id: &str, bundle: PathBuf, init: Process, journal: crate::journal::Journal) -> Self {
        Self {
            mount_chain: Vec::new(),
            policy: Default::default(),
            journal,
            position: None,
            recoveries: Vec::new(),
            killed: false,
            signalled: 0,
            deleted: false,
            lazy_fill: None,
            fill_failure: None,
            uncaptured_warned: Vec::new(),
            replication: Replication::default(),
            created_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or_default()),
            id: id.to_string(),
            rootfs: bundle.join("rootfs"),
            systemd_cgroup: false,
            bundle,
            mounted_rootfs: None,
            init,
            execs: HashMap::new(),
            fs: None,
            busy: Default::default(),
            recovery: Arc::default(),
            pending_restore: None,
            lease: None,
            owned_upper: None,
        }
    }

    /// Locks `shared` once no recovery of its init is under way, nor about to start: an init
    /// that died (or is dying) before the shim saw it is waited for, up to [`UNSEEN_EXIT_WAIT`].
    pub async fn after_recovery(
        shared: &tokio::sync::Mutex<Self>,
    ) -> tokio::sync::MutexGuard<'_, Self> {
        let since = std::time::Instant::now();
        loop {
            let c = shared.lock().await;
            let gate = c.recovery.clone();
            if gate.try_lock().is_ok() {
                if !c.init_died_unseen() || since.elapsed() > UNSEEN_EXIT_WAIT {
                    return c;
                }
                drop(c);
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
            drop(c);
            drop(gate.lock().await);
        }
    }

    /// A death of its init now could be recovered: recovery is on, the init was started, and
    /// its death is not intended ([`Container::killed`]).
    pub fn recovers(&self) -> bool {
        self.policy.recover && !self.killed && !self.deleted && self.init.status != Status::CREATED
    }

    /// [`Container::recovers`] for a death with `exit_status`: not one by a signal containerd
    /// sent it.
    pub fn recovers_from(&self, exit_status: u32) -> bool {
        let by_signal = exit_status
            .checked_sub(128)
            .and_then(signal_bit)
            .is_some_and(|bit| self.signalled & bit != 0);
        self.recovers() && !by_signal
    }

    /// Notes a signal containerd sent init, once it was delivered: a stopping one (or one to
    /// every process) makes its death intended; another makes only a death by it intended.
    pub fn note_signal(&mut self, signal: u32, all: bool) {
        const STOPPING: [i32; 4] = [libc::SIGKILL, libc::SIGTERM, libc::SIGINT, libc::SIGQUIT];
        if all || STOPPING.contains(&(signal as i32)) {
            self.killed = true;
        } else if let Some(bit) = signal_bit(signal) {
            self.signalled |= bit;
        }
    }

    /// Its init, in a container that recovers from crashes, is dead or dying
    /// ([`criu_bridge::blocked::is_dead`]) but not yet recorded. The death of an init that CRIU
    /// has seized (a checkpoint under way) reaches the shim only once CRIU lets go of it; one
    /// killed while frozen dies at the thaw.
    pub fn init_died_unseen(&self) -> bool {
        self.recovers()
            && self.init.is_running()
            && self.init.pid > 0
            && criu_bridge::blocked::is_dead(self.init.pid as i32)
    }

    /// The filesystem state for a checkpoint, discovering the overlay on first use.
    pub fn fs_state(&mut self) -> Result<FsState> {
        if self.fs.is_none() {
            let o = crate::rootfs::overlay(&self.rootfs)?;
            self.fs = Some(FsState {
                upper: o.upper,
                image_lowers: o.lowers,
                rootfs_shared: o.shared,
                parent: None,
            });
        }
        Ok(self.fs.clone().expect("set above"))
    }

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
            return match runc.kill(&self.id, signal, all).await {
                // Dead, its exit not yet recorded (being drained, or a recovery deciding).
                Err(_) if criu_bridge::blocked::is_dead(p.pid as i32) => {
                    Err(Error::ProcessFinished)
                }
                r => r,
            };
        }
        let sig = nix::sys::signal::Signal::try_from(signal as i32)
            .map_err(|_| Error::InvalidArgument(format!("invalid signal {signal}")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid as i32), sig).map_err(|e| match e {
            nix::errno::Errno::ESRCH => Error::ProcessFinished,
            e => io(format!("kill pid {}", p.pid))(e.into()),
        })
    }

    /// Removes what the container left on the host: runc's state, the rootfs mount, pid files.
    pub async fn cleanup(&mut self, runc: &Runc) {
        match runc.delete(&self.id, true).await {
            Ok(()) | Err(Error::RuncNoContainer { .. }) => {}
            Err(e) => warn!("runc delete {}: {e}", self.id),
        }
        if let Some(rootfs) = &self.mounted_rootfs {
            crate::rootfs::unmount(rootfs);
        }
        self.lease = None;
        // Runc images that are containerd's to discard go with it.
        self.pending_restore = None;
        let _ = std::fs::remove_file(self.bundle.join("init.pid"));
        if let Some(dir) = &self.owned_upper {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::journal::Journal;

    /// A container whose init runs, with recovery on; no runc, no root.
    fn running(dir: &Path) -> Container {
        let mut c = Container::new(
            "c",
            dir.join("bundle"),
            Process::new("", StdioPaths::default()),
            Journal::open(dir.join("journal"), "c"),
        );
        c.policy.recover = true;
        c.init.pid = 1;
        c.init.status = Status::RUNNING;
        c
    }

    #[test]
    fn a_death_on_its_own_is_recovered_an_intended_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let c = running(dir.path());
        assert!(c.recovers_from(1));
        assert!(c.recovers_from(128 + libc::SIGSEGV as u32));
        // Recovery off, or the init never started: no recovery.
        let mut off = running(dir.path());
        off.policy.recover = false;
        assert!(!off.recovers_from(1));
        let mut created = running(dir.path());
        created.init.status = Status::CREATED;
        assert!(!created.recovers_from(1));
        // Deleted: nothing brings it back.
        let mut deleted = running(dir.path());
        deleted.deleted = true;
        assert!(!deleted.recovers_from(1));
    }

    #[test]
    fn a_stopping_signal_makes_any_death_intended_another_only_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = running(dir.path());
        c.note_signal(libc::SIGUSR1 as u32, false);
        assert!(!c.recovers_from(128 + libc::SIGUSR1 as u32));
        assert!(c.recovers_from(128 + libc::SIGSEGV as u32));
        assert!(c.recovers_from(1));
        for stopping in [libc::SIGKILL, libc::SIGTERM, libc::SIGINT, libc::SIGQUIT] {
            let mut c = running(dir.path());
            c.note_signal(stopping as u32, false);
            assert!(!c.recovers_from(1), "signal {stopping}");
        }
        // Any signal to every process.
        let mut all = running(dir.path());
        all.note_signal(libc::SIGUSR1 as u32, true);
        assert!(!all.recovers_from(1));
        // Out-of-range signals and statuses are no signal.
        let mut odd = running(dir.path());
        odd.note_signal(0, false);
        odd.note_signal(65, false);
        assert!(odd.recovers_from(128));
        assert!(odd.recovers_from(128 + 65));
    }
}
