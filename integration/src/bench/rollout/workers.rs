//! The rollout worker's processes: a broker, a primary `belayer-worker --serve` and (with
//! Belayer) a pre-started shadow; SIGKILL of the primary and what follows — the shadow's takeover
//! and KV rebuild, then a new shadow, or without Belayer a cold restart of broker and worker.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_broker::worker::events::now;
use serde::Serialize;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(180);

/// A child process with its stdout JSON events; killed on drop.
struct Proc {
    child: Child,
    events: Arc<Mutex<Vec<Value>>>,
    log: PathBuf,
}

impl Proc {
    fn spawn(bin: &Path, args: &[String], log: PathBuf) -> Result<Self, String> {
        let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut child = Command::new(bin)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", bin.display()))?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().ok_or("no stdout")?;
        let ev = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    ev.lock().unwrap_or_else(|p| p.into_inner()).push(v);
                }
            }
        });
        Ok(Self { child, events, log })
    }

    /// Waits for event `name`.
    fn wait_event(&mut self, name: &str, limit: Duration) -> Result<Value, String> {
        let end = Instant::now() + limit;
        loop {
            if let Some(e) = self
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .find(|e| e["event"] == name)
            {
                return Ok(e.clone());
            }
            let exited = self.child.try_wait().ok().flatten();
            if exited.is_some() || Instant::now() > end {
                std::thread::sleep(Duration::from_millis(100));
                return Err(format!(
                    "{} before event {name} ({}): {}",
                    if exited.is_some() {
                        "exited"
                    } else {
                        "timed out"
                    },
                    self.log.display(),
                    std::fs::read_to_string(&self.log)
                        .unwrap_or_default()
                        .trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One worker failure and what it cost.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Failover {
    /// Seconds since the run started.
    pub at_s: f64,
    /// Kill → the successor holds the lease (Belayer: shadow promoted).
    pub takeover_s: f64,
    /// Kill → the successor accepts connections on the serving socket.
    pub serving_s: f64,
    /// KV rebuild of the in-flight requests (Belayer only).
    pub rebuild_s: f64,
    pub rebuild_tokens: u64,
    pub rebuild_requests: u64,
    /// Kill → the successor generates again (after the rebuild).
    pub ready_s: f64,
    /// Whether the successor loaded the weights from the file (no Belayer: always).
    pub cold_load: bool,
}

/// Broker + serving worker (+ shadow), in `dir`.
pub struct Workers {
    dir: PathBuf,
    bin_dir: PathBuf,
    belayer: bool,
    max_batch: usize,
    max_seq: usize,
    broker: Option<Proc>,
    primary: Option<Proc>,
    shadow: Option<Proc>,
    spawned: usize,
}

impl Workers {
    /// Starts the broker and the primary (and with `belayer` a shadow), ready to serve.
    pub fn start(
        dir: &Path,
        bin_dir: &Path,
        belayer: bool,
        max_batch: usize,
        max_seq: usize,
    ) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut w = Self {
            dir: dir.to_path_buf(),
            bin_dir: bin_dir.to_path_buf(),
            belayer,
            max_batch,
            max_seq,
            broker: None,
            primary: None,
            shadow: None,
            spawned: 0,
        };
        w.start_broker()?;
        let mut p = w.spawn_worker("primary")?;
        p.wait_event("serving", LONG)?;
        w.primary = Some(p);
        if belayer {
            w.start_shadow()?;
        }
        Ok(w)
    }

    /// The socket clients connect to.
    pub fn serve_path(&self) -> PathBuf {
        self.dir.join("serve.sock")
    }

    fn broker_sock(&self) -> PathBuf {
        self.dir.join("broker.sock")
    }

    fn start_broker(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(self.broker_sock());
        let args = [
            "--socket",
            &self.broker_sock().display().to_string(),
            "--kv-mib",
            "512",
        ]
        .map(String::from);
        self.spawned += 1;
        let b = Proc::spawn(
            &self.bin_dir.join("belayer-gpu-broker"),
            &args,
            self.dir.join(format!("broker-{}.log", self.spawned)),
        )?;
        let end = Instant::now() + Duration::from_secs(10);
        while gpu_broker::client::Client::connect(
            &self.broker_sock(),
            gpu_broker::wire::Role::Observer,
            0,
        )
        .is_err()
        {
            if Instant::now() > end {
                return Err(format!(
                    "the broker did not come up: {}",
                    self.dir.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.broker = Some(b);
        Ok(())
    }

    fn spawn_worker(&mut self, role: &str) -> Result<Proc, String> {
        self.spawned += 1;
        let args = [
            "--socket".into(),
            self.broker_sock().display().to_string(),
            "--role".into(),
            role.into(),
            "--serve".into(),
            self.serve_path().display().to_string(),
            "--max-batch".into(),
            self.max_batch.to_string(),
            "--max-seq".into(),
            self.max_seq.to_string(),
        ];
        Proc::spawn(
            &self.bin_dir.join("belayer-worker"),
            &args,
            self.dir.join(format!("{role}-{}.log", self.spawned)),
        )
    }

    fn start_shadow(&mut self) -> Result<(), String> {
        let mut s = self.spawn_worker("shadow")?;
        s.wait_event("shadow_ready", LONG)?;
        self.shadow = Some(s);
        Ok(())
    }

    /// SIGKILLs the primary and brings a successor up; returns the timings. With Belayer the
    /// shadow takes over and a new shadow is started (and ready) before this returns, so the
    /// next kill is survivable too; without, broker and worker are restarted cold.
    pub fn kill_primary(&mut self, run_start: f64) -> Result<Failover, String> {
        let mut p = self.primary.take().ok_or("no primary")?;
        let t0 = now();
        p.kill();
        let mut f = Failover {
            at_s: t0 - run_start,
            ..Failover::default()
        };
        let t = |e: &Value| e["t"].as_f64().unwrap_or(t0) - t0;
        let mut next = if self.belayer {
            let mut s = self.shadow.take().ok_or("no shadow")?;
            f.takeover_s = t(&s.wait_event("granted", LONG)?);
            f.serving_s = t(&s.wait_event("serving", LONG)?);
            let r = s.wait_event("rebuilt", LONG)?;
            f.ready_s = t(&r);
            f.rebuild_s = r["seconds"].as_f64().unwrap_or(0.0);
            f.rebuild_tokens = r["tokens"].as_u64().unwrap_or(0);
            f.rebuild_requests = r["requests"].as_u64().unwrap_or(0);
            s
        } else {
            // No broker to keep anything: the worker's weights, KV and log die with it.
            if let Some(mut b) = self.broker.take() {
                b.kill();
            }
            self.start_broker()?;
            let mut s = self.spawn_worker("primary")?;
            f.takeover_s = t(&s.wait_event("granted", LONG)?);
            f.serving_s = t(&s.wait_event("serving", LONG)?);
            f.ready_s = f.serving_s;
            s
        };
        f.cold_load = next.wait_event("serving", LONG)?["cold"] == true;
        self.primary = Some(next);
        if self.belayer {
            self.start_shadow()?;
        }
        Ok(f)
    }
}
