//! Shared helpers for the integration tests: prerequisites, shell steps, mount guards.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Fails (never skips) when a tool the test needs is missing.
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(found, "prerequisite missing: `{name}` is not on PATH (see DESIGN.md §7)");
}

/// Fails unless running as root (overlay mounts, chown, trusted xattrs need it).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "prerequisite missing: these tests need root (overlayfs, chown, trusted.* xattrs)");
}

/// Runs `script` with bash in `dir`, panicking with its stderr on failure.
pub fn sh(dir: &Path, script: &str) {
    let out = Command::new("bash").arg("-euc").arg(script).current_dir(dir).output().expect("spawn bash");
    assert!(
        out.status.success(),
        "shell step failed in {}:\n{script}\nstderr: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Unmounts its mount point when dropped (also when the test panics).
pub struct MountGuard(pub PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = criu_bridge::layer::unmount(&self.0);
    }
}

/// Mounts `lowers` (newest first) with a fresh upper/work under `base`/`name`-{upper,work,merged}.
pub fn mount_fresh(base: &Path, name: &str, lowers: &[PathBuf]) -> (MountGuard, PathBuf, PathBuf) {
    let upper = base.join(format!("{name}-upper"));
    let work = base.join(format!("{name}-work"));
    let merged = base.join(format!("{name}-merged"));
    criu_bridge::layer::mount_chain(lowers, &upper, &work, &merged).expect("mount overlay");
    (MountGuard(merged.clone()), upper, merged)
}
