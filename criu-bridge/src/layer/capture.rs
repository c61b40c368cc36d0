//! Capturing what changed in an overlay upper dir since the parent checkpoint as an overlay
//! layer directory (whiteouts, opaque dirs, metadata, hardlinks, sparse data, mtimes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::copy::{self, Copier, CopyError};
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
    metas: HashMap<String, Metadata>,
    actions: Vec<(String, Action)>,
    /// Dirs whose whole content is written (opaque in the layer, or new): deletions below
    /// them need no whiteout.
    full_dirs: HashSet<String>,
    /// Dirs marked opaque in the layer.
    opaque_dirs: HashSet<String>,
}

/// Captures the changes of `upper` since `parent` (the index of the parent checkpoint, if any)
/// into a new layer directory `out`, and returns the index of `upper` now.
///
/// An index made for another upper dir (the container was restored onto a fresh upper since) is
/// ignored: the whole upper is the change, relative to the chain it was mounted on.
/// The container must be frozen (or stopped) while this runs.
pub fn capture_layer(
    upper: &Path,
    parent: Option<&LayerIndex>,
    out: &Path,
) -> Result<(LayerIndex, CaptureStats), CaptureError> {
    let start = Instant::now();
    let identity = UpperIdentity::of(upper).map_err(|source| CaptureError::ReadUpper {
        path: upper.into(),
        source,
    })?;
    let parent = parent.filter(|p| p.upper == identity);
    if fs::symlink_metadata(out).is_ok() {
        return Err(CaptureError::Exists(out.into()));
    }
    let mut plan = Plan {
        index: BTreeMap::new(),
        metas: HashMap::new(),
        actions: Vec::new(),
        full_dirs: HashSet::new(),
        opaque_dirs: HashSet::new(),
    };
    let empty = BTreeMap::new();
    let old = parent.map(|p| &p.entries).unwrap_or(&empty);
    scan_dir(upper, String::new(), old, parent.is_none(), &mut plan)?;
    add_link_partners(&mut plan);
    let deletions = add_deletions(old, &mut plan);

    let mut copier = Copier::default();
    let root_meta = fs::symlink_metadata(upper).map_err(|source| CaptureError::ReadUpper {
        path: upper.into(),
        source,
    })?;
    copier.copy_node(upper, out, &root_meta)?;
    let mut created: HashSet<String> = HashSet::from([String::new()]);
    for (rel, action) in &plan.actions {
        let parent_rel = parent_of(rel);
        ensure_dirs(upper, out, parent_rel, &plan, &mut created, &mut copier)?;
        let dst = out.join(decode_path(rel));
        match action {
            Action::Dir => ensure_dirs(upper, out, rel, &plan, &mut created, &mut copier)?,
            Action::Copy => {
                copy::remove_any(&dst)?;
                copier.copy_node(&upper.join(decode_path(rel)), &dst, &plan.metas[rel])?
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

/// Walks `dir` (relative path `rel`), recording the new index and the actions. `all` means every
/// node below must be written (the dir is new or opaque in the layer).
fn scan_dir(
    upper: &Path,
    rel: String,
    old: &BTreeMap<String, IndexEntry>,
    all: bool,
    plan: &mut Plan,
) -> Result<(), CaptureError> {
    let dir = upper.join(decode_path(&rel));
    let read_err = |source| CaptureError::ReadUpper {
        path: dir.clone(),
        source,
    };
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(read_err)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(read_err)?;
    names.sort();
    for name in names {
        let child = join_rel(&rel, &name);
        let path = dir.join(&name);
        let meta = fs::symlink_metadata(&path).map_err(|source| CaptureError::ReadUpper {
            path: path.clone(),
            source,
        })?;
        let is_dir = meta.is_dir();
        let opaque = is_dir && copy::is_opaque(&path)?;
        let now = IndexEntry::from_meta(&meta, opaque);
        let prev = old.get(&child);
        let changed = all || !prev.is_some_and(|p| p.unchanged(&now));
        if changed {
            check_supported(&path, is_dir)?;
        }
        plan.index.insert(child.clone(), now.clone());
        plan.metas.insert(child.clone(), meta);
        if is_dir {
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
            scan_dir(upper, child, old, full, plan)?;
        } else if changed {
            plan.actions.push((child, Action::Copy));
        }
    }
    Ok(())
}

fn check_supported(path: &Path, is_dir: bool) -> Result<(), CaptureError> {
    let (name, feature) = if is_dir {
        ("trusted.overlay.redirect", "redirect_dir")
    } else {
        ("trusted.overlay.metacopy", "metacopy")
    };
    if sys::lgetxattr(path, OsStr::new(name))
        .ok()
        .flatten()
        .is_some()
    {
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
                && !is_whiteout_meta(&plan.metas[*r])
        })
        .map(|(r, _)| r.clone())
        .collect();
    plan.actions
        .extend(extra.into_iter().map(|r| (r, Action::Copy)));
}

fn is_whiteout_meta(m: &Metadata) -> bool {
    m.mode() & libc::S_IFMT == libc::S_IFCHR && m.rdev() == 0
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
    upper: &Path,
    out: &Path,
    rel: &str,
    plan: &Plan,
    created: &mut HashSet<String>,
    copier: &mut Copier,
) -> Result<(), CaptureError> {
    if created.contains(rel) {
        return Ok(());
    }
    ensure_dirs(upper, out, parent_of(rel), plan, created, copier)?;
    let rel_path = decode_path(rel);
    let dst = out.join(&rel_path);
    copier.copy_node(&upper.join(&rel_path), &dst, &plan.metas[rel])?;
    if plan.opaque_dirs.contains(rel) {
        copy::set_opaque(&dst)?;
    }
    created.insert(rel.to_string());
    Ok(())
}
