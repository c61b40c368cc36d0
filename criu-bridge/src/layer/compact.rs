//! Compaction: merging a chain of layers (oldest → newest) into one equivalent layer, so long
//! chains do not hit overlay's lower-dir limits or lookup cost.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::at::Stat;
use super::copy::{self, Copier, CopyError, Source};

/// Why a compaction failed.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    /// No layer was given.
    #[error("no layers to compact")]
    Empty,
    /// The output dir already exists.
    #[error("compacted layer dir {0} already exists")]
    Exists(PathBuf),
    /// A source layer could not be read.
    #[error("cannot read layer {path}")]
    ReadLayer {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The disk filled up.
    #[error("disk full while writing the compacted layer ({0})")]
    DiskFull(#[source] CopyError),
    /// Writing the compacted layer failed.
    #[error("cannot write the compacted layer")]
    Copy(#[source] CopyError),
}

impl From<CopyError> for CompactError {
    fn from(e: CopyError) -> Self {
        if e.is_disk_full() {
            Self::DiskFull(e)
        } else {
            Self::Copy(e)
        }
    }
}

/// Merges `layers` (oldest first) into the new layer dir `out`, which, mounted over the image
/// lower dirs, shows the same tree as the whole chain. `image_lowers` is everything that lies
/// below the oldest layer (empty: nothing). A whiteout is kept only where it hides something: some
/// image lower dir has the path and no opaque directory above it in the result hides it anyway.
/// (A whiteout in a directory that is not merged at mount time is listed by readdir as a name
/// that cannot be looked up.)
///
/// Link counts: a hardlinked file whose partner a later layer replaced shows its real link count
/// in the compacted layer, where the chain showed the count of the older layer's inode.
pub fn compact_layers(
    layers: &[PathBuf],
    image_lowers: &[PathBuf],
    out: &Path,
) -> Result<Duration, CompactError> {
    let start = Instant::now();
    if layers.is_empty() {
        return Err(CompactError::Empty);
    }
    if fs::symlink_metadata(out).is_ok() {
        return Err(CompactError::Exists(out.into()));
    }
    let mut copier = Copier::default();
    let root = read_meta(&layers[0])?;
    copier.copy_node(&Source::Path(&layers[0]), out, &root)?;
    for layer in layers {
        copier.reset_links();
        let meta = read_meta(layer)?;
        copier.update_dir(layer, out, &meta)?;
        apply_dir(layer, out, Path::new(""), image_lowers, false, &mut copier)?;
    }
    copier.finish()?;
    Ok(start.elapsed())
}

fn read_meta(path: &Path) -> Result<Stat, CompactError> {
    fs::symlink_metadata(path)
        .map(|m| Stat::from(&m))
        .map_err(|source| CompactError::ReadLayer {
            path: path.into(),
            source,
        })
}

fn apply_dir(
    layer: &Path,
    out: &Path,
    rel: &Path,
    image: &[PathBuf],
    hidden_below: bool,
    copier: &mut Copier,
) -> Result<(), CompactError> {
    let dir = layer.join(rel);
    let read_err = |source| CompactError::ReadLayer {
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
        let child = rel.join(&name);
        let src = layer.join(&child);
        let dst = out.join(&child);
        let meta = read_meta(&src)?;
        if copy::is_whiteout(&meta) {
            copy::remove_any(&dst)?;
            if !hidden_below
                && image
                    .iter()
                    .any(|l| fs::symlink_metadata(l.join(&child)).is_ok())
            {
                copy::make_whiteout(&dst)?;
            }
        } else if meta.is_dir() {
            let existing = fs::symlink_metadata(&dst).ok();
            if copy::is_opaque(&src)? {
                copy::remove_any(&dst)?;
                copier.copy_node(&Source::Path(&src), &dst, &meta)?;
                copy::set_opaque(&dst)?;
            } else if existing.as_ref().is_some_and(|m| m.is_dir()) {
                copier.update_dir(&src, &dst, &meta)?;
            } else if existing.is_some() {
                // A directory over a non-directory hides everything below it.
                copy::remove_any(&dst)?;
                copier.copy_node(&Source::Path(&src), &dst, &meta)?;
                copy::set_opaque(&dst)?;
            } else {
                copier.copy_node(&Source::Path(&src), &dst, &meta)?;
            }
            let hidden = hidden_below || copy::is_opaque(&dst)?;
            apply_dir(layer, out, &child, image, hidden, copier)?;
        } else {
            copy::remove_any(&dst)?;
            copier.copy_node(&Source::Path(&src), &dst, &meta)?;
        }
    }
    Ok(())
}
