//! OpenHands V1 (openhands-sdk, -tools, -workspace, -agent-server 1.58.2, installed by
//! `scripts/setup-openhands`), unchanged, runs its agent sandbox on Belayer (issue 22): a private
//! dockerd whose default runtime is Belayer through the shipped
//! `configs/docker/daemon-default-runtime.json`, `DockerWorkspace` starting OpenHands'
//! agent-server image (`scripts/images-openhands`), `get_default_agent` driven by a scripted
//! OpenAI-compatible stub (`integration/assets/openhands/`). A conversation of 7 tool steps
//! (terminal, file edits, a failing then passing test run) reaches FINISHED with the expected
//! files, also when the sandbox's init is SIGKILLed while the model thinks and while a terminal
//! command runs.
//!
//! The sandbox uses the host's network (`network="host"`, the agent-server on 127.0.0.1:8000, the
//! stub on a loopback port): no bridge, no 172.x/10.x traffic. OpenHands' DockerWorkspace asks
//! docker for `--ulimit nofile=65536:65536`; this machine's hard limit is 20000 and root lacks
//! CAP_SYS_RESOURCE, so that fails under runc too: the driver runs with
//! `integration/assets/openhands/bin/docker` first on PATH, which lowers that one value to the
//! machine's hard limit (a property of the machine, not of Belayer).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use belayer_integration::{Containerd, Docker, Flavor, Out, prereq};
use common::*;

/// Where `scripts/setup-openhands` installs OpenHands.
const VENV: &str = "/opt/belayer/openhands/venv";
/// The agent-server image `scripts/images-openhands --import` makes.
const IMAGE: &str = "belayer.local/openhands-agent-server:1.58.2";
const IMAGE_TAR: &str = "openhands-agent-server.rootfs.tar";
/// DockerWorkspace runs the server with `--port 8000`; on the host's network that is the port.
const SERVER_PORT: u16 = 8000;
/// The server's port is the machine's: one conversation at a time.
static SERVER: Mutex<()> = Mutex::new(());

/// The tools of the scripted task, in order (`conversation.py`'s `task`).
const TOOLS: [&str; 8] = [
    "terminal",
    "file_editor",
    "file_editor",
    "terminal",
    "file_editor",
    "terminal",
    "terminal",
    "finish",
];
/// steps.log after the task, each terminal step's lines once, in order.
const STEPS_LOG: &str = "step 0: project created\nstep 3: test rc=1\nstep 5: begin\n\
                         step 5: test rc=0\nstep 6: 4 lines before\n";
const CALC_PY: &str = "def add(a, b):\n    return a + b\n";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn assets() -> PathBuf {
    repo().join("integration/assets/openhands")
}

/// A containerd whose shims read `belayer_toml`, and a dockerd on it with Belayer as its default
/// runtime (the shipped config), with the agent-server image imported.
struct Daemons {
    scratch: Scratch,
    c: Containerd,
    d: Docker,
}

#[track_caller]
fn daemons(name: &str, belayer_toml: &str) -> Daemons {
    let python = Path::new(VENV).join("bin/python");
    if !python.is_file() {
        prereq::missing(
            &format!("{} (OpenHands 1.58.2)", python.display()),
            "run scripts/setup-openhands",
        );
    }
    if !prereq::images_dir().join(IMAGE_TAR).is_file() {
        prereq::missing(
            &prereq::images_dir().join(IMAGE_TAR).display().to_string(),
            "build it: scripts/setup-openhands (or scripts/images-openhands)",
        );
    }
    let scratch = Scratch::new(&format!("openhands-{name}"));
    let config = scratch.path().join("belayer.toml");
    std::fs::write(&config, belayer_toml).expect("belayer config");
    let c = Containerd::start_configured(Flavor::V2, None, Some(config));
    let daemon_json = repo().join("configs/docker/daemon-default-runtime.json");
    let d = Docker::start_with_config(&c, Some(&daemon_json));
    let import = belayer_integration::containerd::run(
        Command::new(repo().join("scripts/images-openhands"))
            .arg("--import")
            .env("DOCKER_HOST", &d.host)
            .env("OPENHANDS_IMAGE", IMAGE),
        None,
        Duration::from_secs(300),
    );
    assert_eq!(
        import.code, 0,
        "scripts/images-openhands --import: {import:?}"
    );
    Daemons { scratch, c, d }
}

/// A loopback port free now, for the stub LLM.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The files one conversation's driver reads and writes.
struct Run {
    report: PathBuf,
    log: PathBuf,
    id_file: PathBuf,
    events: PathBuf,
    gates: PathBuf,
}

impl Run {
    fn new(dir: &Path, name: &str) -> Self {
        let gates = dir.join(format!("{name}.gates"));
        std::fs::create_dir_all(&gates).expect("gates dir");
        Self {
            report: dir.join(format!("{name}.json")),
            log: dir.join(format!("{name}.log")),
            id_file: dir.join(format!("{name}.id")),
            events: dir.join(format!("{name}.events")),
            gates,
        }
    }

    /// Starts `conversation.py` against `d`, the stub holding the steps in `hold` and thinking
    /// `think_s` seconds on each model turn.
    fn spawn(&self, d: &Docker, hold: &[usize], think_s: f64) -> Child {
        let hold: Vec<String> = hold.iter().map(|k| k.to_string()).collect();
        let mut cmd = Command::new(Path::new(VENV).join("bin/python"));
        cmd.arg(assets().join("conversation.py"))
            .args(["--image", IMAGE, "--port", &SERVER_PORT.to_string()])
            .args(["--llm-port", &free_port().to_string()])
            .args(["--hold", &hold.join(",")])
            .args(["--think-s", &think_s.to_string()])
            .arg("--events")
            .arg(&self.events)
            .arg("--gates")
            .arg(&self.gates)
            .arg("--id-file")
            .arg(&self.id_file)
            .arg("--out")
            .arg(&self.report)
            .env("DOCKER_HOST", &d.host)
            .env("OPENHANDS_SUPPRESS_BANNER", "1")
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "true")
            .env(
                "PATH",
                format!(
                    "{}:{VENV}/bin:{}",
                    assets().join("bin").display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            );
        let f = std::fs::File::create(&self.log).expect("driver log");
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("spawn conversation.py")
    }

    fn driver_log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(80).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The stub's events so far.
    fn events(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until the stub has an event matching `f`, failing after `limit`.
    #[track_caller]
    fn wait_event(
        &self,
        what: &str,
        limit: Duration,
        f: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            if let Some(e) = self.events().into_iter().find(|e| f(e)) {
                return e;
            }
            assert!(
                start.elapsed() < limit,
                "no {what} after {limit:?}; stub events {:?}; driver log:\n{}",
                self.events(),
                self.driver_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn release(&self, k: usize) {
        std::fs::write(self.gates.join(format!("release-{k}")), b"").expect("release gate");
    }

    #[track_caller]
    fn container_id(&self, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            if let Ok(id) = std::fs::read_to_string(&self.id_file) {
                return id.trim().to_string();
            }
            assert!(
                start.elapsed() < limit,
                "the sandbox did not start; driver log:\n{}",
                self.driver_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the driver (at most `limit`) and returns its report.
    #[track_caller]
    fn finish(&self, mut child: Child, limit: Duration, context: impl Fn() -> String) -> Report {
        let mut status = None;
        if !wait_until(limit, || {
            status = child.try_wait().expect("wait driver");
            status.is_some()
        }) {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "conversation still running after {limit:?}; driver log:\n{}\n{}",
                self.driver_log(),
                context()
            );
        }
        let status = status.expect("the driver exited");
        let text = std::fs::read_to_string(&self.report).unwrap_or_default();
        assert!(
            status.success() && !text.is_empty(),
            "driver failed ({status}); report {text}; driver log:\n{}\n{}",
            self.driver_log(),
            context()
        );
        Report(serde_json::from_str(&text).expect("driver report is JSON"))
    }
}

/// The driver's JSON report.
struct Report(serde_json::Value);

impl Report {
    /// The conversation finished; every tool step is in the server's history once, in order,
    /// answered without error; the project's files are as the task leaves them.
    #[track_caller]
    fn assert_task_done(&self) {
        let r = &self.0;
        assert_eq!(r["error"], serde_json::Value::Null, "{r:#}");
        assert_eq!(r["status"], "finished", "{r:#}");
        let history = r["history"].as_array().cloned().unwrap_or_default();
        let actions: Vec<(String, String)> = history
            .iter()
            .filter(|e| e["kind"] == "action")
            .map(|e| {
                (
                    e["tool"].as_str().unwrap_or("?").to_string(),
                    e["call"].as_str().unwrap_or("?").to_string(),
                )
            })
            .collect();
        let expected: Vec<(String, String)> = TOOLS
            .iter()
            .enumerate()
            .map(|(k, t)| (t.to_string(), format!("call_{k}")))
            .collect();
        assert_eq!(
            actions, expected,
            "the server's history must hold each tool step once, in order: {:#}",
            r["history"]
        );
        for k in 0..TOOLS.len() - 1 {
            let answers: Vec<&serde_json::Value> = history
                .iter()
                .filter(|e| e["kind"] != "action" && e["call"] == format!("call_{k}").as_str())
                .collect();
            assert_eq!(
                answers.len(),
                1,
                "step {k} must have one result in the server's history: {:#}",
                r["history"]
            );
            assert_eq!(
                answers[0]["kind"], "observation",
                "step {k}: {:#}",
                answers[0]
            );
        }
        assert_eq!(r["files"]["steps.log"], STEPS_LOG, "{:#}", r["files"]);
        assert_eq!(r["files"]["calc.py"], CALC_PY, "{:#}", r["files"]);
    }
}

/// The sandbox's init pid, as containerd sees it. Not docker's `State.Pid`: dockerd does not
/// follow Belayer's recovery event, so after a recovery it still shows the dead init's pid.
#[track_caller]
fn init_pid(c: &Containerd, id: &str) -> i64 {
    let row = c.task_row_in("moby", id);
    row.first()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no task {id} in ctr tasks ls: {row:?}"))
}

fn moby(c: &Containerd, args: &[&str]) -> Out {
    belayer_integration::containerd::run(
        &mut c.belayer_cmd_in("moby", args),
        None,
        Duration::from_secs(120),
    )
}

/// The instants (Unix seconds) of the automatic checkpoints the store holds for `id`, read from
/// their manifests: the sandbox is gone once the driver ends.
fn checkpoint_instants(c: &Containerd, id: &str) -> Vec<f64> {
    let dir = c.store.join("checkpoints/moby").join(id);
    let mut out: Vec<f64> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("manifest.json")).ok())
        .filter_map(|m| serde_json::from_str::<serde_json::Value>(&m).ok())
        .filter_map(|m| m["created_unix_ms"].as_f64())
        .map(|ms| ms / 1e3)
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// A failure-free conversation on Belayer (the default runtime) with automatic checkpoints found
/// from the sandbox's activity (`actions = "activity"`: the agent-server never execs) and a model
/// that thinks 4 s a turn: FINISHED, every step once, the expected files; the sandbox runs under
/// the Belayer shim; automatic checkpoints began while the model thought.
#[test]
fn openhands_conversation_finishes_in_a_belayer_sandbox() {
    let _port = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let x = daemons(
        "plain",
        "checkpoint = \"auto\"\nactions = \"activity\"\nkeep = 100\n",
    );
    let run = Run::new(x.scratch.path(), "plain");
    let child = run.spawn(&x.d, &[], 4.0);
    let id = run.container_id(Duration::from_secs(180));
    let status = moby(&x.c, &["status", &id]);
    assert_eq!(
        status.code, 0,
        "the Belayer shim does not serve the sandbox: {status:?}"
    );
    let report = run.finish(child, Duration::from_secs(300), String::new);
    assert_eq!(report.0["runtime"], "belayer", "{:#}", report.0);
    report.assert_task_done();
    // Where each automatic checkpoint began: in a model turn (request → answer), or between the
    // start and the first request, or after the last answer; never while a tool ran.
    let events = run.events();
    let at = |e: &serde_json::Value| e["t"].as_f64().unwrap_or(0.0);
    let turns: Vec<(f64, f64)> = events
        .iter()
        .filter(|e| e["event"] == "request")
        .filter_map(|r| {
            let answer = events
                .iter()
                .find(|a| a["event"] == "answer" && a["n"] == r["n"])?;
            Some((at(r), at(answer)))
        })
        .collect();
    let instants = checkpoint_instants(&x.c, &id);
    let in_turns = instants
        .iter()
        .filter(|t| turns.iter().any(|(r, a)| r <= *t && *t <= a))
        .count();
    // A tool quiet for longer than the detector's settle time (OpenHands' terminal tool polls
    // tmux for its command's end) reads as a gap too: a checkpoint then is as consistent as any,
    // and delays the tool by its frozen time.
    let in_tools = instants
        .iter()
        .filter(|t| turns.windows(2).any(|w| w[0].1 < **t && **t < w[1].0))
        .count();
    assert!(
        in_turns >= 1,
        "no automatic checkpoint began while the model thought: checkpoints {instants:?}, model \
         turns {turns:?}; containerd's log:\n{}",
        x.c.log_lines(&id, 40)
    );
    println!(
        "openhands on belayer: sandbox ready in {} s, conversation {} s; {} automatic \
         checkpoints: {in_turns} begun while the model thought (4 s a turn), {in_tools} while a \
         quiet tool ran, the rest before the first or after the last model turn; model turns \
         {turns:?}, checkpoints {instants:?}",
        report.0["sandbox_ready_s"],
        report.0["run_s"],
        instants.len()
    );
}

/// A checkpoint of the sandbox through the `belayer` CLI; returns its id and how long the call
/// took.
#[track_caller]
fn checkpoint_now(c: &Containerd, id: &str) -> (String, Duration) {
    let start = Instant::now();
    let out = moby(c, &["checkpoint", id]);
    assert_eq!(out.code, 0, "belayer checkpoint {id}: {out:?}");
    (out.stdout.trim().to_string(), start.elapsed())
}

/// SIGKILLs the sandbox's init and waits until Belayer has recovered it `n` times in all.
#[track_caller]
fn crash_and_wait_recovery(x: &Daemons, run: &Run, id: &str, n: usize) -> serde_json::Value {
    let pid = init_pid(&x.c, id);
    belayer_integration::sigkill(pid).expect("SIGKILL the sandbox's init");
    let mut status = serde_json::Value::Null;
    let recovered = wait_until(Duration::from_secs(120), || {
        let out = moby(&x.c, &["status", id]);
        status = serde_json::from_str(&out.stdout).unwrap_or_default();
        status["recoveries"].as_array().map_or(0, Vec::len) >= n
    });
    assert!(
        recovered,
        "Belayer did not recover the sandbox (recovery {n}): status {status:#}; containerd's log:\n{}\n\
         driver log:\n{}",
        x.c.log_lines(id, 60),
        run.driver_log()
    );
    status["recoveries"][n - 1].clone()
}

/// Automatic recovery on (and automatic checkpoints, which take nothing here: no exec, see
/// docs/openhands.md), the sandbox's init is SIGKILLed twice: while the stub "thinks" about step
/// 4, and while step 5's terminal command runs. Each time the newest checkpoint was taken while
/// the model was asked for the step, with the client's websocket open. Then, with no crash, a
/// checkpoint and an in-place restore while the model thinks about step 6. The conversation still
/// reaches FINISHED; steps.log (append-only) holds each step once, in order; the server's history
/// holds each tool step once; the client's websocket reconnected at most once per crash or
/// restore.
#[test]
fn openhands_conversation_finishes_through_sandbox_crashes() {
    let _port = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let x = daemons("crash", "checkpoint = \"auto\"\nrecover = \"auto\"\n");
    let run = Run::new(x.scratch.path(), "crash");
    let child = run.spawn(&x.d, &[4, 5, 6], 0.2);
    let id = run.container_id(Duration::from_secs(180));
    let asked = |k: u64| move |e: &serde_json::Value| e["event"] == "request" && e["k"] == k;

    // 1. The model "thinks" about step 4: checkpoint, crash, recovery, then the model answers.
    run.wait_event(
        "the model asked for step 4",
        Duration::from_secs(240),
        asked(4),
    );
    let (cp1, took1) = checkpoint_now(&x.c, &id);
    let first = crash_and_wait_recovery(&x, &run, &id, 1);
    run.release(4);

    // 2. Step 5's command runs (it marked itself running and sleeps): crash mid-command.
    run.wait_event(
        "the model asked for step 5",
        Duration::from_secs(240),
        asked(5),
    );
    let (cp2, took2) = checkpoint_now(&x.c, &id);
    run.release(5);
    run.wait_event("step 5's command running", Duration::from_secs(120), |e| {
        e["event"] == "mark" && e["name"] == "step5-running"
    });
    std::thread::sleep(Duration::from_secs(1));
    let second = crash_and_wait_recovery(&x, &run, &id, 2);

    // 3. No crash: checkpoint and restore in place while the model thinks about step 6, the
    //    client's websocket open through both (point 5: usable or cleanly closed, no hang).
    run.wait_event(
        "the model asked for step 6",
        Duration::from_secs(240),
        asked(6),
    );
    let (cp3, took3) = checkpoint_now(&x.c, &id);
    let start = Instant::now();
    let restored = moby(&x.c, &["restore", &id, "--checkpoint", &cp3]);
    assert_eq!(restored.code, 0, "belayer restore {id}: {restored:?}");
    let restore3 = start.elapsed();
    run.release(6);

    let report = run.finish(child, Duration::from_secs(420), || {
        format!("belayer status: {:?}", moby(&x.c, &["status", &id]))
    });
    report.assert_task_done();
    let r = &report.0;
    let closed = r["reconnects"]["closed"].as_u64().unwrap_or(u64::MAX);
    assert!(
        closed <= 3,
        "the client's websocket must reconnect at most once per crash or restore: {:#}",
        r["reconnects"]
    );
    let inspect = |cp: &str| moby(&x.c, &["inspect", &id, cp]).stdout;
    println!(
        "openhands through 2 crashes: conversation {} s; reconnects {}; checkpoint {cp1} (cli {:.2} s) \
         restored in {} ms, checkpoint {cp2} (cli {:.2} s) restored in {} ms; checkpoint {cp3} (cli {:.2} s) restored in place in {:.2} s (cli)\n\
         checkpoint {cp1}: {}\n\
         status: {}\nclient events: {}",
        r["run_s"],
        r["reconnects"],
        took1.as_secs_f64(),
        first["restore"]["total_ms"],
        took2.as_secs_f64(),
        second["restore"]["total_ms"],
        took3.as_secs_f64(),
        restore3.as_secs_f64(),
        inspect(&cp1),
        moby(&x.c, &["status", &id]).stdout,
        r["client_events"]
    );
}
