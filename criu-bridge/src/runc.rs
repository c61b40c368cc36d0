//! `runc` as a library: state, pause/resume, kill/delete, and `checkpoint`/`restore` with
//! Belayer's CRIU options. Every child is spawned through a [`Spawner`], so a shim can route
//! them through its reaper and lose no exit status.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::Arc;

use serde::Deserialize;

/// Runs a prepared command to completion. The default runs it directly; a shim whose reaper
/// waits on all children supplies its own.
pub trait Spawner: Send + Sync {
    /// Runs `cmd` and returns its status and captured output (stdio the caller set on `cmd`
    /// stays as set).
    fn output(&self, cmd: Command) -> io::Result<Output>;
}

/// [`Spawner`] that runs commands with `std::process`.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdSpawner;

impl Spawner for StdSpawner {
    fn output(&self, mut cmd: Command) -> io::Result<Output> {
        cmd.output()
    }
}

/// Whether runc's error text says the container does not exist (runc has no exit code for it).
/// Both of Belayer's runc clients classify its failures with this: the shim's async one (create,
/// exec, kill, delete, with the container's stdio) and this sync one (state, checkpoint,
/// restore), which share the `--root`.
pub fn says_no_container(message: &str) -> bool {
    message.contains("does not exist") || message.contains("container not found")
}

/// A failed runc invocation.
#[derive(Debug, thiserror::Error)]
pub enum RuncError {
    /// runc could not be started.
    #[error("cannot run {binary} {verb}")]
    Spawn {
        /// The runc binary.
        binary: PathBuf,
        /// The runc verb.
        verb: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// runc exited with a failure.
    #[error("runc {verb} {id} failed ({status}): {message}")]
    Failed {
        /// The runc verb.
        verb: &'static str,
        /// The container id.
        id: String,
        /// runc's exit status.
        status: ExitStatus,
        /// runc's own error text (stderr or its log).
        message: String,
    },
    /// The container does not exist.
    #[error("container {0} does not exist")]
    NotFound(String),
    /// `runc state` printed something unreadable.
    #[error("cannot parse `runc state {id}` output")]
    BadState {
        /// The container id.
        id: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

/// What `runc state` reports.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ContainerState {
    /// The container id.
    pub id: String,
    /// Init's pid (0 when stopped).
    pub pid: i32,
    /// "created", "running", "paused" or "stopped".
    pub status: String,
    /// The bundle path.
    pub bundle: PathBuf,
}

/// CRIU's `--manage-cgroups-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupsMode {
    /// Restore cgroup properties only when the cgroup is created (runc's default).
    Soft,
    /// Restore all cgroup properties.
    Full,
    /// Fail if cgroups do not match.
    Strict,
}

impl fmt::Display for CgroupsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Soft => "soft",
            Self::Full => "full",
            Self::Strict => "strict",
        })
    }
}

/// CRIU options shared by checkpoint and restore.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CriuOptions {
    /// Dump/restore established TCP connections (`--tcp-established`).
    pub tcp_established: bool,
    /// Allow unix sockets connected outside the container (`--ext-unix-sk`).
    pub ext_unix_sk: bool,
    /// Dump/restore file locks (`--file-locks`).
    pub file_locks: bool,
    /// The container runs a shell job with a controlling terminal (`--shell-job`).
    pub shell_job: bool,
    /// `--manage-cgroups-mode`, runc's default when `None`.
    pub manage_cgroups_mode: Option<CgroupsMode>,
}

impl Default for CriuOptions {
    /// Belayer's defaults: sockets, external unix sockets and file locks on.
    fn default() -> Self {
        Self {
            tcp_established: true,
            ext_unix_sk: true,
            file_locks: true,
            shell_job: false,
            manage_cgroups_mode: None,
        }
    }
}

impl CriuOptions {
    /// What containerd's runc shim restores with: none of the options (CRIU's defaults).
    pub fn runc_shim() -> Self {
        Self {
            tcp_established: false,
            ext_unix_sk: false,
            file_locks: false,
            shell_job: false,
            manage_cgroups_mode: None,
        }
    }

    fn apply(&self, cmd: &mut Command) {
        for (on, flag) in [
            (self.tcp_established, "--tcp-established"),
            (self.ext_unix_sk, "--ext-unix-sk"),
            (self.file_locks, "--file-locks"),
            (self.shell_job, "--shell-job"),
        ] {
            if on {
                cmd.arg(flag);
            }
        }
        if let Some(mode) = self.manage_cgroups_mode {
            cmd.arg("--manage-cgroups-mode").arg(mode.to_string());
        }
    }
}

/// How CRIU stops the container's tasks for a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Seize {
    /// runc's way: CRIU freezes the container's freezer cgroup (it finds it frozen by
    /// `runc pause`) and seizes every task while frozen.
    #[default]
    Frozen,
    /// CRIU's "compel interrupt-only mode": CRIU notes the freezer's state, thaws the cgroup,
    /// seizes the tasks one by one with `PTRACE_SEIZE` + `PTRACE_INTERRUPT` (each stops where it
    /// is, the rest run on until their turn), dumps, and writes the noted state (FROZEN) back
    /// before it lets go of them, so they go from CRIU's stop straight to frozen. What takes a
    /// stopped task under the cgroup v1 freezer. runc has no option for it: CRIU reads it from
    /// the environment runc passes `criu swrk` (`CRIU_FAULT=137`,
    /// `FI_COMPEL_INTERRUPT_ONLY_MODE`, which changes nothing else in a dump). Never given to a
    /// restore: CRIU's restorer reads the same variable.
    OneByOne,
}

impl Seize {
    /// The environment variable and value that select this mode, if any.
    pub fn env(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::Frozen => None,
            Self::OneByOne => Some(("CRIU_FAULT", "137")),
        }
    }
}

/// The stdio of a restored container's init when there is no terminal (containerd's fifos or
/// pipes, say). runc maps them onto the pipes recorded at checkpoint time.
#[derive(Debug, Default)]
pub struct RestoreStdio {
    /// stdin (`/dev/null` when `None`).
    pub stdin: Option<Stdio>,
    /// stdout (`/dev/null` when `None`).
    pub stdout: Option<Stdio>,
    /// stderr (`/dev/null` when `None`).
    pub stderr: Option<Stdio>,
}

/// Arguments of `runc restore`.
#[derive(Debug, Clone)]
pub struct RestoreArgs<'a> {
    /// The container id to restore as (the same one in place, a new one for a fork).
    pub id: &'a str,
    /// The bundle (config.json, rootfs mounted).
    pub bundle: &'a Path,
    /// The CRIU images.
    pub image_dir: &'a Path,
    /// Where CRIU writes restore.log and stats-restore.
    pub work_dir: &'a Path,
    /// CRIU options (must match those of the checkpoint).
    pub criu: &'a CriuOptions,
    /// Return once the container runs (`--detach`).
    pub detach: bool,
    /// Where runc writes init's pid.
    pub pid_file: Option<&'a Path>,
    /// Console socket, when the container has a terminal.
    pub console_socket: Option<&'a Path>,
    /// `--no-subreaper`.
    pub no_subreaper: bool,
    /// `--no-pivot` (rootfs on a ramdisk).
    pub no_pivot: bool,
    /// `--lazy-pages`: memory comes from a `criu lazy-pages` daemon listening in `work_dir`.
    pub lazy_pages: bool,
}

/// A runc binary with its state root and the CRIU it must use.
#[derive(Clone)]
pub struct Runc {
    /// The runc binary.
    pub binary: PathBuf,
    /// runc's `--root` (its state dir).
    pub root: PathBuf,
    /// The CRIU binary runc runs (`--criu`).
    pub criu: PathBuf,
    /// `--systemd-cgroup`: the container's `cgroupsPath` is `slice:prefix:name`, for systemd
    /// (what a restore, which creates the container anew, must know).
    pub systemd_cgroup: bool,
    /// How children are spawned.
    pub spawner: Arc<dyn Spawner>,
}

impl fmt::Debug for Runc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runc")
            .field("binary", &self.binary)
            .field("root", &self.root)
            .field("criu", &self.criu)
            .field("systemd_cgroup", &self.systemd_cgroup)
            .finish()
    }
}

/// (major, minor) from `runc --version`'s output.
fn parse_version(output: &str) -> Option<(u32, u32)> {
    let v = output.lines().next()?.strip_prefix("runc version ")?;
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

impl Runc {
    /// `runc` and `criu` from PATH with the given state root.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            binary: "runc".into(),
            root: root.into(),
            criu: "criu".into(),
            systemd_cgroup: false,
            spawner: Arc::new(StdSpawner),
        }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(&self.binary);
        c.arg("--root")
            .arg(&self.root)
            .arg("--criu")
            .arg(&self.criu);
        if self.systemd_cgroup {
            c.arg("--systemd-cgroup");
        }
        // Every stdio is set explicitly, so a custom [`Spawner`] (which cannot read a
        // `Command`'s stdio back) captures exactly what `Command::output` would.
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    fn run(&self, verb: &'static str, id: &str, mut cmd: Command) -> Result<Output, RuncError> {
        cmd.arg(id);
        let out = self
            .spawner
            .output(cmd)
            .map_err(|source| RuncError::Spawn {
                binary: self.binary.clone(),
                verb,
                source,
            })?;
        if out.status.success() {
            return Ok(out);
        }
        let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if says_no_container(&message) {
            return Err(RuncError::NotFound(id.to_string()));
        }
        Err(RuncError::Failed {
            verb,
            id: id.to_string(),
            status: out.status,
            message,
        })
    }

    /// runc's version as (major, minor), from `runc --version`'s first line
    /// (`runc version 1.1.5+ds1`); `None` when it cannot be run or read.
    pub fn version(&self) -> Option<(u32, u32)> {
        let mut c = Command::new(&self.binary);
        c.arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let out = self.spawner.output(c).ok()?;
        parse_version(&String::from_utf8_lossy(&out.stdout))
    }

    /// `runc state ID`.
    pub fn state(&self, id: &str) -> Result<ContainerState, RuncError> {
        let mut c = self.command();
        c.arg("state");
        let out = self.run("state", id, c)?;
        serde_json::from_slice(&out.stdout).map_err(|source| RuncError::BadState {
            id: id.into(),
            source,
        })
    }

    /// `runc pause ID`: freezes the container's cgroup.
    pub fn pause(&self, id: &str) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("pause");
        self.run("pause", id, c).map(drop)
    }

    /// `runc resume ID`: thaws the container's cgroup.
    pub fn resume(&self, id: &str) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("resume");
        self.run("resume", id, c).map(drop)
    }

    /// `runc kill [--all] ID SIGNAL`.
    pub fn kill(&self, id: &str, signal: &str, all: bool) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("kill");
        if all {
            c.arg("--all");
        }
        c.arg(id);
        let out = self.spawner.output({
            c.arg(signal);
            c
        });
        let out = out.map_err(|source| RuncError::Spawn {
            binary: self.binary.clone(),
            verb: "kill",
            source,
        })?;
        if out.status.success() {
            Ok(())
        } else {
            let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
            Err(RuncError::Failed {
                verb: "kill",
                id: id.into(),
                status: out.status,
                message,
            })
        }
    }

    /// `runc delete [--force] ID`.
    pub fn delete(&self, id: &str, force: bool) -> Result<(), RuncError> {
        let mut c = self.command();
        c.arg("delete");
        if force {
            c.arg("--force");
        }
        self.run("delete", id, c).map(drop)
    }

    /// `runc checkpoint`: CRIU images into `image_dir`, logs and stats into `work_dir`, its
    /// tasks stopped as `seize` says. With `leave_running` the processes go on afterwards in the
    /// freezer state they had before (a paused container stays paused); without, they are
    /// killed and the container deleted.
    pub fn checkpoint(
        &self,
        id: &str,
        image_dir: &Path,
        work_dir: &Path,
        leave_running: bool,
        criu: &CriuOptions,
        seize: Seize,
    ) -> Result<(), RuncError> {
        let mut c = self.command();
        // runc starts `criu swrk` with its own environment.
        if let Some((key, value)) = seize.env() {
            c.env(key, value);
        }
        c.arg("checkpoint")
            .arg("--image-path")
            .arg(image_dir)
            .arg("--work-path")
            .arg(work_dir);
        if leave_running {
            c.arg("--leave-running");
        }
        criu.apply(&mut c);
        self.run("checkpoint", id, c).map(drop)
    }

    /// `runc restore`. runc's own messages go to `work_dir/runc-restore.log` (its stdio is the
    /// container's), and are returned in the error.
    pub fn restore(&self, args: &RestoreArgs<'_>, stdio: RestoreStdio) -> Result<(), RuncError> {
        let log = args.work_dir.join("runc-restore.log");
        let mut c = Command::new(&self.binary);
        // A dump's seize mode must never reach a restore (the restorer reads CRIU_FAULT too),
        // even one inherited from whoever started this process.
        if let Some((key, _)) = Seize::OneByOne.env() {
            c.env_remove(key);
        }
        c.arg("--root")
            .arg(&self.root)
            .arg("--criu")
            .arg(&self.criu)
            .arg("--log")
            .arg(&log);
        c.arg("restore").arg("--bundle").arg(args.bundle);
        c.arg("--image-path")
            .arg(args.image_dir)
            .arg("--work-path")
            .arg(args.work_dir);
        args.criu.apply(&mut c);
        if args.detach {
            c.arg("--detach");
        }
        if let Some(p) = args.pid_file {
            c.arg("--pid-file").arg(p);
        }
        if let Some(s) = args.console_socket {
            c.arg("--console-socket").arg(s);
        }
        if args.no_subreaper {
            c.arg("--no-subreaper");
        }
        if args.no_pivot {
            c.arg("--no-pivot");
        }
        if args.lazy_pages {
            c.arg("--lazy-pages");
        }
        c.arg(args.id);
        c.stdin(stdio.stdin.unwrap_or_else(Stdio::null));
        c.stdout(stdio.stdout.unwrap_or_else(Stdio::null));
        c.stderr(stdio.stderr.unwrap_or_else(Stdio::null));
        let out = self.spawner.output(c).map_err(|source| RuncError::Spawn {
            binary: self.binary.clone(),
            verb: "restore",
            source,
        })?;
        if out.status.success() {
            return Ok(());
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let message = text
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" | ");
        Err(RuncError::Failed {
            verb: "restore",
            id: args.id.into(),
            status: out.status,
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn reads_runcs_version_line() {
        let debian = "runc version 1.1.5+ds1\ncommit: 1.1.5+ds1-1+deb12u1\nspec: 1.0.2-dev\n";
        assert_eq!(parse_version(debian), Some((1, 1)));
        assert_eq!(parse_version("runc version 1.2.0-rc.1\n"), Some((1, 2)));
        assert_eq!(parse_version("runc version 1.10.3"), Some((1, 10)));
        assert_eq!(parse_version("crun version 1.8"), None);
        assert_eq!(parse_version(""), None);
    }
}
