//! Mounting a fresh overlay over a layer chain: lowerdirs = [chain newest-first, image lowers],
//! an empty upper and work dir, so the cost does not grow with the size of the layers.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sys;

/// Overlay's limit on stacked lower dirs.
pub const MAX_LOWER_DIRS: usize = 500;

/// Why mounting a layer chain failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// No lower dir was given.
    #[error("no lower dirs to mount")]
    NoLowers,
    /// More lower dirs than overlay stacks.
    #[error("{count} lower dirs exceed overlay's limit of {MAX_LOWER_DIRS}; compact the chain")]
    TooManyLowers {
        /// Number of lower dirs.
        count: usize,
    },
    /// A path contains a character overlay's option syntax cannot carry.
    #[error("path {0} contains ',', ':' or '\\', which overlay mount options cannot carry")]
    BadPath(PathBuf),
    /// The option string is longer than one page, the limit of mount(2).
    #[error(
        "overlay options are {len} bytes, over the {limit}-byte page limit of mount(2); compact the chain or use shorter store paths"
    )]
    OptionsTooLong {
        /// Length of the options string (with its NUL).
        len: usize,
        /// The limit (page size).
        limit: usize,
    },
    /// The upper or work dir is not empty.
    #[error("{0} must be an empty directory")]
    NotEmpty(PathBuf),
    /// A lower dir is missing.
    #[error("lower dir {0} is missing")]
    MissingLower(PathBuf),
    /// Preparing a directory failed.
    #[error("cannot prepare {path}")]
    Prepare {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// mount(2) failed.
    #[error("mount overlay at {target} failed (options: {options})")]
    Mount {
        /// Mount point.
        target: PathBuf,
        /// The options passed.
        options: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The option string for an overlay mount, checked against the page-size limit.
pub fn overlay_options(
    lowers: &[PathBuf],
    upper: &Path,
    work: &Path,
) -> Result<String, MountError> {
    if lowers.is_empty() {
        return Err(MountError::NoLowers);
    }
    if lowers.len() > MAX_LOWER_DIRS {
        return Err(MountError::TooManyLowers {
            count: lowers.len(),
        });
    }
    let all = lowers.iter().map(PathBuf::as_path).chain([upper, work]);
    for p in all {
        if p.as_os_str()
            .as_bytes()
            .iter()
            .any(|b| matches!(b, b',' | b':' | b'\\'))
        {
            return Err(MountError::BadPath(p.into()));
        }
    }
    let lower: Vec<_> = lowers.iter().map(|p| p.display().to_string()).collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={},redirect_dir=off,metacopy=off,index=off",
        lower.join(":"),
        upper.display(),
        work.display()
    );
    let limit = sys::page_size();
    if options.len() + 1 > limit {
        return Err(MountError::OptionsTooLong {
            len: options.len() + 1,
            limit,
        });
    }
    Ok(options)
}

fn prepare_empty(dir: &Path) -> Result<(), MountError> {
    let prep = |source| MountError::Prepare {
        path: dir.into(),
        source,
    };
    fs::create_dir_all(dir).map_err(prep)?;
    if fs::read_dir(dir).map_err(prep)?.next().is_some() {
        return Err(MountError::NotEmpty(dir.into()));
    }
    Ok(())
}

/// Mounts at `target` an overlay of `lowers` (newest first: the checkpoint chain, then the image
/// lower dirs) with the empty `upper` and `work` dirs (created if missing). When the option
/// string would pass the page-size limit of mount(2), the new mount API (`fsconfig`
/// `lowerdir+`, Linux ≥ 6.8) is used instead; up to [`MAX_LOWER_DIRS`] either way. The fresh
/// upper's root takes the owner and mode of the newest lower's root, so `/` looks as it did.
pub fn mount_chain(
    lowers: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
) -> Result<Duration, MountError> {
    let start = Instant::now();
    // Past the page limit of mount(2), the new mount API takes the lower dirs one by one.
    let options = match overlay_options(lowers, upper, work) {
        Err(MountError::OptionsTooLong { .. }) => None,
        r => Some(r?),
    };
    for l in lowers {
        if !l.is_dir() {
            return Err(MountError::MissingLower(l.clone()));
        }
    }
    prepare_empty(upper)?;
    prepare_empty(work)?;
    fs::create_dir_all(target).map_err(|source| MountError::Prepare {
        path: target.into(),
        source,
    })?;
    let top = fs::symlink_metadata(&lowers[0]).map_err(|source| MountError::Prepare {
        path: lowers[0].clone(),
        source,
    })?;
    let prep = |source| MountError::Prepare {
        path: upper.into(),
        source,
    };
    std::os::unix::fs::lchown(upper, Some(top.uid()), Some(top.gid())).map_err(prep)?;
    fs::set_permissions(
        upper,
        std::os::unix::fs::PermissionsExt::from_mode(top.mode() & 0o7777),
    )
    .map_err(prep)?;
    let mtime = (top.mtime(), top.mtime_nsec());
    sys::set_times(upper, mtime, mtime).map_err(prep)?;
    let result = match &options {
        Some(o) => sys::mount_overlay(target, o),
        None => sys::mount_overlay_fsconfig(
            target,
            lowers,
            &[
                ("upperdir", upper),
                ("workdir", work),
                ("redirect_dir", Path::new("off")),
                ("metacopy", Path::new("off")),
                ("index", Path::new("off")),
            ],
        ),
    };
    result.map_err(|source| MountError::Mount {
        target: target.into(),
        options: options.unwrap_or_else(|| {
            format!(
                "fsconfig: {} × lowerdir+, upperdir={}, workdir={}",
                lowers.len(),
                upper.display(),
                work.display()
            )
        }),
        source,
    })?;
    let took = start.elapsed();
    tracing::debug!(target = %target.display(), lowers = lowers.len(), ?took, "overlay mounted");
    Ok(took)
}

/// Unmounts an overlay mounted by [`mount_chain`] (lazily if it is busy).
pub fn unmount(target: &Path) -> std::io::Result<()> {
    match sys::umount(target, false) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => sys::umount(target, true),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_chain_newest_first() {
        let o = overlay_options(
            &["/s/3/fs".into(), "/s/1/fs".into(), "/img".into()],
            Path::new("/u"),
            Path::new("/w"),
        )
        .unwrap();
        assert!(
            o.starts_with("lowerdir=/s/3/fs:/s/1/fs:/img,upperdir=/u,workdir=/w,"),
            "{o}"
        );
    }

    #[test]
    fn options_over_a_page_are_refused() {
        let long: Vec<PathBuf> = (0..100)
            .map(|i| format!("/var/lib/belayer/checkpoints/default/container-{i:04}/fs").into())
            .collect();
        let err = overlay_options(&long, Path::new("/u"), Path::new("/w")).unwrap_err();
        assert!(
            matches!(err, MountError::OptionsTooLong { limit, .. } if limit == sys::page_size()),
            "{err}"
        );
        assert!(err.to_string().contains("compact"), "{err}");
    }

    #[test]
    fn separators_in_paths_are_refused() {
        for bad in ["/a:b", "/a,b", "/a\\b"] {
            let err = overlay_options(&[bad.into()], Path::new("/u"), Path::new("/w")).unwrap_err();
            assert!(matches!(err, MountError::BadPath(_)), "{bad}: {err}");
        }
        let many: Vec<PathBuf> = (0..=MAX_LOWER_DIRS)
            .map(|i| format!("/{i}").into())
            .collect();
        assert!(matches!(
            overlay_options(&many, Path::new("/u"), Path::new("/w")),
            Err(MountError::TooManyLowers { .. })
        ));
    }
}
