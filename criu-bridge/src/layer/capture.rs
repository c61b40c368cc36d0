//! Capturing what changed in an overlay upper dir since the parent checkpoint as an overlay
//! layer directory (whiteouts, opaque dirs, metadata, hardlinks, sparse data, mtimes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::at::{self, Stat};
use super::copy::{self, Copier, CopyError, Source};
use super::index::{IndexEntry, LayerIndex, UpperIdentity, decode_path, encode_path};
use crate::sys;

/// Why a layer capture failed.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// The upper dir could not be read.
    #[error("cannot read upper dir {path}")]
    ReadUpper {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The upper dir uses an overlay feature a layer cannot carry.
    #[error(
        "{path} uses overlay {feature}; mount the container's overlay with redirect_dir=off,metacopy=off"
    )]
    Unsupported {
        /// The node.
        path: PathBuf,
        /// The feature ("redirect_dir", "metacopy").
        feature: &'static str,
    },
    /// A node of the upper dir is not the one the scan saw when the capture opened it: a
    /// process outside the frozen container swapped or replaced it (a directory for a symlink,
    /// say). Nothing was read through it.
    #[error("{path} changed during capture")]
    Changed {
        /// The node.
        path: PathBuf,
        /// The failed open, where the node was no longer openable as what the scan saw.
        #[source]
        source: Option<io::Error>,
    },
    /// The layer dir already exists.
    #[error("layer dir {0} already exists")]
    Exists(PathBuf),
    /// The disk of the layer dir filled up.
    #[error("disk full while writing the layer ({0})")]
    DiskFull(#[source] CopyError),
    /// Copying a node into the layer failed.
    #[error("cannot write the layer")]
    Copy(#[source] CopyError),
}

impl From<CopyError> for CaptureError {
    fn from(e: CopyError) -> Self {
        if e.is_disk_full() {
            Self::DiskFull(e)
        } else {
            Self::Copy(e)
        }
    }
}

/// Figures of one capture.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CaptureStats {
    /// Nodes in the upper dir.
    pub upper_entries: u64,
    /// Nodes written into the layer (directories, files, whiteouts).
    pub nodes_written: u64,
    /// File data bytes written into the layer.
    pub bytes_written: u64,
    /// Whiteouts written for nodes deleted since the parent.
    pub deletions: u64,
    /// Wall time of the capture.
    pub duration: Duration,
}

enum Action {
    /// Create the directory (with its metadata; opaque if listed in `opaque_dirs`).
    Dir,
    /// Copy the node.
    Copy,
    /// Whiteout for a node deleted since the parent.
    Whiteout,
}

struct Plan {
    index: BTreeMap<String, IndexEntry>,
    metas: HashMap<String, Stat>,
    actions: Vec<(String, Action)>,
    /// Dirs whose whole content is written (opaque in the layer, or new): deletions below
    /// them need no whiteout.
    full_dirs: HashSet<String>,
    /// Dirs marked opaque in the layer.
    opaque_dirs: HashSet<String>,
    /// Names the scan saw for each (device, inode).
    names_of: HashMap<(u64, u64), u64>,
}

/// Captures the changes of `upper` since `parent` (the index of the parent checkpoint, if any)
/// into a new layer directory `out`, and returns the index of `upper` now.
///
/// An index made for another upper dir (the container was restored onto a fresh upper since) is
/// ignored: the whole upper is the change, relative to the chain it was mounted on.
/// The container must be frozen (or stopped) while this runs.
///
/// Every node is opened relative to its parent directory's fd, without following symlinks, and
/// checked (device, inode, type) against what the scan saw; a node swapped or replaced since
/// (by a process outside the frozen cgroup) fails the capture with [`CaptureError::Changed`]
/// and nothing outside `upper` is ever read.
pub fn capture_layer(
    upper: &Path,
    parent: Option<&LayerIndex>,
    out: &Path,
) -> Result<(LayerIndex, CaptureStats), CaptureError> {
    let start = Instant::now();
    let read_err = |source| CaptureError::ReadUpper {
        path: upper.into(),
        source,
    };
    let identity = UpperIdentity::of(upper).map_err(read_err)?;
    let parent = parent.filter(|p| p.upper == identity);
    if fs::symlink_metadata(out).is_ok() {
        return Err(CaptureError::Exists(out.into()));
    }
    let root = at::open_root(upper).map_err(|e| open_error(upper, e))?;
    let root_meta = at::fstat(root.as_fd()).map_err(read_err)?;
    if (root_meta.dev, root_meta.ino) != (identity.dev, identity.ino) {
        return Err(CaptureError::Changed {
            path: upper.into(),
            source: None,
        });
    }
    let mut plan = Plan {
        index: BTreeMap::new(),
        metas: HashMap::new(),
        actions: Vec::new(),
        full_dirs: HashSet::new(),
        opaque_dirs: HashSet::new(),
        names_of: HashMap::new(),
    };
    let empty = BTreeMap::new();
    let old = parent.map(|p| &p.entries).unwrap_or(&empty);
    scan_dir(
        upper,
        root.as_fd(),
        String::new(),
        old,
        parent.is_none(),
        &mut plan,
    )?;
    add_link_partners(&mut plan);
    let deletions = add_deletions(old, &mut plan);

    let mut copier = Copier::default();
    let root_src = Source::Open {
        fd: root.as_fd(),
        path: upper,
    };
    copier.copy_node(&root_src, out, &root_meta)?;
    let mut walk = Walk {
        upper,
        open: vec![(String::new(), root)],
    };
    let mut created: HashSet<String> = HashSet::from([String::new()]);
    for (rel, action) in &plan.actions {
        let parent_rel = parent_of(rel);
        ensure_dirs(&mut walk, out, parent_rel, &plan, &mut created, &mut copier)?;
        let dst = out.join(decode_path(rel));
        match action {
            Action::Dir => ensure_dirs(&mut walk, out, rel, &plan, &mut created, &mut copier)?,
            Action::Copy => {
                copy::remove_any(&dst)?;
                copy_from_upper(&mut walk, rel, &dst, &plan, &mut copier)?
            }
            Action::Whiteout => copy::make_whiteout(&dst)?,
        }
    }
    copier.finish()?;
    let stats = CaptureStats {
        upper_entries: plan.index.len() as u64,
        nodes_written: copier.nodes + deletions,
        bytes_written: copier.bytes,
        deletions,
        duration: start.elapsed(),
    };
    tracing::debug!(upper = %upper.display(), nodes = stats.nodes_written, bytes = stats.bytes_written, "layer captured");
    Ok((
        LayerIndex {
            upper: identity,
            entries: plan.index,
        },
        stats,
    ))
}

/// An open failed: a node that is no longer the kind the scan saw (a symlink where a directory
/// was: ELOOP; a non-directory: ENOTDIR; gone: ENOENT; a socket: ENXIO) changed.
fn open_error(path: &Path, source: io::Error) -> CaptureError {
    let path = path.to_path_buf();
    match source.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT | libc::ENXIO) => CaptureError::Changed {
            path,
            source: Some(source),
        },
        _ => CaptureError::ReadUpper { path, source },
    }
}

/// Checks that the open `fd` is the node the scan saw at `path`.
fn check_same(fd: BorrowedFd<'_>, scanned: &Stat, path: &Path) -> Result<(), CaptureError> {
    let now = at::fstat(fd).map_err(|source| CaptureError::ReadUpper {
        path: path.into(),
        source,
    })?;
    if now.same_node(scanned) {
        Ok(())
    } else {
        Err(CaptureError::Changed {
            path: path.into(),
            source: None,
        })
    }
}

/// The open directories of the upper from its root down to the last one used, each opened
/// relative to its parent without following symlinks and checked against the scan.
struct Walk<'a> {
    upper: &'a Path,
    /// (relative path, fd), the root first.
    open: Vec<(String, OwnedFd)>,
}

impl Walk<'_> {
    /// The checked directory `rel` of the upper.
    fn dir(
        &mut self,
        rel: &str,
        metas: &HashMap<String, Stat>,
    ) -> Result<BorrowedFd<'_>, CaptureError> {
        while self.open.len() > 1 && !is_within(rel, &self.open[self.open.len() - 1].0) {
            self.open.pop();
        }
        loop {
            let (cur, fd) = &self.open[self.open.len() - 1];
            if cur == rel {
                break;
            }
            let rest = if cur.is_empty() {
                rel
            } else {
                &rel[cur.len() + 1..]
            };
            let comp = rest.split('/').next().unwrap_or(rest);
            let next = if cur.is_empty() {
                comp.to_string()
            } else {
                format!("{cur}/{comp}")
            };
            let path = self.upper.join(decode_path(&next));
            let name = at::c_name(decode_path(comp).as_os_str()).map_err(|source| {
                CaptureError::ReadUpper {
                    path: path.clone(),
                    source,
                }
            })?;
            let sub = at::open_dir(fd.as_fd(), &name).map_err(|e| open_error(&path, e))?;
            check_same(sub.as_fd(), &metas[&next], &path)?;
            self.open.push((next, sub));
        }
        Ok(self.open[self.open.len() - 1].1.as_fd())
    }
}

/// Is `rel` the directory `dir` or below it?
fn is_within(rel: &str, dir: &str) -> bool {
    dir.is_empty()
        || rel == dir
        || (rel.len() > dir.len() && rel.starts_with(dir) && rel.as_bytes()[dir.len()] == b'/')
}

/// Copies the non-directory `rel` of the upper to `dst`, opened in its checked parent without
/// following symlinks and checked against the scan.
fn copy_from_upper(
    walk: &mut Walk<'_>,
    rel: &str,
    dst: &Path,
    plan: &Plan,
    copier: &mut Copier,
) -> Result<(), CaptureError> {
    let meta = &plan.metas[rel];
    let path = walk.upper.join(decode_path(rel));
    let name = decode_path(rel.rsplit('/').next().unwrap_or(rel));
    let read_err = |source| CaptureError::ReadUpper {
        path: path.clone(),
        source,
    };
    let cname = at::c_name(name.as_os_str()).map_err(read_err)?;
    let parent = walk.dir(parent_of(rel), &plan.metas)?;
    let node: OwnedFd = if meta.is_file() {
        at::open_file(parent, &cname).map(OwnedFd::from)
    } else {
        at::open_path(parent, &cname)
    }
    .map_err(|e| open_error(&path, e))?;
    check_same(node.as_fd(), meta, &path)?;
    let src = if meta.is_file() {
        Source::Open {
            fd: node.as_fd(),
            path: &path,
        }
    } else {
        Source::Node {
            fd: node.as_fd(),
            parent,
            name: &cname,
            path: &path,
        }
    };
    copier.copy_node(&src, dst, meta)?;
    Ok(())
}

fn parent_of(rel: &str) -> &str {
    rel.rfind('/').map(|i| &rel[..i]).unwrap_or("")
}

fn join_rel(dir: &str, name: &OsStr) -> String {
    let name = encode_path(Path::new(name));
    if dir.is_empty() {
        name
    } else {
        format!("{dir}/{name}")
    }
}

/// Walks the directory `dir` (open; relative path `rel`), recording the new index and the
/// actions. `all` means every node below must be written (the dir is new or opaque in the
/// layer).
fn scan_dir(
    upper: &Path,
    dir: BorrowedFd<'_>,
    rel: String,
    old: &BTreeMap<String, IndexEntry>,
    all: bool,
    plan: &mut Plan,
) -> Result<(), CaptureError> {
    let dir_path = upper.join(decode_path(&rel));
    let mut names = at::read_names(dir).map_err(|source| CaptureError::ReadUpper {
        path: dir_path.clone(),
        source,
    })?;
    names.sort();
    for name in names {
        let child = join_rel(&rel, &name);
        let path = dir_path.join(&name);
        let read_err = |source| CaptureError::ReadUpper {
            path: path.clone(),
            source,
        };
        let cname = at::c_name(&name).map_err(read_err)?;
        let meta = at::stat_at(dir, &cname).map_err(|e| open_error(&path, e))?;
        // A node seen under more names than it has links (a directory under two) was moved
        // while the scan ran.
        let names = plan.names_of.entry((meta.dev, meta.ino)).or_default();
        *names += 1;
        if *names > if meta.is_dir() { 1 } else { meta.nlink } {
            return Err(CaptureError::Changed { path, source: None });
        }
        // A directory is opened now, to read its xattrs and walk it: it must be the one stat'ed.
        let sub = if meta.is_dir() {
            let fd = at::open_dir(dir, &cname).map_err(|e| open_error(&path, e))?;
            check_same(fd.as_fd(), &meta, &path)?;
            Some(fd)
        } else {
            None
        };
        let opaque = match &sub {
            Some(fd) => {
                at::fgetxattr(fd.as_fd(), OsStr::new(copy::OPAQUE_XATTR))
                    .map_err(read_err)?
                    .as_deref()
                    == Some(b"y")
            }
            None => false,
        };
        let now = IndexEntry::from_meta(&meta, opaque);
        let prev = old.get(&child);
        let changed = all || !prev.is_some_and(|p| p.unchanged(&now));
        if changed {
            check_supported(&path, sub.as_ref().map(|fd| fd.as_fd()), dir, &name)?;
        }
        plan.index.insert(child.clone(), now.clone());
        plan.metas.insert(child.clone(), meta);
        if let Some(sub) = sub {
            let replaced = prev.is_some_and(|p| p.ino != now.ino || !p.is_dir());
            let layer_opaque = if all {
                opaque
            } else {
                replaced || (opaque && !prev.is_some_and(|p| p.opaque))
            };
            let full = all || layer_opaque || prev.is_none();
            if layer_opaque {
                plan.opaque_dirs.insert(child.clone());
            }
            if changed || layer_opaque {
                plan.actions.push((child.clone(), Action::Dir));
            }
            if full {
                plan.full_dirs.insert(child.clone());
            }
            scan_dir(upper, sub.as_fd(), child, old, full, plan)?;
        } else if changed {
            plan.actions.push((child, Action::Copy));
        }
    }
    Ok(())
}

/// Refuses a node that uses an overlay feature a layer cannot carry: `sub` is the node if it is
/// an (open, checked) directory; any other node is `name` in `dir`.
fn check_supported(
    path: &Path,
    sub: Option<BorrowedFd<'_>>,
    dir: BorrowedFd<'_>,
    name: &OsStr,
) -> Result<(), CaptureError> {
    let (found, feature) = match sub {
        Some(fd) => (
            at::fgetxattr(fd, OsStr::new("trusted.overlay.redirect")),
            "redirect_dir",
        ),
        None => (
            sys::lgetxattr(
                &at::proc_path(dir, name),
                OsStr::new("trusted.overlay.metacopy"),
            ),
            "metacopy",
        ),
    };
    if found.ok().flatten().is_some() {
        return Err(CaptureError::Unsupported {
            path: path.into(),
            feature,
        });
    }
    Ok(())
}

/// A hardlinked inode is written with all its names, so the layer keeps the link count.
fn add_link_partners(plan: &mut Plan) {
    let copied: HashSet<&String> = plan
        .actions
        .iter()
        .filter(|(_, a)| matches!(a, Action::Copy))
        .map(|(r, _)| r)
        .collect();
    let linked: HashSet<u64> = copied
        .iter()
        .map(|r| &plan.index[*r])
        .filter(|e| e.nlink > 1 && !e.is_dir())
        .map(|e| e.ino)
        .collect();
    if linked.is_empty() {
        return;
    }
    let extra: Vec<String> = plan
        .index
        .iter()
        .filter(|(r, e)| {
            e.nlink > 1
                && linked.contains(&e.ino)
                && !copied.contains(r)
                && !copy::is_whiteout(&plan.metas[*r])
        })
        .map(|(r, _)| r.clone())
        .collect();
    plan.actions
        .extend(extra.into_iter().map(|r| (r, Action::Copy)));
}

/// Whiteouts for nodes that were in the upper at the parent instant and are gone now.
fn add_deletions(old: &BTreeMap<String, IndexEntry>, plan: &mut Plan) -> u64 {
    let mut n = 0;
    for rel in old.keys() {
        if plan.index.contains_key(rel) {
            continue;
        }
        let up = parent_of(rel);
        let parent_is_live_dir = up.is_empty() || plan.index.get(up).is_some_and(|e| e.is_dir());
        if parent_is_live_dir && !plan.full_dirs.contains(up) {
            plan.actions.push((rel.clone(), Action::Whiteout));
            n += 1;
        }
    }
    n
}

/// Creates the directories from the layer root down to `rel` that are not there yet.
fn ensure_dirs(
    walk: &mut Walk<'_>,
    out: &Path,
    rel: &str,
    plan: &Plan,
    created: &mut HashSet<String>,
    copier: &mut Copier,
) -> Result<(), CaptureError> {
    if created.contains(rel) {
        return Ok(());
    }
    ensure_dirs(walk, out, parent_of(rel), plan, created, copier)?;
    let rel_path = decode_path(rel);
    let dst = out.join(&rel_path);
    let path = walk.upper.join(&rel_path);
    let fd = walk.dir(rel, &plan.metas)?;
    let src = Source::Open { fd, path: &path };
    copier.copy_node(&src, &dst, &plan.metas[rel])?;
    if plan.opaque_dirs.contains(rel) {
        copy::set_opaque(&dst)?;
    }
    created.insert(rel.to_string());
    Ok(())
}
