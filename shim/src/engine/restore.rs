//! Restores: in place (the control API, the automatic recovery) and at task start (a fork, a
//! container without a task, runc's images that containerd names). Everything that can be
//! checked is checked before the running container is touched.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use containerd_shim::protos::api::Status;
use criu_bridge::Checkpoint;
use criu_bridge::store::Lease;
use log::info;

use super::Engine;
use crate::busy::Busy;
use crate::container::{Container, FsState, PendingRestore};
use crate::error::{Error, Result, io, task};
use crate::stdio::PendingIo;
use belayer_api::RestoreInfo;

impl Engine {
    /// Loads and verifies a checkpoint (sha256 of every file) before anything is touched, and
    /// leases it (and every checkpoint whose layers its rootfs stacks on) for container
    /// `holder` of this shim's namespace: none of them can be removed until the lease goes.
    pub(super) async fn load_verified(
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
                None => store
                    .latest(&ns, &cid)?
                    .ok_or_else(|| Error::NoCheckpoints(cid.clone()))?,
            };
            // Before the verification: what is verified is what gets mounted.
            let lease = store.lease(&cp, (&holder_ns, &holder))?;
            // Stamped: every file whose inode, size or ctime moved since it was last hashed is hashed
            // again (any write moves ctime), the rest is trusted; Full re-reads everything.
            criu_bridge::verify(&store, &cp, criu_bridge::store::VerifyLevel::Stamped)?;
            criu_bridge::criu::check_criu_with(&crate::reaper::ReaperSpawner, &criu)?;
            Ok((cp, lease))
        })
        .await
        .map_err(task("verify the checkpoint"))??;
        Ok((cp, lease, started.elapsed().as_millis() as u64))
    }

    /// Mounts `cp`'s rootfs for container `c` on a fresh Belayer-owned upper dir; `lease` (on
    /// `cp`'s layers) is kept while it is mounted.
    pub(super) fn mount_from(
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
    pub(super) fn restore_scratch(&self, c: &Container) -> PathBuf {
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
        .map_err(task("restore"))??;
        c.lazy_fill = report.lazy.map(Arc::new);
        let fill = c.lazy_fill.as_ref().map(|f| f.pid());
        let pio = pending.finish(&c.init.paths)?;
        let pid = std::fs::read_to_string(&pid_file)
            .map_err(io(format!("read {}", pid_file.display())))?
            .trim()
            .parse::<u32>()
            .map_err(|source| Error::BadPid {
                path: pid_file.clone(),
                source,
            })?;
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
    pub(super) fn watch_fill(self: &Arc<Self>, id: &str, init: u32, daemon: i32, label: String) {
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

    /// [`Engine::restore`] for a caller that has marked the container busy.
    pub(super) async fn restore_busy(
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
        match self.runc.delete(id, true).await {
            Ok(()) | Err(Error::RuncNoContainer { .. }) => {}
            Err(e) => return Err(e),
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
        if c.policy.auto {
            self.retain_soon(id);
        }
        Ok(info)
    }

    /// For a task created with [`RestoreOptions`](belayer_api::RestoreOptions): verify the
    /// checkpoint (at create). Its rootfs is mounted at start: between the two, a restore
    /// through CRI unpacks containerd's own diff of the source's rootfs (`rootfs-diff.tar`) into
    /// the bundle's rootfs, which must land in the task's own snapshot, not on top of the
    /// checkpoint's layers (where a stale diff would overwrite them).
    pub(super) async fn prepare_restore(
        &self,
        c: &mut Container,
        opts: &belayer_api::RestoreOptions,
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

    /// Starts a task prepared by [`Engine::prepare_restore`]: mounts the checkpoint's rootfs in
    /// place of the snapshot's and restores its processes.
    pub(super) async fn start_restored(
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
        // A container restored from its own checkpoint (its task or shim died, and `belayer
        // restore` brought it back) reports where its journal stands, as an in-place restore
        // does; a fork starts a journal of its own.
        let own = cp.manifest.container == c.id && cp.manifest.namespace == self.namespace;
        let position = match own {
            true => self.reposition(c, cp.manifest.seq).await,
            false => None,
        };
        if own && c.policy.auto {
            self.retain_soon(&c.id);
        }
        log::info!(
            "container {} restored from checkpoint {} of {} at start in {:?}, position {:?}",
            c.id,
            cp.manifest.seq,
            cp.manifest.container,
            started.elapsed(),
            position
        );
        Ok(pid)
    }

    /// Starts a task created from runc's CRIU images (no Belayer checkpoint) as containerd's
    /// runc shim would: its processes restored onto the task's own rootfs, the snapshot
    /// containerd mounted and (for CRI) unpacked its diff into. The images are dropped after the
    /// restore, which removes them where they are containerd's to discard. From then on the
    /// container is a Belayer container like any other (its first checkpoint captures that
    /// snapshot's upper).
    pub(super) async fn start_runc_restored(
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
    pub(super) fn of(cp: &Checkpoint) -> Self {
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
        .map_err(task("check the checkpoint's privileges"))?
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
