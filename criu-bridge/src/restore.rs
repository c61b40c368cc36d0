//! Restore pieces: verify a checkpoint, mount its rootfs from the layer chain (fresh upper),
//! and `runc restore` the processes into a bundle (in place, or under a new id for a fork).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::criu::{CriuLog, RestoreStats, VersionError, read_restore_stats};
use crate::layer::{MountError, mount_chain};
use crate::runc::{CriuOptions, RestoreArgs, RestoreStdio, Runc, RuncError};
use crate::store::{Checkpoint, Store, StoreError, VerifyError, VerifyLevel, verify_checkpoint};

/// Why a restore step failed.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    /// CRIU is missing or too old.
    #[error(transparent)]
    Criu(#[from] VersionError),
    /// The checkpoint (or a chain member) cannot be loaded.
    #[error("cannot load the checkpoint")]
    Load(#[from] StoreError),
    /// The checkpoint failed verification; nothing was touched.
    #[error("checkpoint {dir} failed verification")]
    Verify {
        /// The checkpoint dir.
        dir: PathBuf,
        /// What is wrong.
        #[source]
        source: VerifyError,
    },
    /// Mounting the rootfs failed.
    #[error("cannot mount the rootfs of checkpoint {dir}")]
    Mount {
        /// The checkpoint dir.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: MountError,
    },
    /// The CRIU restore failed.
    #[error("CRIU restore of container {id} failed; {log}")]
    Restore {
        /// The container id restored as.
        id: String,
        /// Relevant lines of restore.log.
        log: CriuLog,
        /// The cause.
        #[source]
        source: Box<RuncError>,
    },
    /// A task of the checkpoint holds more privilege than the container's spec grants (or
    /// its images cannot be read to tell); nothing was restored or written.
    #[error("checkpoint images {dir} refused")]
    Privilege {
        /// The CRIU image dir.
        dir: PathBuf,
        /// The task and field that exceed the spec.
        #[source]
        source: Box<crate::criu::PrivilegeError>,
    },
    /// The lazy-pages daemon did not start (nothing was restored).
    #[error(transparent)]
    LazyPages(#[from] crate::lazy::LazyPagesError),
    /// The restore work dir cannot be created.
    #[error("cannot create restore work dir {path}")]
    WorkDir {
        /// The dir.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses CRIU images in `image_dir` whose tasks exceed what the spec of `bundle` (the
/// container being created) grants: credentials, capabilities, `no_new_privs`, seccomp, mounts
/// ([`crate::criu::privilege`]). Reads only; run it before anything is touched.
pub fn check_privilege(image_dir: &Path, bundle: &Path) -> Result<(), RestoreError> {
    crate::criu::check_restore_privilege(image_dir, bundle).map_err(|source| {
        RestoreError::Privilege {
            dir: image_dir.into(),
            source: Box::new(source),
        }
    })
}

/// Verifies `cp` and its whole fs chain before anything is touched.
pub fn verify(store: &Store, cp: &Checkpoint, level: VerifyLevel) -> Result<(), RestoreError> {
    verify_checkpoint(store, cp, level).map_err(|source| RestoreError::Verify {
        dir: cp.dir.clone(),
        source,
    })
}

/// The lower dirs of `cp`'s rootfs: its fs chain newest first (each member loaded, so confined
/// to its checkpoint dir), then the image lowers: written by this store, or for an imported
/// checkpoint those of the importing container's image snapshot ([`Store::claim`]), never ones
/// an archive named.
pub fn rootfs_lowers(store: &Store, cp: &Checkpoint) -> Result<Vec<PathBuf>, RestoreError> {
    let m = &cp.manifest;
    let mut lowers = Vec::with_capacity(m.fs_chain.len() + m.image_lowers.len());
    for &seq in &m.fs_chain {
        lowers.push(if seq == m.seq {
            cp.fs_dir()
        } else {
            store.load(&m.namespace, &m.container, seq)?.fs_dir()
        });
    }
    lowers.extend(m.image_lowers.iter().cloned());
    Ok(lowers)
}

/// Mounts `cp`'s rootfs at `target`: an overlay of its chain and the image lowers with the
/// empty (created if missing) `upper` and `work` dirs. O(1) in the size of the layers. The
/// new upper is what the next checkpoint captures, with `cp` as its parent.
pub fn mount_rootfs(
    store: &Store,
    cp: &Checkpoint,
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<Duration, RestoreError> {
    let lowers = rootfs_lowers(store, cp)?;
    mount_chain(&lowers, upper, work, target).map_err(|source| RestoreError::Mount {
        dir: cp.dir.clone(),
        source,
    })
}

/// How to restore the processes.
#[derive(Debug, Clone)]
pub struct RestoreRequest<'a> {
    /// runc.
    pub runc: &'a Runc,
    /// The CRIU images (a checkpoint's [`Checkpoint::criu_dir`], or runc's own).
    pub image_dir: &'a Path,
    /// The CRIU options they were dumped with (a checkpoint's `criu_options`).
    pub criu: &'a CriuOptions,
    /// Container id to restore as (the same for in place, a new one for a fork; the old one
    /// must be deleted from runc first).
    pub id: &'a str,
    /// Bundle whose config.json root.path is the mounted rootfs.
    pub bundle: &'a Path,
    /// Where CRIU writes restore.log and stats-restore (created; outside the checkpoint).
    pub work_dir: &'a Path,
    /// Return once the container runs.
    pub detach: bool,
    /// Where runc writes the pid of init.
    pub pid_file: Option<&'a Path>,
    /// Console socket, if the container has a terminal.
    pub console_socket: Option<&'a Path>,
    /// Restore lazily: the processes run before their memory is filled (see [`crate::lazy`]).
    pub lazy_pages: bool,
}

/// What a process restore reports.
#[derive(Debug)]
pub struct RestoreReport {
    /// Wall time of `runc restore`.
    pub duration: Duration,
    /// CRIU's figures, when it wrote them.
    pub stats: Option<RestoreStats>,
    /// The daemon still filling the processes' memory, for a lazy restore.
    pub lazy: Option<crate::lazy::LazyPages>,
}

/// `runc restore` of the processes in `req.image_dir`.
pub fn restore_processes(
    req: &RestoreRequest<'_>,
    stdio: RestoreStdio,
) -> Result<RestoreReport, RestoreError> {
    crate::criu::check_criu_with(&*req.runc.spawner, &req.runc.criu)?;
    check_privilege(req.image_dir, req.bundle)?;
    // Root-only: CRIU's restore.log names the restored files and sockets.
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(req.work_dir)
        .map_err(|source| RestoreError::WorkDir {
            path: req.work_dir.into(),
            source,
        })?;
    let start = Instant::now();
    let image_dir = req.image_dir;
    let lazy = match req.lazy_pages {
        true => Some(crate::lazy::LazyPages::start(
            req.runc,
            image_dir,
            req.work_dir,
        )?),
        false => None,
    };
    let args = RestoreArgs {
        id: req.id,
        bundle: req.bundle,
        image_dir,
        work_dir: req.work_dir,
        criu: req.criu,
        detach: req.detach,
        pid_file: req.pid_file,
        console_socket: req.console_socket,
        no_subreaper: false,
        no_pivot: false,
        lazy_pages: lazy.is_some(),
    };
    let watch = crate::restore_watch::RestoreWatch::arm(req.id, &req.runc.root, req.work_dir);
    let restored = req.runc.restore(&args, stdio);
    match restored {
        Ok(()) => watch.disarm(),
        Err(_) => watch.failed(),
    }
    restored.map_err(|source| {
        if let Some(l) = &lazy {
            l.kill();
        }
        RestoreError::Restore {
            id: req.id.into(),
            log: CriuLog::read(req.work_dir.join("restore.log")),
            source: Box::new(source),
        }
    })?;
    let duration = start.elapsed();
    let stats = read_restore_stats(&req.work_dir.join("stats-restore")).ok();
    tracing::info!(
        container = req.id,
        ?duration,
        lazy = lazy.is_some(),
        "processes restored"
    );
    Ok(RestoreReport {
        duration,
        stats,
        lazy,
    })
}
