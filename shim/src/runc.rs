//! Runs the `runc` binary for a container's life: create, exec, start, kill, delete, pause,
//! resume, ps, update. Every invocation is spawned without tokio's child handling and awaited
//! through the shared [`reaper`](crate::reaper), so the shim's SIGCHLD reaper never steals an
//! exit status from us and we never steal one from it.
//!
//! Why a second runc client beside `criu_bridge::runc` (sync, for checkpoint, restore and state,
//! which run on blocking threads): these calls hand runc the process's own stdio or a console
//! socket and must not block the runtime while runc runs, so they are async and stream rather
//! than capture. Both run over the same `--root` ([`runc_root`]) and classify runc's errors the
//! same way (`criu_bridge::runc::says_no_container`).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};
use crate::reaper;

pub use crate::stdio::ProcessStdio;
/// runc's state directory for a containerd namespace (shared with the tests' leak checks).
pub use belayer_api::settings::runc_root;

/// What an invocation does with its standard streams.
enum Streams {
    /// Capture runc's stdout and stderr; optionally feed stdin.
    Capture(Option<Vec<u8>>),
    /// Pass the process's streams; runc's own errors come from its log file.
    Process(ProcessStdio),
}

/// Options of `runc create` and `runc exec`.
pub struct StartOpts<'a> {
    pub pid_file: &'a Path,
    pub console_socket: Option<&'a Path>,
    pub stdio: ProcessStdio,
}

/// A runc binary with the global options every call shares.
#[derive(Clone, Debug)]
pub struct Runc {
    pub binary: PathBuf,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
}

impl Runc {
    pub fn new(root: PathBuf, systemd_cgroup: bool) -> Self {
        Self {
            binary: PathBuf::from("runc"),
            root,
            systemd_cgroup,
        }
    }

    /// This runc with `--systemd-cgroup` on or off (for a container whose cgroups path needs it).
    pub fn for_cgroups(&self, systemd_cgroup: bool) -> Self {
        Self {
            systemd_cgroup,
            ..self.clone()
        }
    }

    async fn run(
        &self,
        step: &'static str,
        args: Vec<OsString>,
        streams: Streams,
    ) -> Result<Vec<u8>> {
        // runc (root) opens its log following symlinks: never at a name another user can
        // predict and plant first.
        let log_dir = crate::stdio::PrivateDir::new("belayer-runc")?;
        let log = log_dir.path().join("log.json");
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--log")
            .arg(&log)
            .arg("--log-format")
            .arg("json");
        if self.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        cmd.args(&args);
        let mut feed = None;
        match streams {
            Streams::Capture(stdin) => {
                cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
                match stdin {
                    Some(data) => {
                        cmd.stdin(Stdio::piped());
                        feed = Some(data);
                    }
                    None => {
                        cmd.stdin(Stdio::null());
                    }
                }
            }
            Streams::Process(io) => {
                cmd.stdin(io.stdin.map_or_else(Stdio::null, Stdio::from));
                cmd.stdout(io.stdout.map_or_else(Stdio::null, Stdio::from));
                cmd.stderr(io.stderr.map_or_else(Stdio::null, Stdio::from));
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(crate::error::io(format!("spawn runc {step}")))?;
        let pid = child.id() as i32;
        let exit = reaper::watch(pid);
        // `cmd` still holds the parent's copies of the process's stdio; drop them so the
        // readers see EOF when the process closes its ends.
        drop(cmd);
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let collected = tokio::task::spawn_blocking(move || {
            if let (Some(mut w), Some(data)) = (stdin, feed) {
                let _ = w.write_all(&data);
            }
            let err_reader = stderr.map(|mut e| {
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let _ = e.read_to_end(&mut buf);
                    buf
                })
            });
            let mut out = Vec::new();
            if let Some(mut o) = stdout {
                let _ = o.read_to_end(&mut out);
            }
            let err = err_reader.and_then(|t| t.join().ok()).unwrap_or_default();
            (out, err)
        });
        let code = exit.await.unwrap_or(-1);
        let (out, err) = collected.await.unwrap_or_default();
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        drop(log_dir);
        if code != 0 {
            let message = last_error(&logged)
                .or_else(|| {
                    Some(String::from_utf8_lossy(&err).trim().to_string()).filter(|s| !s.is_empty())
                })
                .unwrap_or_else(|| format!("exit status {code}"));
            if criu_bridge::runc::says_no_container(&message) {
                return Err(Error::RuncNoContainer { step, message });
            }
            return Err(Error::Runc { step, message });
        }
        Ok(out)
    }

    /// `runc create`: sets up the container and its init process, stopped before the user's
    /// program runs.
    pub async fn create(&self, id: &str, bundle: &Path, opts: StartOpts<'_>) -> Result<()> {
        let mut args: Vec<OsString> = vec!["create".into(), "--bundle".into(), bundle.into()];
        args.extend(["--pid-file".into(), opts.pid_file.into()]);
        if let Some(sock) = opts.console_socket {
            args.extend(["--console-socket".into(), sock.into()]);
        }
        args.push(id.into());
        self.run("create", args, Streams::Process(opts.stdio))
            .await
            .map(drop)
    }

    /// `runc exec --detach` with the process spec in `process_json`.
    pub async fn exec(&self, id: &str, process_json: &Path, opts: StartOpts<'_>) -> Result<()> {
        let mut args: Vec<OsString> = vec!["exec".into(), "--detach".into()];
        args.extend(["--process".into(), process_json.into()]);
        args.extend(["--pid-file".into(), opts.pid_file.into()]);
        if let Some(sock) = opts.console_socket {
            args.extend(["--console-socket".into(), sock.into()]);
        }
        args.push(id.into());
        self.run("exec", args, Streams::Process(opts.stdio))
            .await
            .map(drop)
    }

    async fn simple(&self, step: &'static str, args: &[&str]) -> Result<Vec<u8>> {
        let args = args.iter().map(OsString::from).collect();
        self.run(step, args, Streams::Capture(None)).await
    }

    pub async fn start(&self, id: &str) -> Result<()> {
        self.simple("start", &["start", id]).await.map(drop)
    }

    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<()> {
        let sig = signal.to_string();
        let mut args = vec!["kill"];
        if all {
            args.push("--all");
        }
        args.extend([id, sig.as_str()]);
        self.simple("kill", &args).await.map(drop)
    }

    pub async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let args: &[&str] = if force {
            &["delete", "--force", id]
        } else {
            &["delete", id]
        };
        self.simple("delete", args).await.map(drop)
    }

    pub async fn pause(&self, id: &str) -> Result<()> {
        self.simple("pause", &["pause", id]).await.map(drop)
    }

    pub async fn resume(&self, id: &str) -> Result<()> {
        self.simple("resume", &["resume", id]).await.map(drop)
    }

    /// Pids of every process in the container.
    pub async fn ps(&self, id: &str) -> Result<Vec<u32>> {
        let out = self.simple("ps", &["ps", "--format", "json", id]).await?;
        serde_json::from_slice::<Option<Vec<u32>>>(&out)
            .map(Option::unwrap_or_default)
            .map_err(|e| Error::Runc {
                step: "ps",
                message: format!("unreadable output: {e}"),
            })
    }

    /// `runc update --resources -` with an OCI `LinuxResources` JSON document.
    pub async fn update(&self, id: &str, resources_json: Vec<u8>) -> Result<()> {
        let args = ["update", "--resources", "-", id]
            .iter()
            .map(OsString::from)
            .collect();
        self.run("update", args, Streams::Capture(Some(resources_json)))
            .await
            .map(drop)
    }
}

/// The last error runc wrote to its JSON log.
fn last_error(log: &str) -> Option<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "error" || v["level"] == "fatal")
        .filter_map(|v| v["msg"].as_str().map(str::to_string))
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::last_error;

    #[test]
    fn picks_last_error_line() {
        let log = r#"{"level":"info","msg":"x"}
{"level":"error","msg":"first"}
not json
{"level":"error","msg":"runc run failed: unable to start container process: exec: \"nope\": executable file not found in $PATH"}
"#;
        assert!(
            last_error(log)
                .unwrap()
                .contains("executable file not found")
        );
        assert_eq!(last_error("{\"level\":\"info\",\"msg\":\"ok\"}"), None);
    }
}
