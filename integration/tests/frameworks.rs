//! Agent frameworks nobody here wrote, installed from PyPI by `scripts/setup`, run unchanged on
//! Belayer through the recipes in `configs/frameworks/`: mini-swe-agent (its docker environment,
//! one `docker exec` per action) survives its sandbox's init being killed mid-task, and SWE-ReX's
//! docker deployment starts its server in a Belayer sandbox and runs commands there.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use belayer_integration::{Containerd, Docker, Flavor, Scratch, prereq};
use common::*;

/// Where `scripts/setup` installs the frameworks.
const VENV: &str = "/opt/belayer/frameworks/venv";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A driver script of `integration/assets/frameworks` run with the frameworks' venv against `d`.
#[track_caller]
fn driver(d: &Docker, script: &str, scratch: &Path) -> Command {
    let python = Path::new(VENV).join("bin/python");
    if !python.is_file() {
        prereq::missing(
            &format!("{} (mini-swe-agent and swe-rex)", python.display()),
            "run scripts/setup",
        );
    }
    let mut cmd = Command::new(python);
    cmd.arg(repo().join("integration/assets/frameworks").join(script))
        .env("DOCKER_HOST", &d.host)
        .env("MSWEA_SILENT_STARTUP", "1")
        .env("MSWEA_GLOBAL_CONFIG_DIR", scratch)
        .env(
            "PATH",
            format!("{VENV}/bin:{}", std::env::var("PATH").unwrap_or_default()),
        );
    cmd
}

/// Waits for `child` (at most `limit`), then returns its report file as JSON; fails with the
/// driver's output and whatever report it wrote otherwise.
#[track_caller]
fn finish(child: Child, limit: Duration, report: &Path, log: &Path) -> serde_json::Value {
    finish_or(child, limit, report, log, String::new)
}

/// [`finish`], with `context` (say, the shim's view of the sandbox) added to a failure's message.
#[track_caller]
fn finish_or(
    mut child: Child,
    limit: Duration,
    report: &Path,
    log: &Path,
    context: impl Fn() -> String,
) -> serde_json::Value {
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait driver") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "driver still running after {limit:?}; its log:\n{}\n{}",
                std::fs::read_to_string(log).unwrap_or_default(),
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let text = std::fs::read_to_string(report).unwrap_or_default();
    assert!(
        status.success() && !text.is_empty(),
        "driver failed ({status}); its log:\n{}\nits report:\n{text}\n{}",
        std::fs::read_to_string(log).unwrap_or_default(),
        context()
    );
    serde_json::from_str(&text).expect("driver report is JSON")
}

fn spawn_logged(mut cmd: Command, log: &Path) -> Child {
    let f = std::fs::File::create(log).expect("driver log");
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone().expect("log"))
        .stderr(f)
        .spawn()
        .expect("spawn driver")
}

fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// mini-swe-agent with only `run_args` changed (read from the recipe), automatic checkpoints and
/// recovery on through Belayer's config file, policy `replay`: its sandbox's init is SIGKILLed
/// between two actions while the model "thinks"; the run finishes and the repository it built is
/// the same as in a failure-free run under runc.
#[test]
fn mini_swe_agent_finishes_its_task_through_a_sandbox_crash() {
    let scratch = Scratch::new("mini");
    let config = scratch.path().join("belayer.toml");
    std::fs::write(
        &config,
        "checkpoint = \"auto\"\nrecover = \"auto\"\npolicy = \"replay\"\n",
    )
    .expect("belayer config");
    let c = Containerd::start_configured(Flavor::V2, None, Some(config));
    let d = Docker::start(&c);
    let rootfs = prereq::image("sandbox.rootfs.tar");
    d.docker(&["import", &rootfs.display().to_string(), "belayer/sandbox"])
        .ok();
    let run =
        |name: &str, recipe: Option<&Path>, gap: &str| -> (Child, PathBuf, PathBuf, PathBuf) {
            let (id_file, report, log) = (
                scratch.path().join(format!("{name}.id")),
                scratch.path().join(format!("{name}.json")),
                scratch.path().join(format!("{name}.log")),
            );
            let mut cmd = driver(&d, "mini_swe_task.py", scratch.path());
            cmd.args(["--image", "belayer/sandbox", "--gap", gap])
                .arg("--id-file")
                .arg(&id_file)
                .arg("--out")
                .arg(&report);
            if let Some(r) = recipe {
                cmd.arg("--recipe").arg(r);
            }
            (spawn_logged(cmd, &log), id_file, report, log)
        };

    // The reference: mini-swe-agent's defaults (runc), no failure.
    let (child, _, report, log) = run("reference", None, "0.2");
    let reference = finish(child, Duration::from_secs(180), &report, &log);
    assert_eq!(reference["exit_status"], "Submitted", "{reference}");
    assert_eq!(reference["runtime"], "runc", "{reference}");

    // Belayer, through the recipe; the sandbox's init is killed after 5 actions.
    let recipe = repo().join("configs/frameworks/mini-swe-agent.yaml");
    let (child, id_file, report, log) = run("belayer", Some(&recipe), "2");
    let start = Instant::now();
    let id = loop {
        if let Ok(id) = std::fs::read_to_string(&id_file) {
            break id.trim().to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the sandbox did not start; driver log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // The `belayer` CLI in docker's namespace.
    let moby = |args: &[&str]| {
        belayer_integration::containerd::run(
            &mut c.belayer_cmd_in("moby", args),
            None,
            Duration::from_secs(60),
        )
    };
    // Wait for the model's "thinking" gap after action 5, with a checkpoint taken before it.
    let killed_after = loop {
        let journal = json_lines(&moby(&["journal", &id, "--json"]).stdout);
        let done = journal
            .iter()
            .filter(|e| e["exit_code"].is_number())
            .count();
        let idle = journal.iter().all(|e| e["exit_code"].is_number());
        let checkpoints = moby(&["checkpoints", &id]).stdout.lines().count();
        if done >= 5 && idle && checkpoints > 0 {
            break done;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no checkpointed gap after 5 actions: journal {journal:?}, {checkpoints} checkpoints \
             ({:?}); driver log:\n{}",
            moby(&["journal", &id]),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let pid = d
        .docker(&["inspect", "-f", "{{.State.Pid}}", &id])
        .ok()
        .stdout
        .trim()
        .parse::<i32>()
        .expect("init pid");
    belayer_integration::sigkill(pid.into()).expect("SIGKILL the sandbox's init");
    let belayer = finish_or(child, Duration::from_secs(240), &report, &log, || {
        let (journal, status) = (moby(&["journal", &id]), moby(&["status", &id]));
        format!(
            "the shim's journal:\n{}{}\nits status:\n{}{}\ncontainerd's log on it:\n{}",
            journal.stdout,
            journal.stderr,
            status.stdout,
            status.stderr,
            c.log_lines(&id, 60)
        )
    });

    assert_eq!(belayer["runtime"], BELAYER, "{belayer}");
    assert_eq!(belayer["exit_status"], "Submitted", "{belayer}");
    assert_eq!(
        belayer["returncodes"], reference["returncodes"],
        "actions answered differently after the crash: {belayer}"
    );
    assert_eq!(
        belayer["submission"], reference["submission"],
        "the repository differs from the failure-free run"
    );
    let status: serde_json::Value =
        serde_json::from_str(&moby(&["status", &id]).ok().stdout).expect("status JSON");
    let recoveries = status["recoveries"].as_array().cloned().unwrap_or_default();
    assert_eq!(recoveries.len(), 1, "{status}");
    let position = &recoveries[0]["position"];
    assert_eq!(position["policy"], "replay", "{status}");
    assert!(
        position["mismatches"].as_array().is_some_and(Vec::is_empty),
        "replayed actions answered differently: {status}"
    );
    // After a replay the journal stands at every action before the crash: the checkpoint's
    // (named in `reflects`) plus the replayed ones.
    assert_eq!(
        position["action"].as_u64(),
        Some(killed_after as u64),
        "the restored sandbox must reflect every action before the crash: {status}"
    );
    let k = position["reflects"]
        .as_str()
        .and_then(|r| r.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the checkpoint's action in `reflects`");
    assert_eq!(
        k + position["replayed"].as_u64().unwrap_or(0),
        killed_after as u64,
        "the checkpoint plus the replayed actions must cover every action before the crash: {status}"
    );
    println!(
        "mini-swe-agent: killed after action {killed_after}; recovered from checkpoint {} \
         (after action {k}), {} replayed, restore {} ms",
        position["checkpoint"], position["replayed"], recoveries[0]["restore"]["total_ms"]
    );
}

/// SWE-ReX's docker deployment, with `docker_args` from the SWE-agent recipe, starts its server
/// (installed in the image from local wheels) in a Belayer sandbox and runs commands there:
/// a bash session, a one-off command, file write and read.
#[test]
fn swe_rex_runs_commands_in_a_belayer_sandbox() {
    let scratch = Scratch::new("swerex");
    let c = Containerd::start(Flavor::V2);
    let d = Docker::start_networked(&c);
    let rootfs = prereq::image("sandbox-swerex.rootfs.tar");
    d.docker(&[
        "import",
        &rootfs.display().to_string(),
        "belayer/sandbox-swerex",
    ])
    .ok();
    let (report, log) = (
        scratch.path().join("swerex.json"),
        scratch.path().join("swerex.log"),
    );
    let mut cmd = driver(&d, "swerex_task.py", scratch.path());
    cmd.args(["--image", "belayer/sandbox-swerex"])
        .arg("--recipe")
        .arg(repo().join("configs/frameworks/swe-agent.yaml"))
        .arg("--out")
        .arg(&report);
    let out = finish(
        spawn_logged(cmd, &log),
        Duration::from_secs(240),
        &report,
        &log,
    );
    assert_eq!(out["runtime"], BELAYER, "{out}");
    assert_eq!(out["session"], "hello from 42\n", "{out}");
    assert_eq!(out["command"]["exit_code"], 0, "{out}");
    assert!(
        out["command"]["stdout"]
            .as_str()
            .is_some_and(|s| s.contains("bookworm")),
        "{out}"
    );
    assert_eq!(out["read_back"], "written through swe-rex\n", "{out}");
    assert_eq!(out["cwd_after_cd"], "/tmp\n", "{out}");
}

/// The OpenHands recipe's `docker_runtime_kwargs`, fed to docker-py's `containers.run` as OpenHands'
/// docker runtime does, runs the sandbox through Belayer.
#[test]
fn openhands_recipe_kwargs_run_a_belayer_sandbox() {
    let scratch = Scratch::new("openhands");
    let c = Containerd::start(Flavor::V2);
    let d = Docker::start(&c);
    let (report, log) = (
        scratch.path().join("openhands.json"),
        scratch.path().join("openhands.log"),
    );
    let mut cmd = driver(&d, "openhands_kwargs.py", scratch.path());
    cmd.args(["--image", "belayer/busybox"])
        .arg("--recipe")
        .arg(repo().join("configs/frameworks/openhands.toml"))
        .arg("--out")
        .arg(&report);
    let out = finish(
        spawn_logged(cmd, &log),
        Duration::from_secs(120),
        &report,
        &log,
    );
    assert_eq!(out["runtime"], BELAYER, "{out}");
    assert_eq!(out["status"], "running", "{out}");
    assert_eq!(out["exec"]["code"], 0, "{out}");
    assert_eq!(
        out["exec"]["output"],
        format!("hello from {}\n", out["hostname"].as_str().unwrap_or("?")),
        "{out}"
    );
}
