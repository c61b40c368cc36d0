//! Shared helpers for the integration tests: prerequisites, shell steps, mount guards.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Fails (never skips) when a tool the test needs is missing.
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "prerequisite missing: `{name}` is not on PATH (see DESIGN.md §7)"
    );
}

/// Fails unless running as root (overlay mounts, chown, trusted xattrs need it).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "prerequisite missing: these tests need root (overlayfs, chown, trusted.* xattrs)"
    );
}

/// Runs `script` with bash in `dir`, panicking with its stderr on failure.
pub fn sh(dir: &Path, script: &str) {
    let out = Command::new("bash")
        .arg("-euc")
        .arg(script)
        .current_dir(dir)
        .output()
        .expect("spawn bash");
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

/// A busybox container on an overlay rootfs, run by real runc. Dropping it kills and deletes
/// the container and unmounts the rootfs (also when the test fails).
pub struct Container {
    pub runc: criu_bridge::runc::Runc,
    pub id: String,
    pub bundle: PathBuf,
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub rootfs: PathBuf,
    /// Other containers (forks) and mounts to clean up.
    pub extra_ids: std::cell::RefCell<Vec<String>>,
    pub extra_mounts: std::cell::RefCell<Vec<PathBuf>>,
}

/// Writes a busybox image lower dir.
pub fn busybox_lower(lower: &Path) {
    require_tool("busybox");
    std::fs::create_dir_all(lower.join("bin")).unwrap();
    std::fs::copy(which("busybox"), lower.join("bin/busybox")).unwrap();
    sh(
        lower,
        "for a in sh sleep cat echo ls nc seq wc head dd rm mkdir base64; do ln -s busybox bin/$a; done; \
         mkdir -p proc sys dev tmp etc data; echo root:x:0:0::/:/bin/sh > etc/passwd",
    );
}

pub fn which(name: &str) -> PathBuf {
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("prerequisite missing: `{name}` is not on PATH"))
}

/// Writes `bundle/config.json` running `script` with busybox sh, rootfs at `bundle/rootfs`.
pub fn write_spec(bundle: &Path, script: &str) {
    std::fs::create_dir_all(bundle).unwrap();
    let _ = std::fs::remove_file(bundle.join("config.json"));
    let out = Command::new("runc")
        .arg("spec")
        .current_dir(bundle)
        .output()
        .expect("run `runc spec`");
    assert!(
        out.status.success(),
        "runc spec: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    spec["root"]["readonly"] = false.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

impl Container {
    /// Starts container `id` under `base` running `script`.
    pub fn start(base: &Path, id: &str, script: &str) -> Container {
        require_root();
        require_tool("runc");
        require_tool("iptables-restore");
        let lower = base.join("lower");
        if !lower.exists() {
            busybox_lower(&lower);
        }
        let bundle = base.join(format!("bundle-{id}"));
        write_spec(&bundle, script);
        let upper = base.join(format!("{id}-upper"));
        let rootfs = bundle.join("rootfs");
        criu_bridge::layer::mount_chain(
            std::slice::from_ref(&lower),
            &upper,
            &base.join(format!("{id}-work")),
            &rootfs,
        )
        .expect("mount container rootfs");
        let mut runc = criu_bridge::runc::Runc::new(base.join("runc-root"));
        runc.criu = which("criu");
        let c = Container {
            runc,
            id: id.into(),
            bundle,
            lower,
            upper,
            rootfs,
            extra_ids: Default::default(),
            extra_mounts: Default::default(),
        };
        let out = Command::new("runc")
            .arg("--root")
            .arg(&c.runc.root)
            .arg("--log")
            .arg(base.join(format!("{id}-runc-run.log")))
            .args(["run", "--detach", id])
            .current_dir(&c.bundle)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            // Not a pipe: the container inherits runc's stdio and would hold it open (and CRIU
            // cannot dump a host file as the container's stderr); runc's errors go to --log.
            .stderr(std::process::Stdio::null())
            .status()
            .expect("runc run");
        let err =
            std::fs::read_to_string(base.join(format!("{id}-runc-run.log"))).unwrap_or_default();
        assert!(out.success(), "runc run {id}: {err}");
        c
    }

    pub fn status(&self, id: &str) -> Option<String> {
        self.runc.state(id).ok().map(|s| s.status)
    }

    /// Kills and deletes container `id` (its processes die as in a crash).
    pub fn kill(&self, id: &str) {
        let _ = self.runc.kill(id, "KILL", true);
        for _ in 0..100 {
            if self.status(id).as_deref() != Some("running") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.runc.delete(id, true);
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        for id in self.extra_ids.borrow().iter().chain([&self.id]) {
            let _ = self.runc.resume(id);
            self.kill(id);
        }
        for m in self.extra_mounts.borrow().iter().chain([&self.rootfs]) {
            let _ = criu_bridge::layer::unmount(m);
        }
    }
}

/// Which of `paths` user nobody (uid and gid 65534, no groups) can read, list or run, or fails
/// on for another reason than `EACCES`: each line names the path and what it did.
pub fn reachable_by_nobody(paths: &[PathBuf]) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    const PROBE: &str = r#"for p; do
        for op in cat ls run; do
            case $op in
                cat) out=$(cat -- "$p" 2>&1 >/dev/null) ;;
                ls) out=$(ls -- "$p" 2>&1 >/dev/null) ;;
                run) out=$("$p" 2>&1 >/dev/null) ;;
            esac && { echo "$op $p: succeeded"; continue; }
            case $out in *"Permission denied"*) ;; *) echo "$op $p: $out" ;; esac
        done
    done"#;
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(PROBE)
        .arg("probe")
        .args(paths)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run the probe as nobody");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
