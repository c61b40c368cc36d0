//! Drives the vLLM plugin's processes (`vllm-plugin/`, Python) for the vLLM takeover tests and
//! `belayer-bench vllm`: a vLLM server (API server, engine core, worker) in its own process group,
//! the plugin's OpenAI front, and its load generator. vLLM itself is never changed; these are the
//! flags a user sets (docs/vllm.md).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

/// The venv `scripts/setup-vllm` builds.
pub const DEFAULT_PYTHON: &str = "/opt/belayer/vllm/venv/bin/python";
/// The HuggingFace directory `scripts/setup-vllm` converts from the reference GGUF.
pub const DEFAULT_MODEL: &str = "/var/lib/belayer/models/SmolLM2-135M-Instruct-hf";
/// KV cache each vLLM asks for (the broker arena must hold two while a zombie's are quarantined).
pub const KV_BYTES: u64 = 256 << 20;

/// A prerequisite or a process that failed.
#[derive(Debug, Error)]
pub enum VllmError {
    /// Something `scripts/setup-vllm` installs is absent.
    #[error("{what} is missing: {path} (run scripts/setup-vllm, or set {env})")]
    Missing {
        /// What is missing.
        what: &'static str,
        /// Where it was looked for.
        path: String,
        /// The variable that overrides the path.
        env: &'static str,
    },
    /// The venv exists but does not import vLLM and the plugin.
    #[error("{python} cannot import vllm and belayer_vllm (run scripts/setup-vllm): {stderr}")]
    Import {
        /// The interpreter.
        python: String,
        /// Its complaint.
        stderr: String,
    },
    /// A process could not be started.
    #[error("cannot start {what}")]
    Spawn {
        /// Which process.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A server did not answer /health in time.
    #[error("{what} did not become healthy within {secs} s; last log lines:\n{tail}")]
    NotHealthy {
        /// Which server.
        what: String,
        /// The wait.
        secs: u64,
        /// The end of its log.
        tail: String,
    },
}

/// Where the Python side lives.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The venv's interpreter.
    pub python: PathBuf,
    /// The HF model directory.
    pub model: PathBuf,
    /// `belayer-region-checksum`.
    pub checksum_bin: PathBuf,
    /// KV cache bytes each vLLM asks for (`--kv-cache-memory-bytes`).
    pub kv_bytes: u64,
    /// A promoted shadow adopts its dead predecessor's checksummed KV blocks (else it rebuilds
    /// every in-flight request's KV by prefill).
    pub kv_reuse: bool,
}

/// This checkout's plugin source, first on every interpreter's path ([`Setup::command`]): the
/// tests and the bench run the plugin of the tree they were built from, whatever checkout the
/// venv's editable install names (`scripts/setup-vllm` run from another checkout re-points it).
/// The venv still provides the plugin's entry point (`vllm.general_plugins`), which
/// [`Setup::find`] checks.
const PLUGIN_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/vllm-plugin/src");

/// What [`Setup::find`] asks the venv: vLLM, this checkout's plugin, and the plugin's entry point.
const IMPORT_CHECK: &str = "import sys, vllm, belayer_vllm.front\n\
from importlib.metadata import entry_points\n\
ok = any(e.value == 'belayer_vllm.plugin:register' for e in entry_points(group='vllm.general_plugins'))\n\
sys.exit(0 if ok else 'no vllm.general_plugins entry point belayer_vllm.plugin:register in the venv')";

/// `python` with [`PLUGIN_SRC`] on its path.
fn python_command(python: &Path) -> Command {
    let mut c = Command::new(python);
    c.env("PYTHONPATH", PLUGIN_SRC);
    c
}

impl Setup {
    /// The venv's interpreter with this checkout's plugin first on its path.
    pub fn command(&self) -> Command {
        python_command(&self.python)
    }

    /// Finds the venv and model (`BELAYER_VLLM_PYTHON`, `BELAYER_VLLM_MODEL` override) and checks
    /// that the venv imports vLLM and the plugin. Every missing piece is an error naming it.
    pub fn find(checksum_bin: &Path) -> Result<Self, VllmError> {
        let python = std::env::var_os("BELAYER_VLLM_PYTHON")
            .map_or_else(|| PathBuf::from(DEFAULT_PYTHON), PathBuf::from);
        let model = std::env::var_os("BELAYER_VLLM_MODEL")
            .map_or_else(|| PathBuf::from(DEFAULT_MODEL), PathBuf::from);
        if !python.is_file() {
            return Err(VllmError::Missing {
                what: "the vLLM venv",
                path: python.display().to_string(),
                env: "BELAYER_VLLM_PYTHON",
            });
        }
        if !model.join("config.json").is_file() {
            return Err(VllmError::Missing {
                what: "the converted SmolLM2-135M-Instruct HF model",
                path: model.display().to_string(),
                env: "BELAYER_VLLM_MODEL",
            });
        }
        if !checksum_bin.is_file() {
            return Err(VllmError::Missing {
                what: "belayer-region-checksum",
                path: checksum_bin.display().to_string(),
                env: "CARGO_BIN_EXE_belayer-region-checksum",
            });
        }
        let out = python_command(&python)
            .args(["-c", IMPORT_CHECK])
            .output()
            .map_err(|source| VllmError::Spawn {
                what: python.display().to_string(),
                source,
            })?;
        if !out.status.success() {
            return Err(VllmError::Import {
                python: python.display().to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(Self {
            python,
            model,
            checksum_bin: checksum_bin.to_path_buf(),
            kv_bytes: KV_BYTES,
            kv_reuse: true,
        })
    }

    fn env(&self, c: &mut Command) {
        c.env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env_remove("VLLM_CPU_KVCACHE_SPACE");
    }

    /// Arguments of one vLLM server; with `plugin` = (broker socket, role, state dir), the
    /// Belayer flags.
    pub fn vllm_args(&self, port: u16, plugin: Option<(&Path, &str, &Path)>) -> Vec<String> {
        let mut a: Vec<String> = [
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--served-model-name",
            "smol",
            "--enforce-eager",
            // bf16 logits of a prefill and of step-by-step decoding differ enough to flip a
            // greedy near-tie (seen here after ~10 tokens); float32 keeps takeovers exact.
            "--dtype",
            "float32",
            "--max-model-len",
            "4096",
            // KV is reused after a takeover in whole blocks: the CPU backend's default of 128
            // tokens would leave most of a short prompt to recompute (its kernels want a
            // multiple of 32).
            "--block-size",
            "32",
            "--host",
            "127.0.0.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend([
            "--model".into(),
            self.model.display().to_string(),
            "--port".into(),
            port.to_string(),
            "--kv-cache-memory-bytes".into(),
            self.kv_bytes.to_string(),
        ]);
        if let Some((sock, role, state)) = plugin {
            let cfg = serde_json::json!({
                "broker": sock, "role": role, "endpoint": format!("http://127.0.0.1:{port}"),
                "state_dir": state, "checksum_bin": self.checksum_bin,
                "adopt_window_s": if self.kv_reuse { 60 } else { 0 },
            });
            a.extend([
                "--load-format".into(),
                "belayer".into(),
                "--model-loader-extra-config".into(),
                cfg.to_string(),
                "--kv-transfer-config".into(),
                r#"{"kv_connector":"BelayerConnector","kv_connector_module_path":"belayer_vllm.kv","kv_role":"kv_both","kv_load_failure_policy":"recompute"}"#.into(),
                "--worker-cls".into(),
                "belayer_vllm.worker.BelayerCPUWorker".into(),
            ]);
        }
        a
    }

    /// Starts a vLLM server in its own process group, output to `log`.
    pub fn vllm(
        &self,
        name: &str,
        port: u16,
        plugin: Option<(&Path, &str, &Path)>,
        log: &Path,
    ) -> Result<Group, VllmError> {
        let mut c = self.command();
        self.env(&mut c);
        c.args(self.vllm_args(port, plugin));
        Group::spawn(name, c, port, log)
    }

    /// Starts the plugin's front on `port` for the broker at `sock`.
    pub fn front(
        &self,
        port: u16,
        sock: &Path,
        state: &Path,
        log: &Path,
    ) -> Result<Group, VllmError> {
        let mut c = self.command();
        c.args(["-m", "belayer_vllm.front", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--broker")
            .arg(sock)
            .arg("--state-dir")
            .arg(state);
        Group::spawn("front", c, port, log)
    }

    /// The load generator's command (`python -m belayer_vllm.loadgen ...`), not started.
    pub fn loadgen(
        &self,
        port: u16,
        load: &Load,
        out: &Path,
        generating: Option<&Path>,
    ) -> Command {
        let mut c = self.command();
        c.args(["-m", "belayer_vllm.loadgen", "--url"])
            .arg(format!("http://127.0.0.1:{port}"))
            .args(["--requests", &load.requests.to_string()])
            .args(["--prefix-tokens", &load.prefix_tokens.to_string()])
            .arg("--tokenizer")
            .arg(&self.model)
            .args(["--max-tokens", &load.max_tokens.to_string()])
            .args(["--mix", load.mix])
            .arg("--out")
            .arg(out);
        if let Some(g) = generating {
            c.arg("--generating").arg(g).args(["--min-tokens", "3"]);
        }
        c.stdout(Stdio::null());
        c
    }
}

/// A request set for the load generator.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    /// Concurrent requests.
    pub requests: usize,
    /// Prompt tokens (completions; chat adds its template's).
    pub prefix_tokens: usize,
    /// Tokens to generate each (EOS ignored).
    pub max_tokens: usize,
    /// "mixed" (completions and chat, streamed and not), "completion" or "chat".
    pub mix: &'static str,
}

/// One server's process group, killed on drop.
#[derive(Debug)]
pub struct Group {
    /// Name in messages.
    pub name: String,
    /// The leader (the API server for vLLM).
    pub child: Child,
    /// Its HTTP port.
    pub port: u16,
    /// Its output.
    pub log: PathBuf,
}

impl Group {
    fn spawn(name: &str, mut c: Command, port: u16, log: &Path) -> Result<Self, VllmError> {
        use std::os::unix::process::CommandExt;
        let f = std::fs::File::create(log).map_err(|source| VllmError::Spawn {
            what: log.display().to_string(),
            source,
        })?;
        let f2 = f.try_clone().map_err(|source| VllmError::Spawn {
            what: log.display().to_string(),
            source,
        })?;
        c.stdout(f).stderr(f2).stdin(Stdio::null()).process_group(0);
        let child = c.spawn().map_err(|source| VllmError::Spawn {
            what: name.to_string(),
            source,
        })?;
        Ok(Self {
            name: name.to_string(),
            child,
            port,
            log: log.to_path_buf(),
        })
    }

    /// Waits until `GET /health` answers 200; returns how long that took.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<Duration, VllmError> {
        let t = Instant::now();
        loop {
            if http(self.port, "GET", "/health", "").is_some_and(|(s, _)| s == 200) {
                return Ok(t.elapsed());
            }
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || t.elapsed() > timeout {
                return Err(VllmError::NotHealthy {
                    what: self.name.clone(),
                    secs: timeout.as_secs(),
                    tail: self.log_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the log contains `needle` (e.g. the shadow's "warm-up done").
    pub fn wait_log(&mut self, needle: &str, timeout: Duration) -> Result<(), VllmError> {
        let t = Instant::now();
        while !self.log_text().contains(needle) {
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || t.elapsed() > timeout {
                return Err(VllmError::NotHealthy {
                    what: format!("{} ({needle:?} not logged)", self.name),
                    secs: timeout.as_secs(),
                    tail: self.log_tail(30),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The last `n` lines of the log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read(&self.log).unwrap_or_default();
        let s = String::from_utf8_lossy(&s);
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The log as text.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    /// vLLM's engine core and worker pids (children of the API server, by process name).
    pub fn engine_and_worker(&self) -> Option<(i32, i32)> {
        let api = self.child.id() as i32;
        let engine = child_named(api, "VLLM::EngineCor")?;
        let worker = child_named(engine, "VLLM::Worker")?;
        Some((engine, worker))
    }

    /// Sends `sig` to one process of this group.
    pub fn signal(&self, pid: i32, sig: i32) {
        // SAFETY: kill(2) on a pid found among this group's live descendants just before; a
        // plain syscall with no memory handed over.
        unsafe { libc::kill(pid, sig) };
    }

    /// Kills the whole group and reaps the leader.
    pub fn kill(&mut self) {
        // SAFETY: killpg(2) on the group this leader created (process_group(0)); the leader is
        // not reaped yet, so the group id is still ours.
        unsafe { libc::killpg(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }

    /// Whether every process of the group is gone (within `timeout`).
    pub fn wait_gone(&mut self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let pgid = self.child.id() as i32;
        loop {
            let _ = self.child.try_wait();
            if !group_alive(pgid) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill();
    }
}

fn stat_fields(pid: &str) -> Option<(String, i32, i32, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, tail) = s.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let mut f = tail.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let pgid = f.next()?.parse().ok()?;
    Some((comm, ppid, pgid, state))
}

fn child_named(parent: i32, comm: &str) -> Option<i32> {
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str() else { continue };
        if let Some((c, ppid, _, _)) = stat_fields(pid)
            && ppid == parent
            && c == comm
        {
            return pid.parse().ok();
        }
    }
    None
}

fn group_alive(pgid: i32) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(stat_fields)
            .is_some_and(|(_, _, g, st)| g == pgid && st != 'Z')
    })
}

/// Whether `pid` is gone (or a zombie nobody reaped yet).
pub fn pid_gone(pid: i32) -> bool {
    stat_fields(&pid.to_string()).is_none_or(|(_, _, _, st)| st == 'Z')
}

/// One plain HTTP/1.0 exchange with 127.0.0.1:`port`; (status, body).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    Some((status, body))
}

/// The lease file the promoted vLLM writes (`primary.json`): (epoch, worker pid).
pub fn lease(state: &Path) -> Option<(u64, i32)> {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(state.join("primary.json")).ok()?).ok()?;
    Some((v["epoch"].as_u64()?, v["worker_pid"].as_i64()? as i32))
}

/// (adopted, refused) KV blocks from a promoted shadow's log: its last "KV reuse: adopted A
/// blocks, refused R" line; (0, 0) when it has none.
pub fn kv_reuse_counts(log: &str) -> (u64, u64) {
    let Some(line) = log.lines().rev().find(|l| l.contains("KV reuse: adopted")) else {
        return (0, 0);
    };
    let num = |after: &str| -> u64 {
        line.find(after).map_or(0, |i| {
            let digits: String = line[i + after.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap_or(0)
        })
    };
    (num("adopted "), num("refused "))
}
