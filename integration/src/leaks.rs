//! What a test may leave behind on the host: mounts, processes, cgroups, file descriptors.

use std::path::{Path, PathBuf};

/// Mount points at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    mounts_under_in("/proc/self/mountinfo", dir)
}

/// Mount points at or below `dir` in the mount namespace whose `mountinfo` is at `mountinfo`
/// (`/proc/<pid>/mountinfo`).
pub fn mounts_under_in(mountinfo: &str, dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string(mountinfo)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&prefix))
        .collect()
}

/// Unmounts everything at or below `dir`, deepest first.
pub fn unmount_under(dir: &Path) {
    let mut mounts = mounts_under(dir);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let Ok(c) = std::ffi::CString::new(m) else {
            continue;
        };
        // SAFETY: umount2 takes a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Command lines of all processes, by pid.
fn processes() -> Vec<(u32, Vec<String>)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        Some((pid, args))
    })
    .collect()
}

/// Pids whose command line contains `needle` as consecutive arguments.
pub fn pids_with_args(needle: &[&str]) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|(_, args)| {
            args.windows(needle.len())
                .any(|w| w.iter().zip(needle).all(|(a, b)| a == b))
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Pids whose command line mentions `needle` anywhere.
pub fn pids_mentioning(needle: &str) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|(_, args)| args.iter().any(|a| a.contains(needle)))
        .map(|(pid, _)| pid)
        .collect()
}

/// What runc keeps of the shims' containers in namespace `ns` (one dir per container under
/// the runc root): left behind when a container's delete never ran, or failed.
pub fn runc_state(ns: &str) -> Vec<PathBuf> {
    std::fs::read_dir(belayer_api::settings::runc_root(ns))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Number of open file descriptors of `pid`.
pub fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Cgroup directories under `<hierarchy>/<namespace>` in every mounted hierarchy: containerd puts
/// each container's cgroup at `/<namespace>/<id>`.
pub fn cgroups_of_namespace(ns: &str) -> Vec<String> {
    let mut found = Vec::new();
    for root in namespace_cgroup_roots(ns) {
        if let Ok(children) = std::fs::read_dir(&root) {
            found.extend(
                children
                    .filter_map(|c| c.ok())
                    .filter(|c| c.path().is_dir())
                    .map(|c| c.path().display().to_string()),
            );
        }
    }
    found
}

/// `<hierarchy>/<namespace>` in every mounted hierarchy (cgroup v1's several, or v2's one).
fn namespace_cgroup_roots(ns: &str) -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    let mut roots: Vec<_> = std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .filter_map(|h| h.ok().map(|h| h.path().join(ns)))
        .collect();
    roots.push(base.join(ns));
    roots
}

/// Removes the namespace's own cgroup directories, which runc creates as the parents of its
/// containers' cgroups and never removes: every test namespace would otherwise leave one in each
/// hierarchy (ten on cgroup v1), and empty memory cgroups are not free for the kernel, which
/// walks them in reclaim. Only empty ones go (`rmdir` refuses the rest).
pub fn remove_namespace_cgroups(ns: &str) {
    for root in namespace_cgroup_roots(ns) {
        let _ = std::fs::remove_dir(root);
    }
}
