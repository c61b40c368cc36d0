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
//! The daemons, the driver and where a checkpoint fell are `belayer_integration::openhands`
//! (shared with `belayer-bench openhands`).

mod common;

use std::time::{Duration, Instant};

use belayer_integration::openhands::{Daemons, Placement, Run, SERVER, model_turns};
use common::*;

/// A failure-free conversation on Belayer (the default runtime) with automatic checkpoints found
/// from the sandbox's activity (`actions = "activity"`: the agent-server never execs) and a model
/// that thinks 4 s a turn: FINISHED, every step once, the expected files; the sandbox runs under
/// the Belayer shim; automatic checkpoints began while the model thought.
#[test]
fn openhands_conversation_finishes_in_a_belayer_sandbox() {
    let _port = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let x = Daemons::with_belayer(
        "plain",
        "checkpoint = \"auto\"\nactions = \"activity\"\nkeep = 100\n",
    );
    let run = Run::new(x.scratch.path(), "plain");
    let child = run.spawn(&x.d, &[], 4.0);
    let id = run.container_id(Duration::from_secs(180));
    let status = x.belayer(&["status", &id]);
    assert_eq!(
        status.code, 0,
        "the Belayer shim does not serve the sandbox: {status:?}"
    );
    let report = run.finish(child, Duration::from_secs(300), String::new);
    assert_eq!(report.0["runtime"], "belayer", "{:#}", report.0);
    report.assert_task_done();
    // Where each automatic checkpoint began: in a model turn (request → answer), or between the
    // start and the first request, or after the last answer. A tool quiet for longer than the
    // detector's settle time (OpenHands' terminal tool polls tmux for its command's end) reads
    // as a gap too: a checkpoint then is as consistent as any, and delays the tool by its frozen
    // time.
    let turns = model_turns(&run.events());
    let placed: Vec<Placement> = x
        .manifests(&id)
        .iter()
        .filter_map(|m| m["created_unix_ms"].as_f64())
        .map(|ms| Placement::of(&turns, ms / 1e3))
        .collect();
    let count = |kind: &str| placed.iter().filter(|p| p.kind() == kind).count();
    assert!(
        count("turn") >= 1,
        "no automatic checkpoint began while the model thought: checkpoints {placed:?}, model \
         turns {turns:?}; containerd's log:\n{}",
        x.c.log_lines(&id, 40)
    );
    println!(
        "openhands on belayer: sandbox ready in {} s, conversation {} s; {} automatic \
         checkpoints: {} begun while the model thought (4 s a turn), {} while a quiet tool ran, \
         the rest before the first or after the last model turn: {}",
        report.0["sandbox_ready_s"],
        report.0["conversation_s"],
        placed.len(),
        count("turn"),
        count("tool"),
        placed
            .iter()
            .map(Placement::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    );
}

/// SIGKILLs the sandbox's init and waits until Belayer has recovered it `n` times in all.
#[track_caller]
fn crash_and_wait_recovery(x: &Daemons, run: &Run, id: &str, n: usize) -> serde_json::Value {
    let pid = x.init_pid(id);
    belayer_integration::sigkill(pid).expect("SIGKILL the sandbox's init");
    let mut status = serde_json::Value::Null;
    let recovered = wait_until(Duration::from_secs(120), || {
        let out = x.belayer(&["status", id]);
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
    let x = Daemons::with_belayer("crash", "checkpoint = \"auto\"\nrecover = \"auto\"\n");
    let run = Run::new(x.scratch.path(), "crash");
    let child = run.spawn(&x.d, &[4, 5, 6], 0.2);
    let id = run.container_id(Duration::from_secs(180));
    // 1. The model "thinks" about step 4: checkpoint, crash, recovery, then the model answers.
    run.wait_asked(4, Duration::from_secs(240));
    let (cp1, took1) = x.checkpoint(&id);
    let first = crash_and_wait_recovery(&x, &run, &id, 1);
    run.release(4);

    // 2. Step 5's command runs (it marked itself running and sleeps): crash mid-command.
    run.wait_asked(5, Duration::from_secs(240));
    let (cp2, took2) = x.checkpoint(&id);
    run.release(5);
    run.wait_event("step 5's command running", Duration::from_secs(120), |e| {
        e["event"] == "mark" && e["name"] == "step5-running"
    });
    std::thread::sleep(Duration::from_secs(1));
    let second = crash_and_wait_recovery(&x, &run, &id, 2);

    // 3. No crash: checkpoint and restore in place while the model thinks about step 6, the
    //    client's websocket open through both (point 5: usable or cleanly closed, no hang).
    run.wait_asked(6, Duration::from_secs(240));
    let (cp3, took3) = x.checkpoint(&id);
    let start = Instant::now();
    let restored = x.belayer(&["restore", &id, "--checkpoint", &cp3]);
    assert_eq!(restored.code, 0, "belayer restore {id}: {restored:?}");
    let restore3 = start.elapsed();
    run.release(6);

    let report = run.finish(child, Duration::from_secs(420), || {
        format!("belayer status: {:?}", x.belayer(&["status", &id]))
    });
    report.assert_task_done();
    let r = &report.0;
    let closed = r["reconnects"]["closed"].as_u64().unwrap_or(u64::MAX);
    assert!(
        closed <= 3,
        "the client's websocket must reconnect at most once per crash or restore: {:#}",
        r["reconnects"]
    );
    let inspect = |cp: &str| x.belayer(&["inspect", &id, cp]).stdout;
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
        x.belayer(&["status", &id]).stdout,
        r["client_events"]
    );
}
