//! podman's `container checkpoint --export` / `container restore --import` on the same episode,
//! with a private storage root so nothing touches the host's podman state.
//!
//! Flags this machine needs: `--ulimit nofile=20000:20000` (the hard limit here; podman's default
//! is higher and root lacks CAP_SYS_RESOURCE) and `--ulimit nproc=4096:4096` (runc cannot set
//! podman's default RLIMIT_NPROC here either). `--network none`: loopback only, as `ctr run`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::bench::check::{self, Checks};
use crate::bench::stats::Samples;
use crate::containerd::{Out, run as run_cmd};
use crate::episode::{Action, SANDBOX};
use crate::{leaks, prereq};

/// Whether podman is on PATH.
pub fn installed() -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("podman").is_file()))
}

/// A private podman: its own root, runroot and tmpdir under one directory, removed on drop.
pub struct Podman {
    dir: PathBuf,
}

impl Podman {
    /// Creates the private root and loads the sandbox image into it.
    pub fn start() -> Result<Self, String> {
        let dir = PathBuf::from(format!("/tmp/belayer-it-{}-podman", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let p = Self { dir };
        let image = prereq::images_dir().join("sandbox.tar");
        let out = p.cmd(&["load", "-i", &image.display().to_string()]);
        if out.code != 0 {
            return Err(format!(
                "podman load {}: {}",
                image.display(),
                out.stderr.trim()
            ));
        }
        Ok(p)
    }

    fn command(&self, args: &[&str]) -> Command {
        let d = self.dir.display();
        let mut cmd = Command::new("podman");
        cmd.args([
            "--root",
            &format!("{d}/root"),
            "--runroot",
            &format!("{d}/run"),
        ])
        .args([
            "--tmpdir",
            &format!("{d}/tmp"),
            "--storage-driver",
            "overlay",
        ])
        .args(["--cgroup-manager", "cgroupfs", "--events-backend", "file"])
        .args(args);
        cmd
    }

    pub fn cmd(&self, args: &[&str]) -> Out {
        run_cmd(&mut self.command(args), None, Duration::from_secs(300))
    }

    fn exec(&self, name: &str, script: &str, stdin: Option<&[u8]>) -> Out {
        let mut cmd = self.command(&["exec", "-i", name, "sh", "-c", script]);
        run_cmd(&mut cmd, stdin, Duration::from_secs(300))
    }

    fn running(&self, name: &str) -> bool {
        self.cmd(&["inspect", "-f", "{{.State.Running}}", name])
            .stdout
            .trim()
            == "true"
    }

    /// Starts container `name` and runs the episode in it.
    fn episode(&self, name: &str, actions: &[Action]) -> Result<(), String> {
        let out = self.cmd(&[
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "none",
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=4096:4096",
            SANDBOX,
            "sleep",
            "infinity",
        ]);
        if out.code != 0 {
            return Err(format!("podman run: {}", out.stderr.trim()));
        }
        for a in actions {
            let out = self.exec(name, &a.script, a.stdin.as_deref());
            if out.code != 0 {
                return Err(format!(
                    "action {} under podman: {}",
                    a.name,
                    out.stderr.trim()
                ));
            }
        }
        Ok(())
    }

    /// Times `restore` until podman reports `restored` running and until its memory is intact;
    /// records both under `key` and checks the container like every other side's.
    #[allow(clippy::too_many_arguments)]
    fn timed_restore(
        &self,
        run: u32,
        key: &str,
        what: &str,
        restored: &str,
        restore: &[&str],
        samples: &mut Samples,
        checks: &mut Checks,
    ) -> bool {
        let start = Instant::now();
        let out = self.cmd(restore);
        let running = out.code == 0 && self.running(restored);
        let secs = start.elapsed().as_secs_f64();
        checks.record(
            "podman",
            run,
            restored,
            &format!("{what} runs the container"),
            running,
            format!("{out:?}"),
        );
        if !running {
            return false;
        }
        let pid = self
            .cmd(&["inspect", "-f", "{{.State.Pid}}", restored])
            .stdout
            .trim()
            .parse()
            .ok();
        let exec = |s: &str| self.exec(restored, s, None);
        let digest = check::digest_after_restore(checks, "podman", run, restored, pid, &exec);
        let memory = start.elapsed().as_secs_f64();
        samples.push(key, secs);
        samples.push(&format!("{key}_memory"), memory);
        eprintln!("  {what}: running {secs:.2}s, memory intact {memory:.2}s");
        check::restored(checks, "podman", run, restored, &digest, &exec);
        true
    }

    /// One run, both of podman's paths: `container checkpoint` + `container restore` of the same
    /// container on this host (local), and `checkpoint --export`, the container removed (a
    /// crash), `restore --import` into a new one; each restore timed until podman reports it
    /// running and until its memory is intact, and checked.
    pub fn measure(
        &self,
        run: u32,
        actions: &[Action],
        samples: &mut Samples,
        checks: &mut Checks,
    ) -> Result<(), String> {
        let name = format!("podman-{run}");
        self.episode(&name, actions)?;
        let start = Instant::now();
        let out = self.cmd(&["container", "checkpoint", &name]);
        let checkpoint = start.elapsed().as_secs_f64();
        checks.record(
            "podman",
            run,
            &name,
            "podman checkpoint (local) succeeds",
            out.code == 0,
            out.stderr.trim(),
        );
        samples.push("podman_checkpoint_local", checkpoint);
        // The checkpoint stopped the container: nothing more can change in it before the
        // restore (the filesystem check still runs).
        self.timed_restore(
            run,
            "podman_restore_local",
            "podman restore (local)",
            &name,
            &["container", "restore", &name],
            samples,
            checks,
        );
        let _ = self.cmd(&["rm", "-f", "-t", "0", &name]);

        let name = format!("podman-{run}-x");
        let restored = format!("{name}-restored");
        let archive = self.dir.join(format!("{name}.tar"));
        let archive_s = archive.display().to_string();
        self.episode(&name, actions)?;
        let start = Instant::now();
        let out = self.cmd(&["container", "checkpoint", "--export", &archive_s, &name]);
        let checkpoint = start.elapsed().as_secs_f64();
        checks.record(
            "podman",
            run,
            &name,
            "podman checkpoint --export succeeds",
            out.code == 0,
            out.stderr.trim(),
        );
        samples.push("podman_checkpoint", checkpoint);
        let _ = self.cmd(&["rm", "-f", "-t", "0", &name]);
        if self.timed_restore(
            run,
            "podman_restore",
            "podman restore --import",
            &restored,
            &[
                "container",
                "restore",
                "--import",
                &archive_s,
                "--name",
                &restored,
            ],
            samples,
            checks,
        ) {
            let size = std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
            samples.push("podman_archive_bytes", size as f64);
        }
        let _ = self.cmd(&["rm", "-f", "-t", "0", &restored]);
        let _ = std::fs::remove_file(&archive);
        Ok(())
    }

    /// The podman version line.
    pub fn version(&self) -> String {
        self.cmd(&["--version"]).stdout.trim().to_string()
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd(&["rm", "-a", "-f", "-t", "0"]);
        for pid in leaks::pids_mentioning(&self.dir.display().to_string()) {
            // A leftover conmon/container process of this private root.
            let _ = crate::sigkill(pid.into());
        }
        leaks::unmount_under(Path::new(&self.dir));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
