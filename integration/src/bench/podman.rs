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

    /// One run: the episode, `checkpoint --export`, the container removed (a crash),
    /// `restore --import` timed until podman reports it running, then checked.
    pub fn measure(
        &self,
        run: u32,
        actions: &[Action],
        samples: &mut Samples,
        checks: &mut Checks,
    ) -> Result<(), String> {
        let name = format!("podman-{run}");
        let restored = format!("{name}-restored");
        let archive = self.dir.join(format!("{name}.tar"));
        let archive_s = archive.display().to_string();
        let out = self.cmd(&[
            "run",
            "-d",
            "--name",
            &name,
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
            let out = self.exec(&name, &a.script, a.stdin.as_deref());
            if out.code != 0 {
                return Err(format!(
                    "action {} under podman: {}",
                    a.name,
                    out.stderr.trim()
                ));
            }
        }
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
        let _ = self.cmd(&["rm", "-f", "-t", "0", &name]);

        let start = Instant::now();
        let out = self.cmd(&[
            "container",
            "restore",
            "--import",
            &archive_s,
            "--name",
            &restored,
        ]);
        let running = out.code == 0 && self.running(&restored);
        let restore = start.elapsed().as_secs_f64();
        checks.record(
            "podman",
            run,
            &restored,
            "podman restore --import runs the container",
            running,
            format!("{out:?}"),
        );
        if running {
            samples.push("podman_checkpoint", checkpoint);
            samples.push("podman_restore", restore);
            let size = std::fs::metadata(&archive).map(|m| m.len()).unwrap_or(0);
            samples.push("podman_archive_bytes", size as f64);
            eprintln!("  podman checkpoint {checkpoint:.2}s restore {restore:.2}s");
            let pid = self
                .cmd(&["inspect", "-f", "{{.State.Pid}}", &restored])
                .stdout
                .trim()
                .parse()
                .ok();
            check::restored(checks, "podman", run, &restored, pid, &|s| {
                self.exec(&restored, s, None)
            });
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
