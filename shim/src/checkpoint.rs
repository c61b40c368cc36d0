//! Full checkpoint and restore of a running container, as the control API and containerd's
//! `Checkpoint` RPC ask for them: processes (CRIU through runc) and filesystem layer at one
//! instant ([`criu_bridge::checkpoint_container`]), restore in place, restore at task start (forks,
//! containers without a task).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use containerd_shim::protos::api::Status;
use criu_bridge::runc::CriuOptions;
use criu_bridge::store::Lease;
use criu_bridge::{Checkpoint, CheckpointError, RestoreError, Store};
use log::info;

use crate::api::{CheckpointInfo, RestoreInfo};
use crate::container::{Container, FsState, PendingRestore};
use crate::error::{Error, Result, io};
use crate::stdio::PendingIo;
use crate::task::Inner;

/// A checkpoint whose filesystem chain grows past this many layers is compacted into one.
pub const COMPACT_CHAIN_AT: usize = 16;

/// How long a checkpoint waits for the memory fill of a lazy restore to finish.
const LAZY_FILL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Whether a checkpoint or restore of a container is under way, and whether it is the shim's
/// own (an automatic checkpoint, a recovery), which a request waits for rather than fail on.
/// Read without the container's lock, which a restore holds for as long as it runs.
#[derive(Clone, Default)]
pub struct BusySlot {
    held: Arc<tokio::sync::Mutex<()>>,
    /// Set by each taker once it holds `held`: who holds it now.
    automatic: Arc<AtomicBool>,
}

/// Marks a container busy with a checkpoint or restore for as long as it lives.
pub struct Busy {
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl BusySlot {
    /// For a request (the control API's checkpoint or restore of container `id`): another
    /// request's checkpoint or restore under way is an error; the shim's own is waited for.
    pub async fn request(&self, id: &str) -> Result<Busy> {
        match self.try_take(false) {
            Some(busy) => Ok(busy),
            None if self.automatic.load(Ordering::Acquire) => Ok(self.take(false).await),
            None => Err(Error::InProgress(id.to_string())),
        }
    }

    /// For the shim's own checkpoint of container `id`: now, or an error.
    pub fn automatic(&self, id: &str) -> Result<Busy> {
        self.try_take(true)
            .ok_or_else(|| Error::InProgress(id.to_string()))
    }

    /// For the shim's own work that must not be skipped — the automatic recovery, where an
    /// error would lose the container, and retention's deletes and compactions: once whatever
    /// is under way has ended.
    pub async fn when_free(&self) -> Busy {
        self.take(true).await
    }

    fn try_take(&self, automatic: bool) -> Option<Busy> {
        let _held = self.held.clone().try_lock_owned().ok()?;
        self.automatic.store(automatic, Ordering::Release);
        Some(Busy { _held })
    }

    async fn take(&self, automatic: bool) -> Busy {
        let _held = self.held.clone().lock_owned().await;
        self.automatic.store(automatic, Ordering::Release);
        Busy { _held }
    }
}

impl From<CheckpointError> for Error {
    fn from(e: CheckpointError) -> Self {
        match e {
            CheckpointError::InProgress(id) => Error::InProgress(id),
            CheckpointError::DiskFull { path } => Error::DiskFull(format!(
                "disk full while writing checkpoint {}; nothing was kept",
                path.display()
            )),
            e @ CheckpointError::Blocked { .. } => Error::Blocked(e.to_string()),
            e @ CheckpointError::Unsupported { .. } => Error::Unsupported(e.to_string()),
            e @ CheckpointError::Stalled { .. } => Error::Stalled(e.to_string()),
            CheckpointError::NotRunning { id, status } => {
                Error::FailedPrecondition(format!("container {id} is {status}, not running"))
            }
            e => Error::Checkpoint(chain(&e)),
        }
    }
}

impl From<RestoreError> for Error {
    fn from(e: RestoreError) -> Self {
        match &e {
            RestoreError::Verify { .. } => Error::Corrupt(chain(&e)),
            RestoreError::Load(criu_bridge::store::StoreError::NotFound { .. }) => {
                Error::CheckpointNotFound(chain(&e))
            }
            RestoreError::Load(_) => Error::Corrupt(chain(&e)),
            RestoreError::Privilege { source, .. } => match **source {
                criu_bridge::criu::PrivilegeError::Image(_) => Error::Corrupt(chain(&e)),
                _ => Error::FailedPrecondition(chain(&e)),
            },
            _ => Error::Checkpoint(chain(&e)),
        }
    }
}

impl From<criu_bridge::store::StoreError> for Error {
    fn from(e: criu_bridge::store::StoreError) -> Self {
        use criu_bridge::store::StoreError as S;
        match &e {
            S::NotFound { .. } => Error::CheckpointNotFound(chain(&e)),
            S::InChain { .. } | S::UsedAsLower { .. } | S::InUse { .. } => {
                Error::FailedPrecondition(chain(&e))
            }
            S::InProgress { .. } => Error::InProgress(chain(&e)),
            S::DiskFull { .. } => Error::DiskFull(chain(&e)),
            S::Format(_) => Error::Corrupt(chain(&e)),
            _ => Error::Checkpoint(chain(&e)),
        }
    }
}

/// An error and its sources as one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

impl Inner {
    pub(crate) fn bridge_runc(&self) -> criu_bridge::runc::Runc {
        let mut r = criu_bridge::runc::Runc::new(crate::service::runc_root(&self.namespace));
        r.criu = self.settings.criu.clone();
        r.spawner = Arc::new(crate::reaper::ReaperSpawner);
        r
    }

    /// Checkpoints container `id` (processes and filesystem at one instant). A checkpoint or
    /// restore that another request runs is an error, not a wait ([`BusySlot::request`]).
    pub async fn checkpoint(self: &Arc<Self>, id: &str, exit: bool) -> Result<CheckpointInfo> {
        let shared = self.get(id)?;
        let _busy = self.busy(id)?.request(id).await?;
        // The busy flag keeps restores out, so no new fill can start meanwhile.
        self.settle_lazy_fill(&shared, id).await?;
        let c = shared.lock().await;
        self.checkpoint_locked(&shared, c, id, exit, false).await
    }

    /// Checkpoints container `id` once its lock is free (an exit being recorded, an exec
    /// starting): the automatic path. It yields ([`Error::Blocked`]) rather than keep the
    /// container frozen for a task that cannot be stopped now, or wait for the memory fill of a
    /// lazy restore.
    pub async fn checkpoint_when_free(self: &Arc<Self>, id: &str) -> Result<CheckpointInfo> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let _busy = c.busy.automatic(id)?;
        self.checkpoint_locked(&shared, c, id, false, true).await
    }

    /// Waits, without holding the container, for the memory fill of its last lazy restore to
    /// finish: pages not yet filled would look absent to a dump. Up to [`LAZY_FILL_WAIT`].
    async fn settle_lazy_fill(
        &self,
        shared: &tokio::sync::Mutex<Container>,
        id: &str,
    ) -> Result<()> {
        let Some(fill) = shared.lock().await.lazy_fill.clone() else {
            return Ok(());
        };
        let waiting = fill.clone();
        let done = tokio::task::spawn_blocking(move || waiting.wait(LAZY_FILL_WAIT))
            .await
            .map_err(|e| Error::Checkpoint(format!("waiting for the lazy-pages daemon: {e}")))?;
        if !done {
            return Err(Error::FailedPrecondition(format!(
                "container {id}: the memory of its last (lazy) restore is still being filled by \
                 criu lazy-pages (pid {}) after {LAZY_FILL_WAIT:?}; try again",
                fill.pid()
            )));
        }
        let mut c = shared.lock().await;
        if c.lazy_fill.as_ref().is_some_and(|f| Arc::ptr_eq(f, &fill)) {
            c.lazy_fill = None;
        }
        Ok(())
    }

    async fn checkpoint_locked(
        self: &Arc<Self>,
        shared: &tokio::sync::Mutex<Container>,
        c: tokio::sync::MutexGuard<'_, Container>,
        id: &str,
        exit: bool,
        yield_to_blocked: bool,
    ) -> Result<CheckpointInfo> {
        if !c.init.is_running() {
            return Err(Error::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let mut c = c;
        // A requested checkpoint has waited for the fill already; an automatic one does not wait.
        // A finished daemon is forgotten.
        match c.lazy_fill.as_ref().map(|f| (f.is_done(), f.pid())) {
            Some((false, pid)) => {
                let why = format!(
                    "container {id}: criu lazy-pages (pid {pid}) is still filling the memory of \
                     its last restore"
                );
                return Err(if yield_to_blocked {
                    Error::Blocked(why)
                } else {
                    Error::FailedPrecondition(why)
                });
            }
            Some((true, _)) => c.lazy_fill = None,
            None => {}
        }
        let mut fs = c.fs_state()?;
        // Retention may have compacted the parent since (its chain is now just itself).
        if let Some(p) = fs
            .parent
            .as_ref()
            .filter(|p| p.manifest.container == id && p.manifest.namespace == self.namespace)
        {
            fs.parent = Some(
                self.settings
                    .store()
                    .load(&self.namespace, id, p.manifest.seq)?,
            );
        }
        let position = c.journal.completed();
        // CRIU dumps init's tree; an exec'd process is the shim's child, outside the container.
        let uncaptured: Vec<criu_bridge::UncapturedExec> = c
            .execs
            .values()
            .filter(|p| p.is_running())
            .map(|p| criu_bridge::UncapturedExec {
                exec_id: p.exec_id.clone(),
                pid: p.pid,
            })
            .collect();
        // Once per set: automatic checkpoints beside a long-running exec would repeat it each turn.
        if !uncaptured.is_empty() && c.uncaptured_warned != uncaptured {
            log::warn!(
                "container {id}: the checkpoint does not hold exec'd processes still running \
                 (a restore will not have them): {uncaptured:?}"
            );
        }
        c.uncaptured_warned = uncaptured.clone();
        let (runc, store, ns, cid, bundle) = (
            self.bridge_runc(),
            self.settings.store(),
            self.namespace.clone(),
            id.to_string(),
            c.bundle.clone(),
        );
        let init_pid = c.init.pid as i32;
        let frozen_limit = self.settings.frozen_limit();
        let started = Instant::now();
        // An exit-mode checkpoint ends the container on purpose: no recovery brings it back.
        let was_killed = c.killed;
        c.killed |= exit;
        let (thawed_tx, thawed_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::task::spawn_blocking(move || {
            let mut thawed_tx = Some(thawed_tx);
            criu_bridge::checkpoint_container_with(
                &criu_bridge::CheckpointRequest {
                    runc: &runc,
                    store: &store,
                    namespace: &ns,
                    id: &cid,
                    bundle: &bundle,
                    upper_dir: &fs.upper,
                    image_lowers: &fs.image_lowers,
                    rootfs_shared: fs.rootfs_shared,
                    parent: fs.parent.as_ref(),
                    leave_running: !exit,
                    uncaptured_execs: &uncaptured,
                    criu: CriuOptions::default(),
                    yield_to_blocked,
                    frozen_limit,
                },
                &mut || {
                    if let Some(tx) = thawed_tx.take() {
                        let _ = tx.send(());
                    }
                },
            )
            .map_err(Error::from)
        });
        // The container is ours until it runs again; hashing and writing the checkpoint do not
        // need it, so execs go on meanwhile (the busy flag still keeps other checkpoints out).
        let _ = thawed_rx.await;
        let frozen = started.elapsed();
        drop(c);
        let cp = match task
            .await
            .map_err(|e| Error::Checkpoint(format!("checkpoint task: {e}")))?
        {
            Ok(cp) => cp,
            // The container died under the checkpoint (an exit-mode one ends it on purpose):
            // say so, not only what CRIU said of the dead tasks it met.
            Err(e) if !exit && criu_bridge::blocked::is_dead(init_pid) => {
                return Err(Error::FailedPrecondition(format!(
                    "container {id} died during the checkpoint; nothing was kept ({e})"
                )));
            }
            Err(e) => {
                if exit && !criu_bridge::blocked::is_dead(init_pid) {
                    shared.lock().await.killed = was_killed;
                }
                return Err(e);
            }
        };
        info!(
            "container {id} checkpoint {} taken in {:?} (container held {frozen:?})",
            cp.manifest.seq,
            started.elapsed()
        );
        let mut c = shared.lock().await;
        if let Some(fs) = c.fs.as_mut() {
            fs.parent = Some(cp.clone());
        }
        c.journal.checkpointed(cp.manifest.seq, position);
        let info = CheckpointInfo::from(&cp);
        // Long chains cost lookups and approach overlay's lower-dir limit: fold this one into a
        // single layer, in the background, unless the mounted rootfs stacks on its layer.
        if cp.manifest.fs_chain.len() > COMPACT_CHAIN_AT
            && !c.mount_chain.contains(&cp.manifest.seq)
            && let Ok(slot) = self.busy(id)
        {
            let (store, ns, cid, seq) = (
                self.store(),
                self.namespace.clone(),
                id.to_string(),
                cp.manifest.seq,
            );
            // Busy while it merges (it holds the store's container lock, which a checkpoint
            // needs): a checkpoint request waits for it instead of failing.
            tokio::spawn(async move {
                let busy = slot.when_free().await;
                let _ = tokio::task::spawn_blocking(move || {
                    let _busy = busy;
                    match store.compact(&ns, &cid, seq) {
                        Ok(_) => {}
                        // A later checkpoint came first and stacks on it: that one is
                        // compacted in turn.
                        Err(criu_bridge::store::CompactCheckpointError::Store(
                            e @ criu_bridge::store::StoreError::InChain { .. },
                        )) => info!("container {cid}: checkpoint {seq} left as it is: {e}"),
                        Err(e) => log::warn!(
                            "container {cid}: compacting checkpoint {seq}: {}",
                            chain(&e)
                        ),
                    }
                })
                .await;
            });
        }
        Ok(info)
    }

    pub fn list_checkpoints(&self, id: &str) -> Result<Vec<CheckpointInfo>> {
        let store = self.settings.store();
        let seqs = store.list(&self.namespace, id)?;
        seqs.into_iter()
            .map(|s| Ok(CheckpointInfo::from(&store.load(&self.namespace, id, s)?)))
            .collect()
    }

    pub fn inspect_checkpoint(&self, id: &str, seq: u64) -> Result<CheckpointInfo> {
        Ok(CheckpointInfo::from(&self.settings.store().load(
            &self.namespace,
            id,
            seq,
        )?))
    }

    pub async fn delete_checkpoint(&self, id: &str, seq: u64) -> Result<()> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        if c.fs
            .as_ref()
            .and_then(|f| f.parent.as_ref())
            .is_some_and(|p| p.manifest.seq == seq)
        {
            // The running rootfs stacks on it: the next checkpoint still needs it.
            return Err(Error::FailedPrecondition(format!(
                "checkpoint {seq} of container {id} is the base of the running container's filesystem"
            )));
        }
        let store = self.settings.store();
        let ns = self.namespace.clone();
        let cid = id.to_string();
        tokio::task::spawn_blocking(move || store.delete(&ns, &cid, seq))
            .await
            .map_err(|e| Error::Checkpoint(e.to_string()))??;
        Ok(())
    }

    /// Loads and verifies a checkpoint (sha256 of every file) before anything is touched, and
    /// leases it (and every checkpoint whose layers its rootfs stacks on) for container
    /// `holder` of this shim's namespace: none of them can be removed until the lease goes.
    async fn load_verified(
        &self,
        namespace: &str,
        id: &str,
        seq: Option<u64>,
        holder: &str,
    ) -> Result<(Checkpoint, Lease, u64)> {
        let store = self.settings.store();
        let (ns, cid, criu) = (
            namespace.to_string(),
            id.to_string(),
            self.settings.criu.clone(),
        );
        let (holder_ns, holder) = (self.namespace.clone(), holder.to_string());
        let started = Instant::now();
        let (cp, lease) = tokio::task::spawn_blocking(move || -> Result<(Checkpoint, Lease)> {
            let cp = match seq {
                Some(s) => store.load(&ns, &cid, s)?,
                None => store.latest(&ns, &cid)?.ok_or_else(|| {
                    Error::CheckpointNotFound(format!("container {cid} has no checkpoints"))
                })?,
            };
            // Before the verification: what is verified is what gets mounted.
            let lease = store.lease(&cp, (&holder_ns, &holder))?;
            // Stamped: every file whose inode, size or ctime moved since it was last hashed is hashed
            // again (any write moves ctime), the rest is trusted; Full re-reads everything.
            criu_bridge::verify(&store, &cp, criu_bridge::store::VerifyLevel::Stamped)?;
            criu_bridge::criu::check_criu_with(&crate::reaper::ReaperSpawner, &criu)
                .map_err(|e| Error::FailedPrecondition(chain(&e)))?;
            Ok((cp, lease))
        })
        .await
        .map_err(|e| Error::Checkpoint(e.to_string()))??;
        Ok((cp, lease, started.elapsed().as_millis() as u64))
    }

    /// Mounts `cp`'s rootfs for container `c` on a fresh Belayer-owned upper dir; `lease` (on
    /// `cp`'s layers) is kept while it is mounted.
    fn mount_from(
        &self,
        c: &mut Container,
        cp: &Checkpoint,
        lease: Lease,
    ) -> Result<(PathBuf, u64)> {
        let target = c.rootfs.clone();
        let uppers = self.settings.uppers(&self.namespace, &c.id);
        // A name no earlier restore of this container used: the upper being replaced may still
        // be mounted until the new one is up.
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = uppers.join(format!("g{stamp}"));
        let (upper, work) = (dir.join("upper"), dir.join("work"));
        // 0700: the upper's own root takes the mode of the container's `/`; this parent keeps
        // other users from its files (a setuid binary a container wrote, say).
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)
            .map_err(io(format!("create {}", dir.display())))?;
        let store = self.settings.store();
        let took = criu_bridge::mount_rootfs(&store, cp, &upper, &work, &target)?;
        // CRIU recreates the container's root as a slave of the rootfs mount's peer group if it
        // was one when dumped; a rootfs mounted elsewhere (a fork's, under a private parent) must
        // be shared too, or the restore fails ("Failed to copy sharing").
        if cp.manifest.rootfs_shared {
            crate::rootfs::make_shared(&target)?;
        }
        c.mounted_rootfs = Some(target);
        c.lease = Some(lease);
        c.mount_chain = if cp.manifest.container == c.id && cp.manifest.namespace == self.namespace
        {
            cp.manifest.fs_chain.clone()
        } else {
            Vec::new()
        };
        if let Some(old) = c.owned_upper.replace(dir) {
            // Its files are of no use any more; deleting them need not delay the restore.
            std::thread::spawn(move || std::fs::remove_dir_all(old));
        }
        c.fs = Some(FsState {
            upper,
            image_lowers: cp.manifest.image_lowers.clone(),
            rootfs_shared: cp.manifest.rootfs_shared,
            // A fork stacks on another container's chain: its own first checkpoint has no parent
            // and carries that chain as its lower dirs.
            parent: (cp.manifest.container == c.id && cp.manifest.namespace == self.namespace)
                .then(|| cp.clone()),
        });
        if c.fs.as_ref().is_some_and(|f| f.parent.is_none())
            && let Some(fs) = c.fs.as_mut()
        {
            fs.image_lowers = criu_bridge::rootfs_lowers(&store, cp)?;
        }
        Ok((c.bundle.join("init.pid"), took.as_millis() as u64))
    }

    /// Where `c`'s restores keep CRIU's scratch (logs, stats, the lazy-pages daemon's socket and
    /// pid file): the task's work dir that containerd links from the bundle (on containerd's
    /// disk, removed with the task; runc's shim keeps CRIU's work there too), else the store's.
    /// Not the store when it can be avoided: a restore must still work from a full store disk,
    /// and CRIU fails when it cannot write its files.
    fn restore_scratch(&self, c: &Container) -> PathBuf {
        let task_work = c.bundle.join("work");
        if task_work.is_dir() {
            task_work
        } else {
            self.settings.work(&self.namespace, &c.id)
        }
    }

    /// `runc restore` of `images` as container `c`, wiring its stdio to containerd's paths.
    async fn restore_processes(
        self: &Arc<Self>,
        c: &mut Container,
        images: Images,
        pid_file: PathBuf,
    ) -> Result<u32> {
        // Pipes are mapped onto the dumped ones; a terminal comes back as a new pty whose master
        // runc sends on the console socket (CRIU's orphan pts master).
        let (stdio, pending) = PendingIo::new(&c.init.paths)?;
        let to_std = |fd: Option<std::os::fd::OwnedFd>| fd.map(std::process::Stdio::from);
        let restore_stdio = criu_bridge::runc::RestoreStdio {
            stdin: to_std(stdio.stdin),
            stdout: to_std(stdio.stdout),
            stderr: to_std(stdio.stderr),
        };
        let console_path = pending.console_socket().map(PathBuf::from);
        let work = self
            .restore_scratch(c)
            .join(format!("restore-{}", images.label));
        let _ = std::fs::remove_dir_all(&work);
        let mut runc = self.bridge_runc();
        runc.systemd_cgroup = c.systemd_cgroup;
        let (runc, id, bundle, pf) = (runc, c.id.clone(), c.bundle.clone(), pid_file.clone());
        let lazy_mode = self.settings.lazy_restore.clone();
        let label = images.label.clone();
        let report = tokio::task::spawn_blocking(move || {
            let lazy_pages = images.lazy && lazy_restore(&lazy_mode, &runc);
            criu_bridge::restore_processes(
                &criu_bridge::RestoreRequest {
                    runc: &runc,
                    image_dir: &images.dir,
                    criu: &images.criu,
                    id: &id,
                    bundle: &bundle,
                    work_dir: &work,
                    detach: true,
                    pid_file: Some(&pf),
                    console_socket: console_path.as_deref(),
                    lazy_pages,
                },
                restore_stdio,
            )
            .map_err(Error::from)
        })
        .await
        .map_err(|e| Error::Checkpoint(e.to_string()))??;
        c.lazy_fill = report.lazy.map(Arc::new);
        let fill = c.lazy_fill.as_ref().map(|f| f.pid());
        let pio = pending.finish(&c.init.paths)?;
        let pid = std::fs::read_to_string(&pid_file)
            .map_err(io(format!("read {}", pid_file.display())))?
            .trim()
            .parse::<u32>()
            .map_err(|e| Error::Checkpoint(format!("bad pid in {}: {e}", pid_file.display())))?;
        if let Err(e) = crate::netns::loopback_up(pid) {
            log::warn!(
                "container {}: cannot bring loopback up after restore: {e}",
                c.id
            );
        }
        c.init.pid = pid;
        c.init.io = Some(pio);
        c.init.status = Status::RUNNING;
        c.init.clear_exit();
        self.monitor(&c.id, "", pid);
        if let Some(daemon) = fill {
            self.watch_fill(&c.id, pid, daemon, label);
        }
        Ok(pid)
    }

    /// Kills container `id` (init `init`) if the lazy-pages daemon `daemon`, filling the memory
    /// of its restore from `label`, ends other than by finishing: the pages it had not delivered
    /// would read as zeros once its userfaultfd is gone, and the processes would run on with
    /// holes in their memory. Killed, the container has crashed, which a container that
    /// recovers restores from; the reason shows in its status (`fill_failure`).
    fn watch_fill(self: &Arc<Self>, id: &str, init: u32, daemon: i32, label: String) {
        // The daemon left CRIU's process tree at once: it is this shim's child now (a
        // subreaper), and its exit comes through the reaper.
        let exited = crate::reaper::watch(daemon);
        let (inner, id) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            let code = exited.await.unwrap_or(255);
            if code == 0 {
                return;
            }
            let Ok(c) = inner.get(&id) else { return };
            let mut c = c.lock().await;
            if c.init.pid != init || c.init.status == Status::STOPPED {
                return;
            }
            let why = format!(
                "criu lazy-pages (pid {daemon}) ended with status {code} before it had filled \
                 the memory of the restore from checkpoint {label}; the processes' memory was incomplete, \
                 so the shim killed the container"
            );
            log::error!("container {id}: {why}");
            c.fill_failure = Some(why);
            if let Err(e) = inner.runc.kill(&id, libc::SIGKILL as u32, true).await {
                log::error!("container {id}: cannot kill it after its memory fill died: {e}");
            }
        });
    }

    /// Restores container `id` in place from checkpoint `seq` (default: newest), whether its
    /// processes are alive or dead. Everything that can be checked is checked before the
    /// running container is touched.
    ///
    /// A checkpoint or restore that another request runs is an error, not a wait
    /// ([`BusySlot::request`]).
    pub async fn restore(self: &Arc<Self>, id: &str, seq: Option<u64>) -> Result<RestoreInfo> {
        let shared = self.get(id)?;
        let busy = self.busy(id)?.request(id).await?;
        self.restore_busy(&shared, busy, id, seq).await
    }

    /// [`Inner::restore`] for a caller that has marked the container busy.
    pub async fn restore_busy(
        self: &Arc<Self>,
        shared: &tokio::sync::Mutex<Container>,
        _busy: Busy,
        id: &str,
        seq: Option<u64>,
    ) -> Result<RestoreInfo> {
        let started = Instant::now();
        let mut c = shared.lock().await;
        if c.deleted {
            return Err(Error::ContainerNotFound(id.to_string()));
        }
        let ns = self.namespace.clone();
        let (cp, lease, verify_ms) = self.load_verified(&ns, id, seq, id).await?;
        check_privilege(&cp, &c.bundle).await?;
        let t_verified = started.elapsed();
        // Point of no return: the old processes go.
        if let Err(e) = self.runc.delete(id, true).await
            && !e.to_string().contains("does not exist")
        {
            return Err(e);
        }
        let t_deleted = started.elapsed();
        if let Some(rootfs) = c.mounted_rootfs.take() {
            crate::rootfs::unmount_detached(&rootfs);
        }
        let (pid_file, mount_ms) = self.mount_from(&mut c, &cp, lease)?;
        let t_mounted = started.elapsed();
        let restore_at = Instant::now();
        let pid = self
            .restore_processes(&mut c, Images::of(&cp), pid_file)
            .await?;
        let t_restored = started.elapsed();
        c.killed = false;
        c.signalled = 0;
        let position = self.reposition(&mut c, cp.manifest.seq).await;
        log::info!(
            "container {id} restore steps: verified {t_verified:?}, deleted {t_deleted:?}, \
             mounted {t_mounted:?}, restored {t_restored:?}, repositioned {:?}",
            started.elapsed()
        );
        let info = RestoreInfo {
            position,
            container: id.to_string(),
            checkpoint: cp.manifest.seq.to_string(),
            pid,
            verify_ms,
            mount_ms,
            restore_ms: restore_at.elapsed().as_millis() as u64,
            total_ms: started.elapsed().as_millis() as u64,
            lazy_pages: c.lazy_fill.is_some(),
        };
        info!(
            "container {id} restored from checkpoint {} in {} ms",
            cp.manifest.seq, info.total_ms
        );
        Ok(info)
    }

    /// For a task created with [`RestoreOptions`](crate::api::RestoreOptions): verify the
    /// checkpoint (at create). Its rootfs is mounted at start: between the two, a restore
    /// through CRI unpacks containerd's own diff of the source's rootfs (`rootfs-diff.tar`) into
    /// the bundle's rootfs, which must land in the task's own snapshot, not on top of the
    /// checkpoint's layers (where a stale diff would overwrite them).
    pub async fn prepare_restore(
        &self,
        c: &mut Container,
        opts: &crate::api::RestoreOptions,
    ) -> Result<()> {
        let (cp, lease, _) = self
            .load_verified(
                &opts.namespace,
                &opts.container,
                Some(opts.checkpoint),
                &c.id,
            )
            .await?;
        check_privilege(&cp, &c.bundle).await?;
        c.pending_restore = Some(PendingRestore::Belayer(Box::new(cp), lease));
        Ok(())
    }

    /// Starts a task prepared by [`Inner::prepare_restore`]: mounts the checkpoint's rootfs in
    /// place of the snapshot's and restores its processes.
    pub async fn start_restored(
        self: &Arc<Self>,
        c: &mut Container,
        cp: Checkpoint,
        lease: Lease,
    ) -> Result<u32> {
        let pid_file = c.bundle.join("init.pid");
        let started = Instant::now();
        if let Some(rootfs) = c.mounted_rootfs.take() {
            crate::rootfs::unmount(&rootfs);
        }
        self.mount_from(c, &cp, lease)?;
        let pid = self.restore_processes(c, Images::of(&cp), pid_file).await?;
        log::info!(
            "container {} restored from checkpoint {} of {} at start in {:?}",
            c.id,
            cp.manifest.seq,
            cp.manifest.container,
            started.elapsed()
        );
        Ok(pid)
    }

    /// Starts a task created from runc's CRIU images (no Belayer checkpoint) as containerd's
    /// runc shim would: its processes restored onto the task's own rootfs, the snapshot
    /// containerd mounted and (for CRI) unpacked its diff into. The images are dropped after the
    /// restore, which removes them where they are containerd's to discard. From then on the
    /// container is a Belayer container like any other (its first checkpoint captures that
    /// snapshot's upper).
    pub async fn start_runc_restored(
        self: &Arc<Self>,
        c: &mut Container,
        images: crate::export::RuncImages,
    ) -> Result<u32> {
        let started = Instant::now();
        let pid_file = c.bundle.join("init.pid");
        let runc_images = Images {
            dir: images.dir.clone(),
            criu: criu_bridge::runc::CriuOptions::runc_shim(),
            label: "runc".into(),
            // CRI removes its copy of the images right after the start.
            lazy: false,
        };
        let pid = self.restore_processes(c, runc_images, pid_file).await?;
        log::info!(
            "container {} restored from runc's CRIU images in {} at start in {:?}",
            c.id,
            images.dir.display(),
            started.elapsed()
        );
        Ok(pid)
    }

    pub fn store(&self) -> Store {
        self.settings.store()
    }
}

/// The CRIU images a restore runs from.
struct Images {
    dir: PathBuf,
    /// The options they were dumped with.
    criu: criu_bridge::runc::CriuOptions,
    /// Names the restore's work dir.
    label: String,
    /// They stay in place until the memory is filled, so the restore may run lazily.
    lazy: bool,
}

impl Images {
    fn of(cp: &Checkpoint) -> Self {
        Self {
            dir: cp.criu_dir(),
            criu: cp.manifest.criu_options.clone(),
            label: cp.manifest.seq.to_string(),
            lazy: true,
        }
    }
}

/// Refuses `cp` if its tasks hold more privilege than the spec in `bundle` (the container being
/// created or restored) grants ([`criu_bridge::check_privilege`]); reads only, so it runs before
/// anything is touched. The restore itself checks again before CRIU runs.
async fn check_privilege(cp: &Checkpoint, bundle: &Path) -> Result<()> {
    let (images, bundle) = (cp.criu_dir(), bundle.to_path_buf());
    tokio::task::spawn_blocking(move || criu_bridge::check_privilege(&images, &bundle))
        .await
        .map_err(|e| Error::Checkpoint(e.to_string()))?
        .map_err(Error::from)
}

/// Whether restores run lazily (`lazy_restore` of the settings; `auto` asks CRIU once). Blocks:
/// call it off the async runtime.
fn lazy_restore(mode: &str, runc: &criu_bridge::runc::Runc) -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match mode {
        "on" => true,
        "off" => false,
        _ => *SUPPORTED.get_or_init(|| {
            let ok = criu_bridge::lazy::lazy_pages_supported(runc);
            if !ok {
                log::warn!(
                    "CRIU cannot restore lazily here (uffd-noncoop); restores read all memory first"
                );
            }
            ok
        }),
    }
}
