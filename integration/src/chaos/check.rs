//! The soak's invariants on the host side: every listed checkpoint verifies (sha256 of every
//! file its manifest records, by `sha256sum`, independently of Belayer's own verifier), the store
//! keeps within its retention bound, and nothing is left behind once the sandboxes are gone.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::Containerd;

/// The manifest of checkpoint `cp` of container `id`, parsed.
pub fn manifest(c: &Containerd, id: &str, cp: &str) -> Result<serde_json::Value, String> {
    let path = c.checkpoints_dir(id).join(cp).join("manifest.json");
    let text = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// How long checkpoint `cp` kept its container frozen, in microseconds (its manifest's
/// `timings.frozen_us`).
pub fn frozen_us(c: &Containerd, id: &str, cp: &str) -> Option<u64> {
    manifest(c, id, cp).ok()?["timings"]["frozen_us"].as_u64()
}

/// Checks every regular file checkpoint `cp`'s manifest records against its sha256; `Err` names
/// the first file that differs or is missing.
pub fn verify(c: &Containerd, id: &str, cp: &str) -> Result<(), String> {
    let dir = c.checkpoints_dir(id).join(cp);
    let m = manifest(c, id, cp)?;
    let mut expected = BTreeMap::new();
    for f in m["files"].as_array().into_iter().flatten() {
        if f["kind"] != "f" {
            continue;
        }
        let (Some(path), Some(sum)) = (f["path"].as_str(), f["sha256"].as_str()) else {
            continue;
        };
        expected.insert(
            path.to_string(),
            sum.trim_start_matches("sha256:").to_string(),
        );
    }
    if expected.is_empty() {
        return Err(format!(
            "checkpoint {cp} of {id}: the manifest records no file"
        ));
    }
    let got = sha256sums(&dir, expected.keys().map(String::as_str))?;
    for (path, sum) in &expected {
        match got.get(path) {
            None => return Err(format!("checkpoint {cp} of {id}: {path} is missing")),
            Some(g) if g != sum => {
                return Err(format!(
                    "checkpoint {cp} of {id}: {path} has sha256 {g}, the manifest says {sum}"
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// [`verify`], looked at again (up to twice, 300 ms apart) when it fails: a compaction swaps a
/// checkpoint's dir for a merged one (`RENAME_EXCHANGE`) and removes the old one, which a
/// `sha256sum` begun in the old dir then finds half gone. A failure that stays is real.
pub fn verify_settled(c: &Containerd, id: &str, cp: &str) -> Result<(), String> {
    let mut result = verify(c, id, cp);
    for _ in 0..2 {
        if result.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        result = verify(c, id, cp);
    }
    result
}

/// The manifest's size and modification time: what changes when a compaction rewrites it.
pub fn manifest_stamp(c: &Containerd, id: &str, cp: &str) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(c.checkpoints_dir(id).join(cp).join("manifest.json")).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// `sha256sum` of `paths` relative to `dir`: path → hex digest (missing files are absent).
fn sha256sums<'a>(
    dir: &Path,
    paths: impl Iterator<Item = &'a str>,
) -> Result<BTreeMap<String, String>, String> {
    let out = Command::new("sha256sum")
        .arg("--")
        .args(paths)
        .current_dir(dir)
        .output()
        .map_err(|e| format!("sha256sum: {e}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (sum, path) = l.split_once("  ")?;
            Some((path.to_string(), sum.to_string()))
        })
        .collect())
}

/// Checkpoint ids listed by `belayer checkpoints`, oldest first.
pub fn listed(c: &Containerd, id: &str) -> Vec<String> {
    c.belayer(&["checkpoints", id])
        .stdout
        .lines()
        .map(str::to_string)
        .collect()
}

/// Checkpoint directories of `id` on disk (not the pending `.tmp-*` ones).
pub fn on_disk(c: &Containerd, id: &str) -> Vec<String> {
    names_under(&c.checkpoints_dir(id))
        .into_iter()
        .filter(|n| !n.starts_with('.'))
        .collect()
}

/// Staging directories (`.tmp-*`) under the namespace's part of the store.
pub fn staging_dirs(c: &Containerd) -> Vec<String> {
    let ns_dir = c.store.join("checkpoints").join(&c.ns);
    let mut found = Vec::new();
    for container in names_under(&ns_dir) {
        for n in names_under(&ns_dir.join(&container)) {
            if n.starts_with(".tmp-") {
                found.push(format!("{container}/{n}"));
            }
        }
    }
    found
}

fn names_under(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The mount table containerd sees: the host's (this process's) unless it runs in a namespace
/// of its own ([`Containerd::unified`]); not by [`Containerd::pid`], which names the first
/// containerd, gone after a `containerd-restart` fault.
fn mountinfo(c: &Containerd) -> String {
    if c.unified {
        format!("/proc/{}/mountinfo", c.pid())
    } else {
        "/proc/self/mountinfo".into()
    }
}

/// Overlay mounts that stack layers of this containerd's store, in containerd's mount namespace.
pub fn store_mounts(c: &Containerd) -> Vec<String> {
    let store = c.store.display().to_string();
    std::fs::read_to_string(mountinfo(c))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" - overlay ") && l.contains(&store))
        .map(|l| l.split_whitespace().nth(4).unwrap_or_default().to_string())
        .collect()
}

/// What is left once every container of the namespace is gone: store mounts, rootfs mounts
/// under containerd's dir, shims, CRIU processes of this store, container cgroups, staging
/// dirs, runc state, task work dirs of `ids`. Empty when nothing leaked.
pub fn leaks(c: &Containerd, ids: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for m in store_mounts(c) {
        left.push(format!("store overlay mount {m}"));
    }
    for m in crate::leaks::mounts_under_in(&mountinfo(c), &c.dir) {
        if m.contains("/rootfs") {
            left.push(format!("rootfs mount {m}"));
        } else if m.contains("/.criu.") {
            // CRIU's cgroup yard or mount-namespace scratch of a restore, not unmounted.
            left.push(format!("CRIU mount {m}"));
        }
    }
    for pid in c.ns_shims_of(&c.ns) {
        left.push(format!("shim pid {pid}"));
    }
    let store = c.store.display().to_string();
    for pid in crate::leaks::pids_mentioning(&store) {
        left.push(format!("process {pid} mentioning the store"));
    }
    for cg in crate::leaks::cgroups_of_namespace(&c.ns) {
        left.push(format!("cgroup {cg}"));
    }
    for d in staging_dirs(c) {
        left.push(format!("staging dir {d}"));
    }
    for d in crate::leaks::runc_state(&c.ns) {
        left.push(format!("runc state {}", d.display()));
    }
    for id in ids {
        if c.task_work_dir(id).exists() {
            left.push(format!("task work dir of {id}"));
        }
    }
    left
}

/// The fewest open fds `pid` had over a few samples 200 ms apart: a checkpoint or exec in
/// flight holds pipes for a moment; a leak stays.
pub fn settled_fd_count(pid: u32) -> usize {
    (0..5)
        .map(|i| {
            if i > 0 {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            crate::leaks::fd_count(pid)
        })
        .min()
        .unwrap_or(0)
}

/// What `pid`'s open fds point at, counted by kind (`pipe`, `socket`, an anon inode's name, or
/// the path): a leak's description, readable after the process is gone.
pub fn fd_kinds(pid: u32) -> String {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let target = std::fs::read_link(e.path())
            .map(|t| t.display().to_string())
            .unwrap_or_else(|_| "?".into());
        let kind = match target.split_once(":[") {
            Some((k, _)) if k == "pipe" || k == "socket" => k.to_string(),
            _ => target,
        };
        *kinds.entry(kind).or_default() += 1;
    }
    kinds
        .iter()
        .map(|(k, n)| format!("{n}× {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}
