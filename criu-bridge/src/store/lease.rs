//! Leases on checkpoints whose layers a mounted rootfs stacks on. A restored container, and
//! every fork, mounts checkpoints' `fs/` dirs of this store as overlay lower dirs for as long as
//! it runs; a checkpoint removed or compacted meanwhile would take files from under it (overlay
//! forbids changing a lower dir while mounted). A lease keeps such a checkpoint in place: delete
//! and compaction refuse, naming the holders.
//!
//! A lease is a file `.leases/<seq>+<namespace>+<container>+<pid>.<n>` in the leased checkpoint's
//! container dir, on which its holder keeps a shared `flock` (a lease outlives no process: a
//! holder that died leaves a file nobody locks, which the next check removes). Taking a lease and
//! checking leases both run under `.leases/.lock`, exclusively and briefly, so a checkpoint is
//! never removed between a holder's lease and its check that the checkpoint is there. That lock
//! is not the container's store lock, which a checkpoint being written holds for seconds.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::manifest::{FS_DIR, MANIFEST_FILE};
use super::{Checkpoint, Store, StoreError, mkdir_private, open_lock_file};

/// The directory of a container's leases, in its store dir.
const LEASES_DIR: &str = ".leases";
/// The lock file taking and checking leases run under.
const LEASES_LOCK: &str = ".lock";

/// Leases held on checkpoints; released (files removed) when dropped.
#[derive(Debug, Default)]
pub struct Lease {
    files: Vec<(PathBuf, fs::File)>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Removed before it is unlocked: a check that no longer finds it cannot see it held
        // through a child still sharing the open file until its exec.
        for (path, _) in &self.files {
            let _ = fs::remove_file(path);
        }
    }
}

/// Holds a container's `.leases/.lock` exclusively while alive.
struct LeasesLock {
    dir: PathBuf,
    _file: fs::File,
}

impl LeasesLock {
    fn take(container_dir: &Path) -> Result<Self, StoreError> {
        let dir = container_dir.join(LEASES_DIR);
        mkdir_private(&dir)?;
        let path = dir.join(LEASES_LOCK);
        let file = open_lock_file(&path)?;
        crate::sys::flock(&file, libc::LOCK_EX).map_err(|e| StoreError::io("lock", &path, e))?;
        Ok(Self { dir, _file: file })
    }
}

impl Store {
    /// Leases every checkpoint of this store whose layers a rootfs mounted from `cp` stacks on:
    /// `cp`'s fs chain and the store layers among its image lowers (a fork's). `holder` names
    /// the container that mounts it, `(namespace, id)`, for the refusals.
    pub fn lease(&self, cp: &Checkpoint, holder: (&str, &str)) -> Result<Lease, StoreError> {
        let m = &cp.manifest;
        let mut wanted: Vec<(String, String, u64)> = m
            .fs_chain
            .iter()
            .map(|&seq| (m.namespace.clone(), m.container.clone(), seq))
            .collect();
        wanted.extend(m.image_lowers.iter().filter_map(|l| self.layer_owner(l)));
        let mut lease = Lease::default();
        for (namespace, container, seq) in wanted {
            lease
                .files
                .push(self.lease_one(&namespace, &container, seq, holder)?);
        }
        Ok(lease)
    }

    fn lease_one(
        &self,
        namespace: &str,
        container: &str,
        seq: u64,
        (holder_ns, holder_id): (&str, &str),
    ) -> Result<(PathBuf, fs::File), StoreError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = self.container_dir(namespace, container)?;
        let guard = LeasesLock::take(&dir)?;
        let path = guard.dir.join(format!(
            "{seq}+{holder_ns}+{holder_id}+{}.{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let file = fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(|e| StoreError::io("create", &path, e))?;
        let locked = crate::sys::flock(&file, libc::LOCK_SH);
        if let Err(e) = locked {
            let _ = fs::remove_file(&path);
            return Err(StoreError::io("lock", &path, e));
        }
        if !dir.join(seq.to_string()).join(MANIFEST_FILE).is_file() {
            let _ = fs::remove_file(&path);
            return Err(StoreError::NotFound {
                namespace: namespace.into(),
                container: container.into(),
                seq,
            });
        }
        Ok((path, file))
    }

    /// Runs `f` unless a live lease is held on checkpoint `seq` of the container whose store dir
    /// is `container_dir` ([`StoreError::InUse`] then, naming the holders). No lease can be
    /// taken while `f` runs. Leases whose holder died are removed on the way.
    pub(crate) fn unless_leased<T>(
        &self,
        container_dir: &Path,
        seq: u64,
        f: impl FnOnce() -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let guard = LeasesLock::take(container_dir)?;
        let prefix = format!("{seq}+");
        let mut holders = Vec::new();
        let entries =
            fs::read_dir(&guard.dir).map_err(|e| StoreError::io("read", &guard.dir, e))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let Ok(file) = fs::File::open(e.path()) else {
                continue; // released meanwhile
            };
            match crate::sys::flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
                Ok(true) => {
                    tracing::info!(path = %e.path().display(), "removing a lease its holder left");
                    let _ = fs::remove_file(e.path());
                }
                Ok(false) => {
                    let mut parts = rest.splitn(3, '+');
                    let (ns, id) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
                    let holder = format!("{ns}/{id}");
                    if !holders.contains(&holder) {
                        holders.push(holder);
                    }
                }
                Err(err) => return Err(StoreError::io("lock", &e.path(), err)),
            }
        }
        if !holders.is_empty() {
            holders.sort();
            let (namespace, container) = names_of(container_dir);
            return Err(StoreError::InUse {
                seq,
                container: format!("{namespace}/{container}"),
                holders,
            });
        }
        f()
    }

    /// The checkpoint `(namespace, container, seq)` whose fs layer `dir` is, if it is one of
    /// this store's.
    pub(super) fn layer_owner(&self, dir: &Path) -> Option<(String, String, u64)> {
        let rest = dir.strip_prefix(self.root().join("checkpoints")).ok()?;
        let parts: Vec<&str> = rest.iter().filter_map(|p| p.to_str()).collect();
        match parts[..] {
            [ns, container, seq, FS_DIR] => Some((ns.into(), container.into(), seq.parse().ok()?)),
            _ => None,
        }
    }
}

/// `(namespace, container)` of a container's store dir.
pub(crate) fn names_of(container_dir: &Path) -> (String, String) {
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    (name(container_dir.parent()), name(Some(container_dir)))
}
