//! The `openhands-ai` app (OpenHands' V1 app server, 1.11.0, installed by
//! `scripts/setup-openhands`), unchanged and configured by its environment only, runs its agent
//! sandbox on Belayer (issue 22, point 6): its docker sandbox service (docker-py on `DOCKER_HOST`)
//! starts the agent-server container on a private dockerd whose default runtime is Belayer
//! (the shipped `configs/docker/daemon-default-runtime.json`), and a conversation started through
//! the app's HTTP API runs a tool step in that sandbox.
//!
//! The daemons and the driver (`assets/openhands/app_conversation.py`) are
//! `belayer_integration::openhands`, shared with `tests/openhands.rs`.

use std::time::Duration;

use belayer_integration::openhands::{Daemons, SERVER, app_conversation};
use serde_json::Value;

/// The app starts its sandbox on the Belayer-default dockerd; a conversation started through
/// the app with a first user message runs one terminal step in it and finishes: the start task
/// READY, the app reports the conversation finished, the stub model saw the step's result, the
/// app's own events hold the step and its result, the step's file is in the sandbox, whose container runs under the Belayer runtime (docker's
/// `HostConfig.Runtime`, and the Belayer shim answers for it), and which Belayer checkpoints.
#[test]
fn openhands_app_runs_a_turn_in_a_belayer_sandbox() {
    // The sandbox's agent-server takes 127.0.0.1:8000, as the SDK suite's does.
    let _port = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let x = Daemons::for_app("app", "");
    let r = app_conversation(&x, Duration::from_secs(600));
    assert_eq!(r["start_task"]["status"], "READY", "{r:#}");
    assert_eq!(r["conversation"]["execution_status"], "finished", "{r:#}");
    // The model was asked again with the terminal step's result (step 1 is `finish`).
    let asked_after_tool = r["stub_events"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|e| e["event"] == "request" && e["k"] == 1 && e["tools"] == true);
    assert!(asked_after_tool, "no model turn after the tool step: {r:#}");
    // The app received the step from its sandbox (the agent-server's webhook).
    let received = |kind: &str| {
        r["app_events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["kind"] == kind && e["tool"] == "terminal")
    };
    assert!(
        received("ActionEvent") && received("ObservationEvent"),
        "the app's events must hold the terminal step and its result: {r:#}"
    );

    let name = r["start_task"]["sandbox_id"].as_str().expect("sandbox id");
    let inspect = x.d.docker(&[
        "inspect",
        "-f",
        "{{.HostConfig.Runtime}} {{.HostConfig.NetworkMode}}",
        name,
    ]);
    assert_eq!(
        inspect.stdout.trim(),
        "belayer host",
        "the app's sandbox must run under the daemon's default runtime, Belayer, on the host's \
         network: {inspect:?}"
    );
    let id = x.d.id(name);
    let status = x.belayer(&["status", &id]);
    assert_eq!(
        status.code, 0,
        "the Belayer shim does not serve the sandbox: {status:?}"
    );
    let file =
        x.d.docker(&["exec", name, "cat", "/workspace/project/app-steps.log"]);
    assert_eq!(
        file.stdout, "step 0: written by the agent the app started\n",
        "the terminal step's file in the sandbox: {file:?}"
    );
    // Every name the sandbox looked up went to the driver's resolver on 127.0.0.1: the webhook's
    // host, and github.com, which agent-server 1.34.0 clones public skills from whenever the app
    // asks for them (always); NXDOMAIN, so the clone fails at once and nothing leaves the machine.
    let unexpected: Vec<&Value> = r["dns_asked"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| *n != "host.docker.internal" && *n != "github.com")
        .collect();
    assert!(
        unexpected.is_empty(),
        "the sandbox looked up names the test does not expect: {unexpected:?}"
    );
    let (checkpoint, took) = x.checkpoint(&id);
    let events: Vec<String> = r["app_events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| match e["tool"].as_str() {
            Some(tool) => format!("{}({tool})", e["kind"].as_str().unwrap_or("?")),
            None => e["kind"].as_str().unwrap_or("?").to_string(),
        })
        .collect();
    println!(
        "openhands-ai app on belayer: app up in {} s, sandbox started and conversation created \
         in {} s, turn (terminal step, finish) {} s; events the app received: {}; names the \
         sandbox looked up: {}; checkpoint {checkpoint} of its sandbox in {:.2} s (cli)",
        r["app_ready_s"],
        r["sandbox_ready_s"],
        r["turn_s"],
        events.join(", "),
        r["dns_asked"],
        took.as_secs_f64()
    );
}
