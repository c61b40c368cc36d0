//! OpenHands V1 sandboxes on a private dockerd (issue 22): the daemons, the scripted
//! conversation's driver (`assets/openhands/conversation.py`) and its report, where a checkpoint
//! fell among the model's turns, and the `openhands-ai` app's driver
//! (`assets/openhands/app_conversation.py`). Shared by `tests/openhands.rs`,
//! `tests/openhands_app.rs` and `belayer-bench openhands`.
//!
//! The sandbox uses the host's network (`network="host"`, the agent-server on 127.0.0.1:8000, the
//! stub LLM on a loopback port): no bridge, no 172.x/10.x traffic. OpenHands' DockerWorkspace asks
//! docker for `--ulimit nofile=65536:65536`; this machine's hard limit is 20000 and root lacks
//! CAP_SYS_RESOURCE, so that fails under runc too: the driver runs with
//! `integration/assets/openhands/bin/docker` first on PATH, which lowers that one value to the
//! machine's hard limit (a property of the machine, not of Belayer).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::bench::wait_until;
use crate::{Containerd, Docker, Flavor, Out, Scratch, prereq};

/// Where `scripts/setup-openhands` installs OpenHands.
pub const VENV: &str = "/opt/belayer/openhands/venv";
/// Where it installs the `openhands-ai` app (the V1 app server), in a venv of its own.
pub const APP_VENV: &str = "/opt/belayer/openhands-app/venv";

/// An agent-server image `scripts/setup-openhands` builds: its archive in the images dir, and the
/// name `scripts/images-openhands --import` gives it.
pub struct AgentImage {
    pub tar: &'static str,
    pub name: &'static str,
}

/// The SDK suite's: openhands-agent-server 1.58.2.
pub const IMAGE: AgentImage = AgentImage {
    tar: "openhands-agent-server.rootfs.tar",
    name: "belayer.local/openhands-agent-server:1.58.2",
};
/// The app's: the agent-server `openhands-ai` 1.11.0 pins (1.34.0), with chromium.
pub const APP_IMAGE: AgentImage = AgentImage {
    tar: "openhands-agent-server-1.34.0.rootfs.tar",
    name: "belayer.local/openhands-agent-server:1.34.0",
};
/// DockerWorkspace runs the server with `--port 8000`; on the host's network that is the port.
pub const SERVER_PORT: u16 = 8000;
/// The server's port is the machine's: one conversation at a time in a process.
pub static SERVER: Mutex<()> = Mutex::new(());

/// The tools of the scripted task, in order (`conversation.py`'s `task`).
pub const TOOLS: [&str; 8] = [
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
pub const STEPS_LOG: &str = "step 0: project created\nstep 3: test rc=1\nstep 5: begin\n\
                             step 5: test rc=0\nstep 6: 4 lines before\n";
/// calc.py after the task.
pub const CALC_PY: &str = "def add(a, b):\n    return a + b\n";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn assets() -> PathBuf {
    repo().join("integration/assets/openhands")
}

/// A private containerd and a dockerd on it with the agent-server image imported: Belayer as the
/// daemon's default runtime (the shipped `configs/docker/daemon-default-runtime.json`) with a
/// Belayer config, or docker's own default (runc).
pub struct Daemons {
    pub d: Docker,
    pub c: Containerd,
    pub scratch: Scratch,
}

impl Daemons {
    /// Belayer as dockerd's default runtime; its shims read `belayer_toml`.
    #[track_caller]
    pub fn with_belayer(name: &str, belayer_toml: &str) -> Self {
        Self::start(name, Some(belayer_toml), &IMAGE, false)
    }

    /// Like [`Daemons::with_belayer`], for the `openhands-ai` app: its image ([`APP_IMAGE`]), and
    /// the daemon's containers resolving names through 127.0.0.1 only (the shipped
    /// `daemon-default-runtime.json` plus `"dns": ["127.0.0.1"]`), where the machine's resolver
    /// is off the machine. The app's sandbox, on the host's network, looks up
    /// `host.docker.internal` for its webhook: the app driver answers that name on 127.0.0.1:53
    /// (`assets/openhands/loopback_dns.py`) and no other.
    #[track_caller]
    pub fn for_app(name: &str, belayer_toml: &str) -> Self {
        Self::start(name, Some(belayer_toml), &APP_IMAGE, true)
    }

    /// docker's default runtime, runc (`io.containerd.runc.v2`).
    #[track_caller]
    pub fn with_runc(name: &str) -> Self {
        Self::start(name, None, &IMAGE, false)
    }

    #[track_caller]
    fn start(name: &str, belayer_toml: Option<&str>, image: &AgentImage, app: bool) -> Self {
        let (python, venv) = if app {
            (
                Path::new(APP_VENV).join("bin/python"),
                "openhands-ai 1.11.0",
            )
        } else {
            (Path::new(VENV).join("bin/python"), "OpenHands 1.58.2")
        };
        if !python.is_file() {
            prereq::missing(
                &format!("{} ({venv})", python.display()),
                "run scripts/setup-openhands",
            );
        }
        if !prereq::images_dir().join(image.tar).is_file() {
            prereq::missing(
                &prereq::images_dir().join(image.tar).display().to_string(),
                "build it: scripts/setup-openhands",
            );
        }
        let scratch = Scratch::new(&format!("openhands-{name}"));
        let config = belayer_toml.map(|toml| {
            let config = scratch.path().join("belayer.toml");
            std::fs::write(&config, toml).expect("belayer config");
            config
        });
        let shipped = repo().join("configs/docker/daemon-default-runtime.json");
        let daemon_json = match (config.is_some(), app) {
            (false, _) => None,
            (true, false) => Some(shipped),
            (true, true) => {
                let text = std::fs::read_to_string(&shipped).expect("the shipped daemon.json");
                let mut json: Value = serde_json::from_str(&text).expect("daemon.json is JSON");
                json["dns"] = serde_json::json!(["127.0.0.1"]);
                let path = scratch.path().join("daemon.json");
                std::fs::write(&path, json.to_string()).expect("write daemon.json");
                Some(path)
            }
        };
        let c = Containerd::start_configured(Flavor::V2, None, config);
        let d = Docker::start_with_config(&c, daemon_json.as_deref());
        let import = crate::containerd::run(
            Command::new(repo().join("scripts/images-openhands"))
                .arg("--import")
                .env("DOCKER_HOST", &d.host)
                .env("OPENHANDS_IMAGE_TAR", image.tar)
                .env("OPENHANDS_IMAGE", image.name),
            None,
            Duration::from_secs(300),
        );
        assert_eq!(
            import.code, 0,
            "scripts/images-openhands --import: {import:?}"
        );
        Self { d, c, scratch }
    }

    /// `belayer ARGS` in docker's namespace.
    pub fn belayer(&self, args: &[&str]) -> Out {
        crate::containerd::run(
            &mut self.c.belayer_cmd_in("moby", args),
            None,
            Duration::from_secs(120),
        )
    }

    /// The sandbox's init pid, as containerd sees it. Not docker's `State.Pid`: dockerd does
    /// not follow Belayer's recovery event, so after a recovery it still shows the dead init's.
    #[track_caller]
    pub fn init_pid(&self, id: &str) -> i64 {
        let row = self.c.task_row_in("moby", id);
        row.first()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no task {id} in ctr tasks ls: {row:?}"))
    }

    /// A checkpoint of the sandbox through the `belayer` CLI; its id and the CLI's wall time.
    #[track_caller]
    pub fn checkpoint(&self, id: &str) -> (String, Duration) {
        let start = Instant::now();
        let out = self.belayer(&["checkpoint", id]);
        assert_eq!(out.code, 0, "belayer checkpoint {id}: {out:?}");
        (out.stdout.trim().to_string(), start.elapsed())
    }

    /// The manifests of the checkpoints the store holds for sandbox `id`, oldest first, read
    /// from the store: the sandbox is gone once the driver ends, and `belayer inspect` with it.
    pub fn manifests(&self, id: &str) -> Vec<Value> {
        let dir = self.c.store.join("checkpoints/moby").join(id);
        let mut out: Vec<Value> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path().join("manifest.json")).ok())
            .filter_map(|m| serde_json::from_str::<Value>(&m).ok())
            .collect();
        out.sort_by_key(|m| m["created_unix_ms"].as_u64());
        out
    }
}

/// A loopback port free now, for the stub LLM.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// One conversation turn through the `openhands-ai` app on `x`'s dockerd (made by
/// [`Daemons::for_app`]): `assets/openhands/app_conversation.py` starts the app with
/// `DOCKER_HOST` on that daemon and drives it through its HTTP API. Its JSON report; the driver
/// failing, or running past `limit`, fails the test with the app's log.
#[track_caller]
pub fn app_conversation(x: &Daemons, limit: Duration) -> Value {
    let dir = x.scratch.path();
    let (report, app_log, state) = (dir.join("app.json"), dir.join("app.log"), dir.join("app"));
    std::fs::create_dir_all(&state).expect("the app's persistence dir");
    let mut cmd = Command::new(Path::new(APP_VENV).join("bin/python"));
    cmd.arg(assets().join("app_conversation.py"))
        .args(["--image", APP_IMAGE.name])
        .args(["--app-port", &free_port().to_string()])
        .args(["--llm-port", &free_port().to_string()])
        .arg("--state")
        .arg(&state)
        .arg("--events")
        .arg(dir.join("app.events"))
        .arg("--app-log")
        .arg(&app_log)
        .arg("--out")
        .arg(&report)
        .env("DOCKER_HOST", &x.d.host);
    let out = crate::containerd::run(&mut cmd, None, limit);
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    if out.code != 0 || text.is_empty() {
        let log = std::fs::read_to_string(&app_log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(60).collect();
        panic!(
            "the app's conversation failed: {out:?}\nreport: {text}\nthe app's log (tail):\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    serde_json::from_str(&text).expect("the app driver's report is JSON")
}

/// The files one conversation's driver reads and writes.
pub struct Run {
    report: PathBuf,
    log: PathBuf,
    id_file: PathBuf,
    events: PathBuf,
    gates: PathBuf,
}

impl Run {
    /// The run `name`'s files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
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
    pub fn spawn(&self, d: &Docker, hold: &[usize], think_s: f64) -> Child {
        let hold: Vec<String> = hold.iter().map(|k| k.to_string()).collect();
        let mut cmd = Command::new(Path::new(VENV).join("bin/python"));
        cmd.arg(assets().join("conversation.py"))
            .args(["--image", IMAGE.name, "--port", &SERVER_PORT.to_string()])
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

    /// The last 80 lines of the driver's output.
    pub fn driver_log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(80).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The stub's events so far.
    pub fn events(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.events)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Waits until the stub has an event matching `f`, failing after `limit`.
    #[track_caller]
    pub fn wait_event(&self, what: &str, limit: Duration, f: impl Fn(&Value) -> bool) -> Value {
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

    /// Waits until the model was asked for step `k` (a held step waits for [`Run::release`]).
    #[track_caller]
    pub fn wait_asked(&self, k: u64, limit: Duration) -> Value {
        self.wait_event(&format!("the model asked for step {k}"), limit, |e| {
            e["event"] == "request" && e["k"] == k
        })
    }

    /// Lets the stub answer held step `k`.
    pub fn release(&self, k: usize) {
        std::fs::write(self.gates.join(format!("release-{k}")), b"").expect("release gate");
    }

    /// The sandbox's container id, once DockerWorkspace has started it.
    #[track_caller]
    pub fn container_id(&self, limit: Duration) -> String {
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
    pub fn finish(
        &self,
        mut child: Child,
        limit: Duration,
        context: impl Fn() -> String,
    ) -> Report {
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
pub struct Report(pub Value);

impl Report {
    /// The conversation finished; every tool step is in the server's history once, in order,
    /// answered without error; the project's files are as the task leaves them.
    #[track_caller]
    pub fn assert_task_done(&self) {
        let r = &self.0;
        assert_eq!(r["error"], Value::Null, "{r:#}");
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
            let answers: Vec<&Value> = history
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

/// One model turn as the stub saw it: asked for step `k` at `request`, answered at `answer`
/// (Unix seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Turn {
    pub k: u64,
    pub request: f64,
    pub answer: f64,
}

/// The answered model turns among the stub's `events`, in order: the agent's requests, which
/// offer tools (a request without, a title say, is answered at once and is no turn).
pub fn model_turns(events: &[Value]) -> Vec<Turn> {
    let at = |e: &Value| e["t"].as_f64().unwrap_or(0.0);
    events
        .iter()
        .filter(|e| e["event"] == "request" && e["tools"] != false)
        .filter_map(|r| {
            let answer = events
                .iter()
                .find(|a| a["event"] == "answer" && a["n"] == r["n"])?;
            Some(Turn {
                k: r["k"].as_u64().unwrap_or_default(),
                request: at(r),
                answer: at(answer),
            })
        })
        .collect()
}

/// Where an instant fell among the model's turns: inside one (request → answer), between two
/// (the agent-server running the previous step's tool), before the first or after the last.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Placement {
    /// Before the first model request (the conversation's set-up).
    Before,
    /// While the model thought about step `k`, `after_s` into the turn.
    InTurn { k: u64, after_s: f64 },
    /// While step `k`'s tool ran (after the model's answer, before the next request), `after_s`
    /// after the answer.
    InTool { k: u64, after_s: f64 },
    /// After the last answer.
    After,
}

impl Placement {
    /// Where `t` (Unix seconds) fell among `turns`.
    pub fn of(turns: &[Turn], t: f64) -> Self {
        let Some(i) = turns.iter().rposition(|turn| turn.request <= t) else {
            return Self::Before;
        };
        let turn = turns[i];
        if t <= turn.answer {
            return Self::InTurn {
                k: turn.k,
                after_s: t - turn.request,
            };
        }
        if i + 1 == turns.len() {
            return Self::After;
        }
        Self::InTool {
            k: turn.k,
            after_s: t - turn.answer,
        }
    }

    /// `before`, `turn`, `tool` or `after`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Before => "before",
            Self::InTurn { .. } => "turn",
            Self::InTool { .. } => "tool",
            Self::After => "after",
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Before => write!(f, "before the first model turn"),
            Self::InTurn { k, after_s } => {
                write!(f, "in model turn {k}, {after_s:.2} s in")
            }
            Self::InTool { k, after_s } => {
                write!(f, "during step {k}'s tool, {after_s:.2} s after the answer")
            }
            Self::After => write!(f, "after the last model turn"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_among_turns() {
        let turns = [
            Turn {
                k: 0,
                request: 10.0,
                answer: 14.0,
            },
            Turn {
                k: 1,
                request: 15.0,
                answer: 19.0,
            },
        ];
        assert_eq!(Placement::of(&turns, 9.0), Placement::Before);
        assert_eq!(
            Placement::of(&turns, 11.0),
            Placement::InTurn { k: 0, after_s: 1.0 }
        );
        assert_eq!(
            Placement::of(&turns, 14.5),
            Placement::InTool { k: 0, after_s: 0.5 }
        );
        assert_eq!(Placement::of(&turns, 19.5), Placement::After);
        let events: Vec<Value> = serde_json::from_str(
            r#"[{"event":"request","k":0,"n":1,"t":9.5,"tools":false},
                {"event":"answer","k":0,"n":1,"t":9.5},
                {"event":"request","k":0,"n":2,"t":10.0,"tools":true},
                {"event":"answer","k":0,"n":2,"t":14.0},
                {"event":"request","k":1,"n":3,"t":15.0,"tools":true}]"#,
        )
        .unwrap();
        assert_eq!(model_turns(&events), vec![turns[0]]);
    }
}
