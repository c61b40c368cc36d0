//! The checkpoint store (DESIGN.md §3): `<root>/checkpoints/<namespace>/<container>/<seq>/`,
//! root-only, each checkpoint written into a temp dir and renamed into place whole, a
//! per-container lock, listing, loading, deletion that keeps chains whole, and compaction.

mod adopt;
mod cache;
mod claim;
mod compact;
mod confine;
mod files;
mod lease;
mod manifest;
mod pending;
mod verify;

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use adopt::Adoption;
pub use compact::CompactCheckpointError;
pub use confine::MAX_SEQ;
pub use lease::Lease;
pub use manifest::{
    CRIU_DIR, FORMAT_VERSION, FS_DIR, FileEntry, FormatError, INDEX_FILE, MANIFEST_FILE,
    MAX_MANIFEST_BYTES, Manifest, Sizes, Timings, UncapturedExec, probe_version,
};
pub use pending::PendingCheckpoint;
pub use verify::{VerifyError, VerifyLevel, verify_checkpoint, verify_dir};

use crate::layer::LayerIndex;

/// Removes a directory (a checkpoint or import being written) when dropped, unless the work
/// that owns it moved it away first.
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The default store root.
pub const DEFAULT_ROOT: &str = "/var/lib/belayer";
/// Prefix of in-progress (temporary) checkpoint dirs; never listed.
pub(crate) const TMP_PREFIX: &str = ".tmp-";
/// Name of the per-container lock file.
pub(crate) const LOCK_FILE: &str = ".lock";
/// Tries at taking a container's lock, 2 ms apart, before it counts as held.
const LOCK_ATTEMPTS: u32 = 5;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A namespace or container id that cannot be a path component.
    #[error("invalid {what} {name:?}: use letters, digits, '_', '-', '.', not starting with '.'")]
    BadName {
        /// "namespace" or "container id".
        what: &'static str,
        /// The name.
        name: String,
    },
    /// No such checkpoint.
    #[error("no checkpoint {seq} of container {container} in namespace {namespace}")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Container.
        container: String,
        /// Sequence number.
        seq: u64,
    },
    /// Another checkpoint of the container is being written.
    #[error("a checkpoint of container {container} (namespace {namespace}) is already in progress")]
    InProgress {
        /// Namespace.
        namespace: String,
        /// Container.
        container: String,
    },
    /// The store's disk is full; nothing partial was left behind.
    #[error("disk full while writing {path}; the partial checkpoint was removed")]
    DiskFull {
        /// What was being written.
        path: PathBuf,
    },
    /// A later checkpoint's filesystem depends on this one.
    #[error(
        "checkpoint {seq} is part of the fs chain of checkpoint {needed_by}; compact {needed_by} first"
    )]
    InChain {
        /// The checkpoint to delete.
        seq: u64,
        /// The checkpoint that needs it.
        needed_by: u64,
    },
    /// A checkpoint (of another container: a fork) mounts this one's layer as a lower dir.
    #[error(
        "checkpoint {seq} is a lower layer of checkpoint {by}; delete or compact that one first"
    )]
    UsedAsLower {
        /// The checkpoint to delete.
        seq: u64,
        /// The checkpoint dir that needs it.
        by: PathBuf,
    },
    /// A running container's rootfs stacks on the checkpoint's layers (it was restored or forked
    /// from it): removing or compacting it would take files from under that container.
    #[error(
        "checkpoint {seq} of {container} is in use: the running rootfs of {} stacks on its layers; remove those tasks first",
        holders.join(", ")
    )]
    InUse {
        /// The checkpoint.
        seq: u64,
        /// Its container, `namespace/id`.
        container: String,
        /// The containers that mount it, `namespace/id`.
        holders: Vec<String>,
    },
    /// A checkpoint to adopt has the number of one in this store but is another checkpoint
    /// (another node's container of the same name, say).
    #[error(
        "checkpoint {seq} of {namespace}/{container} is not the one in this node's store (taken at {theirs_ms} ms, not {ours_ms} ms since the epoch); remove it (belayer rm) or import elsewhere"
    )]
    Clash {
        /// Namespace.
        namespace: String,
        /// Container.
        container: String,
        /// Sequence number.
        seq: u64,
        /// When the one to adopt was taken (ms since the epoch).
        theirs_ms: u64,
        /// When this store's was taken.
        ours_ms: u64,
    },
    /// A path a manifest or an imported archive names is not confined to its checkpoint's dir
    /// (or a checkpoint dir to its store): absolute, `..`, or through a symlink.
    #[error("{what} {path:?} under {base} {why}: a checkpoint names only paths inside itself")]
    Unconfined {
        /// The dir it must stay in.
        base: PathBuf,
        /// What the path is ("criu_dir", "container dir", ...).
        what: &'static str,
        /// The path, relative to `base`.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A checkpoint dir whose manifest names another checkpoint.
    #[error("{dir} holds the manifest of checkpoint {found}, not of {expected}")]
    Mismatch {
        /// The checkpoint dir.
        dir: PathBuf,
        /// `namespace/container/seq` that the dir's place names.
        expected: String,
        /// `namespace/container/seq` that its manifest names.
        found: String,
    },
    /// A container used up its checkpoint ids ([`MAX_SEQ`]).
    #[error("container {namespace}/{container} has no checkpoint id left below 2^32")]
    SeqExhausted {
        /// Namespace.
        namespace: String,
        /// Container.
        container: String,
    },
    /// An archive to import does not hold exactly one container's checkpoints.
    #[error("{dir} holds {found} checkpoint chains, not one")]
    NotOneChain {
        /// Where the archive was unpacked.
        dir: PathBuf,
        /// How many it holds.
        found: usize,
    },
    /// An entry of an imported chain that is not a checkpoint dir named by an id below 2^32.
    #[error("{dir}: {name:?} is not a checkpoint dir named by an id in 1..2^32")]
    BadCheckpointName {
        /// The container's dir in the archive.
        dir: PathBuf,
        /// The entry.
        name: String,
    },
    /// An imported checkpoint stacks on a checkpoint the import does not hold: it would stack on
    /// whatever of that number this store has.
    #[error("checkpoint {seq} to import stacks on checkpoint {member}, which the archive lacks")]
    ChainOutside {
        /// The imported checkpoint.
        seq: u64,
        /// The chain member missing from the archive.
        member: u64,
    },
    /// An imported checkpoint was taken on another number of image layers than the container
    /// importing it has (a fork's, stacked on another container's checkpoints, say).
    #[error(
        "checkpoint {seq} to import stacks on {found} image lower dirs, the container's image snapshot has {expected}: import it into a container of the image it was taken from"
    )]
    ImageLowers {
        /// The imported checkpoint.
        seq: u64,
        /// How many its manifest names.
        found: usize,
        /// How many the container's snapshot has.
        expected: usize,
    },
    /// A manifest is unreadable.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A filesystem step failed.
    #[error("cannot {step} {path}")]
    Io {
        /// The step ("create", "rename", "fsync", ...).
        step: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl StoreError {
    pub(crate) fn io(step: &'static str, path: &Path, source: std::io::Error) -> Self {
        if crate::sys::is_disk_full(&source) {
            Self::DiskFull { path: path.into() }
        } else {
            Self::Io {
                step,
                path: path.into(),
                source,
            }
        }
    }
}

/// A checkpoint on disk: its dir and its manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The checkpoint dir.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

impl Checkpoint {
    /// Opens a checkpoint dir outside a store (e.g. one written by [`Store::export`]).
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        confine::check_beneath(dir, "manifest", MANIFEST_FILE)?;
        let manifest = Manifest::read(&dir.join(MANIFEST_FILE))?;
        let cp = Self {
            dir: dir.to_path_buf(),
            manifest,
        };
        cp.check_confined()?;
        Ok(cp)
    }

    /// Refuses a `criu_dir` or `fs_dir` that leaves the checkpoint dir or goes through a
    /// symlink: what [`Checkpoint::criu_dir`] and [`Checkpoint::fs_dir`] name is then inside it.
    fn check_confined(&self) -> Result<(), StoreError> {
        confine::check_beneath(&self.dir, "criu_dir", &self.manifest.criu_dir)?;
        confine::check_beneath(&self.dir, "fs_dir", &self.manifest.fs_dir)?;
        Ok(())
    }

    /// The CRIU image dir.
    pub fn criu_dir(&self) -> PathBuf {
        self.dir.join(&self.manifest.criu_dir)
    }

    /// The fs layer dir.
    pub fn fs_dir(&self) -> PathBuf {
        self.dir.join(&self.manifest.fs_dir)
    }

    /// The capture index of this checkpoint (the upper dir at its instant).
    pub fn read_index(&self) -> Result<LayerIndex, StoreError> {
        let path = self.dir.join(INDEX_FILE);
        let bytes = fs::read(&path).map_err(|e| StoreError::io("read", &path, e))?;
        serde_json::from_slice(&bytes)
            .map_err(|source| FormatError::Malformed { path, source }.into())
    }
}

/// A lock on one container's checkpoints; released when dropped.
#[derive(Debug)]
pub struct ContainerLock {
    _file: fs::File,
    dir: PathBuf,
}

/// The checkpoint store rooted at `root` (`/var/lib/belayer` by default).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

impl Default for Store {
    fn default() -> Self {
        Self::new(DEFAULT_ROOT)
    }
}

fn check_name(what: &'static str, name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadName {
            what,
            name: name.into(),
        })
    }
}

/// Writes a file only root reads (0600 whatever the umask) by a rename: whole or not at all.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        StoreError::io("write", path, e)
    })
}

pub(crate) fn mkdir_private(path: &Path) -> Result<(), StoreError> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(StoreError::io("create", path, e)),
    }
}

/// Opens (creating) a file that is only ever `flock`ed.
pub(crate) fn open_lock_file(path: &Path) -> Result<fs::File, StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .mode(0o600)
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| StoreError::io("open", path, e))
}

impl Store {
    /// A store rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The store root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/checkpoints/<namespace>/<container>`, names checked.
    pub fn container_dir(&self, namespace: &str, container: &str) -> Result<PathBuf, StoreError> {
        check_name("namespace", namespace)?;
        check_name("container id", container)?;
        Ok(self
            .root
            .join("checkpoints")
            .join(namespace)
            .join(container))
    }

    /// Makes the store root-only at rest, whatever the umask and whatever mode a deployment
    /// gave it: the root is created 0700 if missing, and it and every dir directly under it
    /// (checkpoints, uppers, journals, staging dirs) are set to 0700. Nothing under it is then
    /// reachable by another user, whatever the modes of the files a container wrote.
    pub fn secure(&self) -> Result<(), StoreError> {
        mkdir_private(&self.root)?;
        let private = |d: &Path| {
            fs::set_permissions(d, fs::Permissions::from_mode(0o700))
                .map_err(|e| StoreError::io("chmod", d, e))
        };
        if fs::metadata(&self.root)
            .map_err(|e| StoreError::io("stat", &self.root, e))?
            .permissions()
            .mode()
            & 0o7777
            != 0o700
        {
            private(&self.root)?;
        }
        let rd = fs::read_dir(&self.root).map_err(|e| StoreError::io("read", &self.root, e))?;
        for e in rd.flatten() {
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            let open = e
                .metadata()
                .is_ok_and(|m| m.permissions().mode() & 0o077 != 0);
            if is_dir && open {
                private(&e.path())?;
            }
        }
        Ok(())
    }

    /// `checkpoints/<namespace>/<container>` under the root, refused when any component is a
    /// symlink (an imported archive's could point at another container's checkpoints).
    /// `Ok(false)` when it does not exist.
    fn check_container_dir(&self, namespace: &str, container: &str) -> Result<bool, StoreError> {
        self.container_dir(namespace, container)?;
        confine::check_beneath(
            &self.root,
            "container dir",
            &format!("checkpoints/{namespace}/{container}"),
        )
    }

    /// Takes the per-container lock; [`StoreError::InProgress`] when someone holds it.
    pub fn lock(&self, namespace: &str, container: &str) -> Result<ContainerLock, StoreError> {
        let dir = self.container_dir(namespace, container)?;
        self.check_container_dir(namespace, container)?;
        mkdir_private(&dir)?;
        self.check_container_dir(namespace, container)?;
        for d in [
            self.root.join("checkpoints"),
            self.root.join("checkpoints").join(namespace),
            dir.clone(),
        ] {
            fs::set_permissions(&d, fs::Permissions::from_mode(0o700))
                .map_err(|e| StoreError::io("chmod", &d, e))?;
        }
        let path = dir.join(LOCK_FILE);
        let file = open_lock_file(&path)?;
        // A lock just released can look held for a moment: a child forked by another thread
        // shares the lock's open file until it execs. A few short retries ride that out; a real
        // holder (a checkpoint) keeps it far longer.
        for attempt in 0..LOCK_ATTEMPTS {
            match crate::sys::try_lock_exclusive(&file) {
                Ok(true) => return Ok(ContainerLock { _file: file, dir }),
                Ok(false) if attempt + 1 < LOCK_ATTEMPTS => {
                    std::thread::sleep(std::time::Duration::from_millis(2))
                }
                Ok(false) => break,
                Err(e) => return Err(StoreError::io("lock", &path, e)),
            }
        }
        Err(StoreError::InProgress {
            namespace: namespace.into(),
            container: container.into(),
        })
    }

    /// The sequence numbers of the complete checkpoints of a container, oldest first. Temp dirs
    /// are never listed; left-over ones (from a crash) are removed when no checkpoint is in
    /// progress.
    pub fn list(&self, namespace: &str, container: &str) -> Result<Vec<u64>, StoreError> {
        let dir = self.container_dir(namespace, container)?;
        if !self.check_container_dir(namespace, container)? {
            return Ok(Vec::new());
        }
        let rd = match fs::read_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            r => r.map_err(|e| StoreError::io("read", &dir, e))?,
        };
        let mut seqs = Vec::new();
        let mut leftovers = Vec::new();
        for e in rd {
            let e = e.map_err(|e| StoreError::io("read", &dir, e))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with(TMP_PREFIX) {
                leftovers.push(e.path());
            } else if let Ok(seq) = name.parse::<u64>()
                && (1..MAX_SEQ).contains(&seq)
                && e.file_type().is_ok_and(|t| t.is_dir())
                && e.path().join(MANIFEST_FILE).is_file()
            {
                seqs.push(seq);
            }
        }
        if !leftovers.is_empty()
            && let Ok(_lock) = self.lock(namespace, container)
        {
            for p in leftovers {
                tracing::info!(path = %p.display(), "removing left-over partial checkpoint");
                let _ = fs::remove_dir_all(&p);
            }
        }
        seqs.sort_unstable();
        Ok(seqs)
    }

    /// Loads (and format-checks) one checkpoint's manifest.
    pub fn load(
        &self,
        namespace: &str,
        container: &str,
        seq: u64,
    ) -> Result<Checkpoint, StoreError> {
        let dir = self
            .container_dir(namespace, container)?
            .join(seq.to_string());
        let path = dir.join(MANIFEST_FILE);
        // Never through a symlink, at any level: an imported archive's could name any dir.
        let rel = format!("checkpoints/{namespace}/{container}/{seq}/{MANIFEST_FILE}");
        if !confine::check_beneath(&self.root, "manifest", &rel)? || !path.is_file() {
            return Err(StoreError::NotFound {
                namespace: namespace.into(),
                container: container.into(),
                seq,
            });
        }
        let manifest = Manifest::read(&path)?;
        let (m, name) = (&manifest, |ns: &str, c: &str, s: u64| {
            format!("{ns}/{c}/{s}")
        });
        if (m.namespace.as_str(), m.container.as_str(), m.seq) != (namespace, container, seq) {
            return Err(StoreError::Mismatch {
                dir,
                expected: name(namespace, container, seq),
                found: name(&m.namespace, &m.container, m.seq),
            });
        }
        let cp = Checkpoint { dir, manifest };
        cp.check_confined()?;
        Ok(cp)
    }

    /// The newest checkpoint, if any.
    pub fn latest(
        &self,
        namespace: &str,
        container: &str,
    ) -> Result<Option<Checkpoint>, StoreError> {
        match self.list(namespace, container)?.last() {
            Some(&seq) => self.load(namespace, container, seq).map(Some),
            None => Ok(None),
        }
    }

    /// Starts a new checkpoint (the next sequence number) in a temp dir, under `lock`.
    pub fn begin(&self, lock: &ContainerLock) -> Result<PendingCheckpoint, StoreError> {
        let (ns, id) = lease::names_of(&lock.dir);
        let seq = match self.list(&ns, &id)?.last() {
            None => 1,
            Some(s) => s.checked_add(1).filter(|n| *n < MAX_SEQ).ok_or_else(|| {
                StoreError::SeqExhausted {
                    namespace: ns.clone(),
                    container: id.clone(),
                }
            })?,
        };
        // Holding the lock, any temp dir is a crashed write's leftover.
        if let Ok(rd) = fs::read_dir(&lock.dir) {
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                    tracing::info!(path = %e.path().display(), "removing left-over partial checkpoint");
                    let _ = fs::remove_dir_all(e.path());
                }
            }
        }
        PendingCheckpoint::create(&lock.dir, seq)
    }

    /// Deletes a checkpoint. Refused while a later checkpoint's fs chain contains it
    /// ([`StoreError::InChain`]): compact that one first ([`Store::compact`]).
    pub fn delete(&self, namespace: &str, container: &str, seq: u64) -> Result<(), StoreError> {
        let _lock = self.lock(namespace, container)?;
        let cp = self.load(namespace, container, seq)?;
        self.refuse_if_stacked_on(&cp)?;
        // Rename first so a crash never leaves a half-deleted checkpoint listed.
        let doomed = cp.dir.with_file_name(format!("{TMP_PREFIX}deleted-{seq}"));
        let dir = self.container_dir(namespace, container)?;
        self.unless_leased(&dir, seq, || {
            fs::rename(&cp.dir, &doomed).map_err(|e| StoreError::io("rename", &cp.dir, e))
        })?;
        fs::remove_dir_all(&doomed).map_err(|e| StoreError::io("remove", &doomed, e))?;
        let _ = fs::remove_file(verify::stamp_path(&cp.dir));
        Ok(())
    }

    /// Refuses when another checkpoint's rootfs stacks on `cp`'s layer: a later checkpoint of
    /// its container whose fs chain holds it ([`StoreError::InChain`]), or a checkpoint of any
    /// container (a fork's) that has it among its image lowers ([`StoreError::UsedAsLower`]).
    /// Neither deleting that layer nor rewriting it (compaction) may happen then.
    pub(super) fn refuse_if_stacked_on(&self, cp: &Checkpoint) -> Result<(), StoreError> {
        let (namespace, container, seq) = (
            &cp.manifest.namespace,
            &cp.manifest.container,
            cp.manifest.seq,
        );
        for other in self.list(namespace, container)? {
            if other == seq {
                continue;
            }
            let o = self.load(namespace, container, other)?;
            if o.manifest.fs_chain.contains(&seq) {
                return Err(StoreError::InChain {
                    seq,
                    needed_by: other,
                });
            }
        }
        if let Some(user) = self.lower_user(&cp.fs_dir())? {
            return Err(StoreError::UsedAsLower { seq, by: user });
        }
        Ok(())
    }

    /// A checkpoint of any container that mounts `layer` as an image lower dir (a fork's first
    /// checkpoints stack on the chain of the checkpoint it was forked from).
    fn lower_user(&self, layer: &Path) -> Result<Option<PathBuf>, StoreError> {
        let top = self.root.join("checkpoints");
        let read = |d: &Path| -> Vec<PathBuf> {
            fs::read_dir(d)
                .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default()
        };
        for ns in read(&top) {
            for container in read(&ns) {
                for dir in read(&container) {
                    let manifest = dir.join(MANIFEST_FILE);
                    if !manifest.is_file() {
                        continue;
                    }
                    if let Ok(m) = Manifest::read(&manifest)
                        && m.image_lowers.iter().any(|l| l == layer)
                    {
                        return Ok(Some(dir));
                    }
                }
            }
        }
        Ok(None)
    }
}
