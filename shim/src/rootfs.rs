//! A container's root filesystem: mounting containerd's mounts, finding the overlay behind it
//! (upper and lower dirs, for checkpoints), unmounting.

use std::path::{Path, PathBuf};

use containerd_shim::protos::api::Mount;
use log::warn;

use crate::error::{Error, Result, io};

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs`, in order.
pub async fn mount(bundle: &Path, mounts: &[Mount]) -> Result<Option<PathBuf>> {
    if mounts.is_empty() {
        return Ok(None);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target).map_err(io(format!("create {}", target.display())))?;
    for m in mounts {
        if let Err(source) = containerd_shim::util::mount_rootfs(m, &target).await {
            unmount(&target);
            return Err(Error::Shim {
                context: format!(
                    "mount rootfs ({} from {}) at {}",
                    m.type_,
                    m.source,
                    target.display()
                ),
                source,
            });
        }
    }
    Ok(Some(target))
}

/// Unmounts everything at and below `target`.
pub fn unmount(target: &Path) {
    if let Err(e) = containerd_shim::mount::umount_recursive(target.to_str(), libc::MNT_DETACH) {
        warn!("unmount {}: {e}", target.display());
    }
}

/// Makes the mount at `target` shared (a peer group of its own, unless it is in one already).
pub fn make_shared(target: &Path) -> Result<()> {
    nix::mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        nix::mount::MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(|e| io(format!("make {} a shared mount", target.display()))(e.into()))
}

/// Unmounts everything at and below `target` at once, and lets the old filesystem go later, on
/// a thread of its own. The last reference to an overlay syncs its whole upper filesystem:
/// hundreds of milliseconds after an episode wrote files, and done at once it slowed the restore
/// beside it by a third. Held until the kernel's periodic writeback has flushed that data (its
/// `dirty_expire_centisecs`, plus a margin), the final sync finds little left to write. `target`
/// is free for a new mount when this returns.
pub fn unmount_detached(target: &Path) {
    // An open descriptor keeps the detached mount alive until the thread closes it.
    let pin = std::fs::File::open(target).ok();
    unmount(target);
    if let Some(pin) = pin {
        let hold = release_after();
        std::thread::spawn(move || {
            std::thread::sleep(hold);
            drop(pin)
        });
    }
}

/// How long a detached rootfs is held: the kernel's dirty-data expiry plus 5 s (35 s by default),
/// at most a minute.
fn release_after() -> std::time::Duration {
    let centisecs = std::fs::read_to_string("/proc/sys/vm/dirty_expire_centisecs")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(3000);
    std::time::Duration::from_millis((centisecs * 10 + 5000).min(60_000))
}

/// The overlay mounted at a rootfs: its writable upper dir and its lower dirs, newest first.
#[derive(Clone, Debug, PartialEq)]
pub struct Overlay {
    pub upper: PathBuf,
    pub lowers: Vec<PathBuf>,
    /// The mount is in a peer group (`shared:N`): the container's root is then a slave of it,
    /// and CRIU restores it as one.
    pub shared: bool,
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            out.push(u8::from_str_radix(&s[i + 1..i + 4], 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Finds the overlay mounted at `target` in `mountinfo` (the topmost one if several).
pub fn overlay_at(mountinfo: &str, target: &Path) -> Option<Overlay> {
    let target = target.to_str()?;
    mountinfo.lines().rev().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if unescape(pre.split_whitespace().nth(4)?) != target {
            return None;
        }
        let shared = pre.split_whitespace().any(|f| f.starts_with("shared:"));
        let mut post = post.split_whitespace();
        if post.next()? != "overlay" {
            return None;
        }
        let opts = post.nth(1)?;
        let mut upper = None;
        let mut lowers = Vec::new();
        for opt in opts.split(',') {
            if let Some(u) = opt.strip_prefix("upperdir=") {
                upper = Some(PathBuf::from(unescape(u)));
            } else if let Some(l) = opt.strip_prefix("lowerdir=") {
                lowers.extend(l.split(':').map(|p| PathBuf::from(unescape(p))));
            } else if let Some(l) = opt.strip_prefix("lowerdir+=") {
                lowers.push(PathBuf::from(unescape(l)));
            }
        }
        Some(Overlay {
            upper: upper?,
            lowers,
            shared,
        })
    })
}

/// The lower dirs (newest first) of the image snapshot a container is created on: those of the
/// overlay among containerd's `mounts`, or of the overlay already mounted at `rootfs` when
/// containerd mounted it; `None` when it is no overlay.
pub fn snapshot_lowers(mounts: &[Mount], rootfs: &Path) -> Option<Vec<PathBuf>> {
    if mounts.is_empty() {
        return overlay(rootfs).ok().map(|o| o.lowers);
    }
    mounts
        .iter()
        .filter(|m| m.type_ == "overlay")
        .find_map(|m| {
            m.options
                .iter()
                .find_map(|o| o.strip_prefix("lowerdir="))
                .map(|l| l.split(':').map(PathBuf::from).collect())
        })
}

/// The overlay behind the container's rootfs, or why there is none.
pub fn overlay(rootfs: &Path) -> Result<Overlay> {
    let info =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(io("read /proc/self/mountinfo"))?;
    overlay_at(&info, rootfs).ok_or_else(|| {
        Error::FailedPrecondition(format!(
            "rootfs {} is not a writable overlay mount; Belayer checkpoints need an overlay snapshotter",
            rootfs.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_lowers_are_containerd_s_overlay_lowerdirs() {
        let mount = |type_: &str, options: &[&str]| Mount {
            type_: type_.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        };
        let overlay = mount(
            "overlay",
            &[
                "index=off",
                "workdir=/s/9/work",
                "upperdir=/s/9/fs",
                "lowerdir=/s/2/fs:/s/1/fs",
            ],
        );
        assert_eq!(
            snapshot_lowers(&[overlay], Path::new("/nowhere")),
            Some(vec![PathBuf::from("/s/2/fs"), PathBuf::from("/s/1/fs")])
        );
        let bind = mount("bind", &["rbind", "rw"]);
        assert_eq!(snapshot_lowers(&[bind], Path::new("/nowhere")), None);
        assert_eq!(snapshot_lowers(&[], Path::new("/nowhere")), None);
    }

    #[test]
    fn finds_the_topmost_overlay() {
        let info = "\
36 25 0:32 / /run/b/rootfs rw,relatime shared:1 - overlay overlay rw,lowerdir=/s/2/fs:/s/1/fs,upperdir=/s/3/fs,workdir=/s/3/work
37 36 0:33 / /run/b/rootfs rw,relatime - overlay overlay rw,lowerdir=/c/2:/c/1:/s/1/fs,upperdir=/u/upper,workdir=/u/work
38 25 0:34 / /run/other rw - tmpfs tmpfs rw
";
        let o = overlay_at(info, Path::new("/run/b/rootfs")).unwrap();
        assert_eq!(o.upper, PathBuf::from("/u/upper"));
        assert!(!o.shared);
        assert!(
            overlay_at(
                &info.replace("relatime -", "relatime shared:7 -"),
                Path::new("/run/b/rootfs")
            )
            .unwrap()
            .shared
        );
        assert_eq!(
            o.lowers,
            vec![
                PathBuf::from("/c/2"),
                PathBuf::from("/c/1"),
                PathBuf::from("/s/1/fs")
            ]
        );
        assert!(overlay_at(info, Path::new("/run/other")).is_none());
    }

    #[test]
    fn unescapes_spaces() {
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
