//! Child processes the suites start (`worker`, `vllm`): binaries found beside `belayer-bench`
//! or on PATH, a child killed on drop with its stdout events collected, and the GPU broker.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use gpu_broker::client::Client;
use gpu_broker::wire::Role;

/// A binary a suite runs is neither beside `belayer-bench` nor on PATH.
#[derive(Debug, thiserror::Error)]
#[error("{0} is neither beside this binary nor on PATH")]
pub struct MissingBin(pub String);

/// Finds a sibling binary (installed beside this one) or one on PATH.
pub fn find_bin(name: &str) -> Result<PathBuf, MissingBin> {
    let beside = std::env::current_exe().map(|e| e.with_file_name(name));
    if let Ok(p) = beside
        && p.is_file()
    {
        return Ok(p);
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .ok_or_else(|| MissingBin(name.to_string()))
}

/// A child killed on drop.
pub struct Proc {
    pub child: Child,
    events: Arc<Mutex<Vec<serde_json::Value>>>,
    stderr: PathBuf,
    /// Unix time just before spawn.
    pub spawned_at: f64,
}

impl Proc {
    pub fn spawn(bin: &Path, args: &[String], stderr: PathBuf) -> Result<Self> {
        let spawned_at = gpu_broker::worker::events::now();
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().context("no stdout")?;
        let ev = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    ev.lock().unwrap_or_else(|p| p.into_inner()).push(v);
                }
            }
        });
        Ok(Self {
            child,
            events,
            stderr,
            spawned_at,
        })
    }

    pub fn event(&self, name: &str) -> Option<serde_json::Value> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|e| e["event"] == name)
            .cloned()
    }

    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<serde_json::Value> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(e) = self.event(name) {
                return Ok(e);
            }
            if let Some(st) = self.child.try_wait()? {
                std::thread::sleep(Duration::from_millis(100));
                if let Some(e) = self.event(name) {
                    return Ok(e);
                }
                bail!(
                    "process exited ({st}) before {name}: {}",
                    self.stderr_text()
                );
            }
            if Instant::now() > end {
                bail!("timed out waiting for {name}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Result<i32> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st.code().unwrap_or(-1));
            }
            if Instant::now() > end {
                bail!("process did not exit in time");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGKILL now; returns the Unix time just before the signal.
    pub fn sigkill(&mut self) -> f64 {
        let t = gpu_broker::worker::events::now();
        let _ = self.child.kill();
        t
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a broker on `dir/broker.sock` (`extra`: more of its flags) and waits until it
/// answers; its stderr goes to `dir/broker-TAG.err`.
pub fn broker(bin: &Path, dir: &Path, tag: &str, extra: &[&str]) -> Result<Proc> {
    let sock = dir.join("broker.sock");
    let mut args = vec!["--socket".to_string(), sock.display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = Proc::spawn(bin, &args, dir.join(format!("broker-{tag}.err")))?;
    let end = Instant::now() + Duration::from_secs(10);
    while Client::connect(&sock, Role::Observer, 0).is_err() {
        if Instant::now() > end {
            bail!("broker did not come up: {}", p.stderr_text());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(p)
}
