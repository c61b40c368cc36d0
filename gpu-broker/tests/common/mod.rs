//! Shared helpers for the gpu-broker integration tests: real broker and worker processes in a
//! private directory, killed and removed on drop.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_broker::client::Client;
use gpu_broker::wire::Role;

pub const BROKER: &str = env!("CARGO_BIN_EXE_belayer-gpu-broker");
pub const WORKER: &str = env!("CARGO_BIN_EXE_belayer-worker");

/// The model file; a missing one fails the test with the fix in the message.
pub fn model() -> PathBuf {
    let p = gpu_broker::worker::model_path();
    assert!(
        p.is_file(),
        "model file {} is missing: run gpu-broker/scripts/fetch-model (or set BELAYER_MODEL)",
        p.display()
    );
    p
}

static N: AtomicU32 = AtomicU32::new(0);

/// A scratch directory removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!(
            "gpu-broker-test-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child process killed on drop, with its stdout JSON events collected.
pub struct Proc {
    pub child: Child,
    pub events: Arc<Mutex<Vec<serde_json::Value>>>,
    pub stderr: PathBuf,
}

impl Proc {
    pub fn spawn(bin: &str, args: &[String], stderr: PathBuf) -> Self {
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let events = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let ev = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    ev.lock().unwrap().push(v);
                }
            }
        });
        Self {
            child,
            events,
            stderr,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn event(&self, name: &str) -> Option<serde_json::Value> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .find(|e| e["event"] == name)
            .cloned()
    }

    pub fn wait_event(&mut self, name: &str, timeout: Duration) -> serde_json::Value {
        let end = Instant::now() + timeout;
        loop {
            if let Some(e) = self.event(name) {
                return e;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                // Give the reader a moment to drain stdout.
                std::thread::sleep(Duration::from_millis(100));
                if let Some(e) = self.event(name) {
                    return e;
                }
                panic!(
                    "process exited ({st}) before event {name}: {}",
                    self.stderr_text()
                );
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for event {name}: {}",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let end = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < end,
                "process did not exit in time: {}",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid (not yet reaped, so not recycled).
        unsafe { libc::kill(self.pid(), sig) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A broker process on a socket in `dir`.
pub fn broker(dir: &Path, extra: &[&str]) -> Proc {
    let sock = dir.join("broker.sock");
    let mut args = vec![
        "--socket".to_string(),
        sock.display().to_string(),
        "--kv-mib".into(),
        "768".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let p = Proc::spawn(
        BROKER,
        &args,
        dir.join(format!("broker-{}.err", N.fetch_add(1, Ordering::SeqCst))),
    );
    let end = Instant::now() + Duration::from_secs(10);
    while Client::connect(&sock, Role::Observer, 0).is_err() {
        assert!(Instant::now() < end, "broker did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

pub fn sock(dir: &Path) -> PathBuf {
    dir.join("broker.sock")
}

/// Worker arguments for the shared request set.
pub fn worker_args(
    dir: &Path,
    role: &str,
    out: &str,
    jobs: &[&str],
    extra: &[&str],
) -> Vec<String> {
    let mut a = vec![
        "--socket".to_string(),
        sock(dir).display().to_string(),
        "--role".into(),
        role.into(),
        "--model".into(),
        model().display().to_string(),
        "--out".into(),
        dir.join(out).display().to_string(),
    ];
    a.extend(jobs.iter().map(|s| s.to_string()));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

pub fn worker(dir: &Path, role: &str, out: &str, jobs: &[&str], extra: &[&str]) -> Proc {
    let n = N.fetch_add(1, Ordering::SeqCst);
    Proc::spawn(
        WORKER,
        &worker_args(dir, role, out, jobs, extra),
        dir.join(format!("{role}-{n}.err")),
    )
}

pub fn results(dir: &Path, out: &str) -> gpu_broker::worker::jobs::Results {
    serde_json::from_slice(&std::fs::read(dir.join(out)).unwrap()).unwrap()
}

/// Waits until request `id` has at least `n` generated tokens in the broker's log.
pub fn wait_generated(dir: &Path, id: u64, n: usize, timeout: Duration) {
    let c = Client::connect(&sock(dir), Role::Observer, 0).unwrap();
    let end = Instant::now() + timeout;
    loop {
        if c.log_get(id).is_ok_and(|l| l.generated.len() >= n) {
            return;
        }
        assert!(
            Instant::now() < end,
            "request {id} did not reach {n} tokens"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn status(dir: &Path) -> gpu_broker::wire::Status {
    Client::connect(&sock(dir), Role::Observer, 0)
        .unwrap()
        .status()
        .unwrap()
}
