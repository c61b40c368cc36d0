//! Belayer's side: the episode under the Belayer runtime, `belayer checkpoint`, restore in place
//! after a crash, restore of a live container, and forks of 1, 2, 4 and 8 with the machine's CPU
//! time each took — every restore checked.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::bench::check::{self, Checks};
use crate::bench::control;
use crate::bench::ctrd::{self, BELAYER};
use crate::bench::stats::Samples;
use crate::containerd::{Containerd, Out};
use crate::episode::{self, Action, Sandbox};

/// How many forks the fork measurement starts.
pub const FORKS: u32 = 8;

/// Every fork count measured, the fork of [`FORKS`] last: how the fork's time grows with the
/// count, beside the CPU it takes, shows whether it is bound by the machine's cores.
pub const FORK_COUNTS: &[u32] = &[1, 2, 4, FORKS];

/// The samples' key of a fork of `n`'s wall time; `{key}_cpu` holds its CPU time.
pub fn fork_key(n: u32) -> String {
    format!("belayer_fork{n}")
}

/// Runs `belayer ARGS`, returning its output and wall time.
fn timed(c: &Containerd, args: &[&str]) -> (Out, f64) {
    let start = Instant::now();
    let out = c.belayer(args);
    (out, start.elapsed().as_secs_f64())
}

/// Runs a `belayer restore`, then waits for `ctr tasks ls` to show the task running; the
/// time covers both.
fn restore(
    c: &Containerd,
    run: u32,
    what: &str,
    args: &[&str],
    checks: &mut Checks,
) -> Option<f64> {
    let start = Instant::now();
    let out = c.belayer(args);
    let running =
        out.code == 0 && ctrd::wait_status(c, &[args[1]], "RUNNING", Duration::from_secs(60));
    let secs = start.elapsed().as_secs_f64();
    checks.record(
        "belayer",
        run,
        args[1],
        &format!("{what} runs the task"),
        running,
        format!("{out:?}"),
    );
    running.then_some(secs)
}

/// One run of Belayer's measurements; returns the checkpoint's manifest figures.
pub fn measure(
    c: &Containerd,
    run: u32,
    actions: &[Action],
    samples: &mut Samples,
    checks: &mut Checks,
) -> Value {
    let id = format!("belayer-{run}");
    let (s, secs) = ctrd::episode(c, BELAYER, &id, actions);
    samples.push("episode_belayer", secs);
    let exec = |script: &str| s.exec(script, None);

    let (out, secs) = timed(c, &["checkpoint", &id]);
    checks.record(
        "belayer",
        run,
        &id,
        "belayer checkpoint succeeds",
        out.code == 0,
        out.stderr.trim(),
    );
    let cp = out.stdout.trim().to_string();
    let info: Value =
        serde_json::from_str(&c.belayer(&["inspect", &id, &cp]).stdout).unwrap_or(Value::Null);
    let frozen_us = info["timings"]["frozen_us"].as_u64();
    checks.record(
        "belayer",
        run,
        &id,
        "inspect shows the frozen time",
        frozen_us.is_some(),
        info.to_string(),
    );
    samples.push("belayer_checkpoint", secs);
    if let Some(us) = frozen_us {
        samples.push("belayer_frozen", us as f64 / 1e6);
    }
    eprintln!(
        "  belayer checkpoint {secs:.2}s (frozen {:.2}s)",
        frozen_us.unwrap_or(0) as f64 / 1e6
    );

    s.run(&episode::more_changes());
    ctrd::crash(c, &id);
    if let Some(secs) = restore(c, run, "restore after a crash", &["restore", &id], checks) {
        samples.push("belayer_restore", secs);
        eprintln!("  belayer restore in place {secs:.2}s");
        check::restored(
            checks,
            "belayer",
            run,
            &format!("{id} (in place)"),
            None,
            &exec,
        );
        check::rolled_back(checks, "belayer", run, &format!("{id} (in place)"), &exec);
    }

    s.run(&episode::more_changes());
    if let Some(secs) = restore(
        c,
        run,
        "restore of a live container",
        &["restore", &id, "--checkpoint", &cp],
        checks,
    ) {
        samples.push("belayer_restore_live", secs);
        eprintln!("  belayer restore live {secs:.2}s");
        check::restored(checks, "belayer", run, &format!("{id} (live)"), None, &exec);
        check::rolled_back(checks, "belayer", run, &format!("{id} (live)"), &exec);
    }

    breakdown(c, run, &id, &cp, samples, checks);
    for &n in FORK_COUNTS {
        fork(c, run, &id, &cp, n, samples, checks);
    }
    ctrd::remove(c, &id);
    let _ = c.belayer(&["rm", &id, &cp]);
    json!({ "run": run, "checkpoint": cp, "sizes": info["sizes"], "timings": info["timings"], "criu_stats": info["criu_stats"] })
}

/// `belayer fork --count N`, timed until all N tasks run, with the machine's busy CPU time over
/// the same span; each fork checked, then removed.
fn fork(
    c: &Containerd,
    run: u32,
    id: &str,
    cp: &str,
    n: u32,
    samples: &mut Samples,
    checks: &mut Checks,
) {
    let count = n.to_string();
    let cpu_before = crate::machine_cpu_s();
    let start = Instant::now();
    let out = c.belayer(&["fork", id, "--checkpoint", cp, "--count", &count]);
    let forks: Vec<String> = out.stdout.lines().map(str::to_string).collect();
    let ids: Vec<&str> = forks.iter().map(String::as_str).collect();
    let running = out.code == 0
        && forks.len() == n as usize
        && ctrd::wait_status(c, &ids, "RUNNING", Duration::from_secs(120));
    let secs = start.elapsed().as_secs_f64();
    let cpu = crate::machine_cpu_since(cpu_before);
    checks.record(
        "belayer",
        run,
        id,
        &format!("fork of {n} runs {n} tasks"),
        running,
        format!("{out:?}"),
    );
    if running {
        let key = fork_key(n);
        samples.push(&key, secs);
        if let Some((busy, steal)) = cpu {
            samples.push(&format!("{key}_cpu"), busy);
            samples.push(&format!("{key}_steal"), steal);
        }
        let (busy, steal) = cpu.unwrap_or((f64::NAN, f64::NAN));
        eprintln!("  belayer fork of {n} {secs:.2}s (busy CPU {busy:.2}s, stolen {steal:.2}s)");
        for f in &forks {
            let s = Sandbox::attach(c, f);
            let exec = |script: &str| s.exec(script, None);
            check::restored(checks, "belayer", run, f, None, &exec);
            check::rolled_back(checks, "belayer", run, f, &exec);
        }
    }
    for f in &forks {
        ctrd::remove(c, f);
    }
}

/// One more restore of the live container, straight through the control API, for the shim's
/// own split of the time (the CLI does not print it); checked like the others.
fn breakdown(
    c: &Containerd,
    run: u32,
    id: &str,
    cp: &str,
    samples: &mut Samples,
    checks: &mut Checks,
) {
    let start = Instant::now();
    let answer = control::restore(&c.ns, id, cp.parse().unwrap_or(0));
    let secs = start.elapsed().as_secs_f64();
    let detail = match &answer {
        Ok(v) => v.to_string(),
        Err(e) => e.clone(),
    };
    let ok = answer.is_ok() && ctrd::task_status(c, id) == "RUNNING";
    checks.record(
        "belayer",
        run,
        id,
        "restore through the control API runs the task",
        ok,
        detail,
    );
    let Some(info) = answer.ok().filter(|_| ok) else {
        return;
    };
    samples.push("belayer_restore_shim", secs);
    for (key, field) in [
        ("verify", "verify_ms"),
        ("mount", "mount_ms"),
        ("criu", "restore_ms"),
    ] {
        if let Some(ms) = info[field].as_u64() {
            samples.push(&format!("belayer_restore_{key}"), ms as f64 / 1e3);
        }
    }
    eprintln!("  belayer restore (control API) {secs:.2}s: {info}");
    let s = Sandbox::attach(c, id);
    check::restored(
        checks,
        "belayer",
        run,
        &format!("{id} (control API)"),
        None,
        &|script| s.exec(script, None),
    );
}
