//! Belayer's side: the episode under the Belayer runtime, `belayer checkpoint`, restore in place
//! after a crash, restore of a live container, and forks of 1, 2, 4 and 8 with the machine's CPU
//! time each took — every restore timed to its task running and to its memory intact, and
//! checked. Under two node settings: Belayer's defaults (lazy restore, nftables network lock) and
//! the baselines' own (eager restore, CRIU's default iptables lock), the like-for-like case.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::bench::check::{self, Checks};
use crate::bench::ctrd::{self, BELAYER};
use crate::bench::stats::Samples;
use crate::containerd::{Containerd, Out};
use crate::episode::{self, Action, Sandbox};

/// The node settings a measurement runs under.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// The samples' key prefix and the checks' system name.
    pub key: &'static str,
    /// Belayer's config.toml for the shims (None: the defaults).
    pub config: Option<&'static str>,
    /// Measure everything (checkpoint, live restores, the restore's split, every fork count);
    /// else the restore in place and the fork of 1.
    pub full: bool,
}

/// Belayer's defaults: lazy restore, CRIU's nftables network lock.
pub const DEFAULTS: Settings = Settings {
    key: "belayer",
    config: None,
    full: true,
};

/// The baselines' settings: memory read before the processes run, CRIU's default (iptables)
/// network lock.
pub const LIKE_BASELINES: Settings = Settings {
    key: "belayer_eager",
    config: Some("lazy_restore = \"off\"\nnetwork_lock = \"iptables\"\n"),
    full: false,
};

/// How many forks the fork measurement starts.
pub const FORKS: u32 = 8;

/// Every fork count measured, the fork of [`FORKS`] last: how the fork's time grows with the
/// count, beside the CPU it takes, shows whether it is bound by the machine's cores.
pub const FORK_COUNTS: &[u32] = &[1, 2, 4, FORKS];

/// The samples' key of a fork of `n`'s wall time under settings `prefix`; `{key}_cpu` holds its
/// CPU time, `{key}_memory` its time to every fork's memory intact.
pub fn fork_key(prefix: &str, n: u32) -> String {
    format!("{prefix}_fork{n}")
}

/// Runs `belayer ARGS`, returning its output and wall time.
fn timed(c: &Containerd, args: &[&str]) -> (Out, f64) {
    let start = Instant::now();
    let out = c.belayer(args);
    (out, start.elapsed().as_secs_f64())
}

/// Runs a `belayer restore`, then waits for `ctr tasks ls` to show the task running, then for
/// its holder to answer with its memory's digest; records both times under `key` and
/// `{key}_memory`, and checks the restored container.
#[allow(clippy::too_many_arguments)]
fn restore(
    c: &Containerd,
    set: Settings,
    run: u32,
    what: &str,
    key: &str,
    args: &[&str],
    samples: &mut Samples,
    checks: &mut Checks,
) {
    let start = Instant::now();
    let out = c.belayer(args);
    let running =
        out.code == 0 && ctrd::wait_status(c, &[args[1]], "RUNNING", Duration::from_secs(60));
    let secs = start.elapsed().as_secs_f64();
    let target = format!("{} ({what})", args[1]);
    checks.record(
        set.key,
        run,
        &target,
        &format!("{what} runs the task"),
        running,
        format!("{out:?}"),
    );
    if !running {
        return;
    }
    let s = Sandbox::attach(c, args[1]);
    let exec = |script: &str| s.exec(script, None);
    let digest = check::digest_after_restore(checks, set.key, run, &target, None, &exec);
    let memory = start.elapsed().as_secs_f64();
    samples.push(key, secs);
    samples.push(&format!("{key}_memory"), memory);
    eprintln!("  {key}: running {secs:.2}s, memory intact {memory:.2}s");
    check::restored(checks, set.key, run, &target, &digest, &exec);
}

/// One run of Belayer's measurements under `set`; returns the checkpoint's manifest figures.
pub fn measure(
    c: &Containerd,
    set: Settings,
    run: u32,
    actions: &[Action],
    samples: &mut Samples,
    checks: &mut Checks,
) -> Value {
    let k = |what: &str| format!("{}_{what}", set.key);
    let id = format!("{}-{run}", set.key.replace('_', "-"));
    let (s, secs) = ctrd::episode(c, BELAYER, &id, actions);
    samples.push(&k("episode"), secs);
    // What asking for the digest costs with no restore behind it: part of every "memory
    // intact" time, on every side.
    let t = Instant::now();
    let live = check::ask_digest(&|script| s.exec(script, None));
    if live.code == 0 {
        samples.push(&k("digest_live"), t.elapsed().as_secs_f64());
    }

    let (out, secs) = timed(c, &["checkpoint", &id]);
    checks.record(
        set.key,
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
    samples.push(&k("checkpoint"), secs);
    if let Some(us) = frozen_us {
        samples.push(&k("frozen"), us as f64 / 1e6);
    }
    eprintln!(
        "  {} checkpoint {secs:.2}s (frozen {:.2}s)",
        set.key,
        frozen_us.unwrap_or(0) as f64 / 1e6
    );

    s.run(&episode::more_changes());
    ctrd::crash(c, &id);
    restore(
        c,
        set,
        run,
        "in place after a crash",
        &k("restore"),
        &["restore", &id],
        samples,
        checks,
    );
    if set.full {
        s.run(&episode::more_changes());
        restore(
            c,
            set,
            run,
            "live",
            &k("restore_live"),
            &["restore", &id, "--checkpoint", &cp],
            samples,
            checks,
        );
        breakdown(c, set, run, &id, &cp, samples, checks);
    }
    let counts: &[u32] = if set.full { FORK_COUNTS } else { &[1] };
    for &n in counts {
        fork(c, set, run, &id, &cp, n, samples, checks);
    }
    ctrd::remove(c, &id);
    let _ = c.belayer(&["rm", &id, &cp]);
    json!({ "settings": set.key, "run": run, "checkpoint": cp, "sizes": info["sizes"], "timings": info["timings"], "criu_stats": info["criu_stats"] })
}

/// `belayer fork --count N`, timed until all N tasks run and until every fork's holder has
/// answered with its memory's digest, with the machine's busy CPU time over the first span;
/// each fork checked, then removed.
#[allow(clippy::too_many_arguments)]
fn fork(
    c: &Containerd,
    set: Settings,
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
        set.key,
        run,
        id,
        &format!("fork of {n} runs {n} tasks"),
        running,
        format!("{out:?}"),
    );
    if running {
        let key = fork_key(set.key, n);
        samples.push(&key, secs);
        if let Some((busy, steal)) = cpu {
            samples.push(&format!("{key}_cpu"), busy);
            samples.push(&format!("{key}_steal"), steal);
        }
        let (busy, steal) = cpu.unwrap_or((f64::NAN, f64::NAN));
        eprintln!("  belayer fork of {n} {secs:.2}s (busy CPU {busy:.2}s, stolen {steal:.2}s)");
        let digests: Vec<Out> = forks
            .iter()
            .map(|f| {
                let s = Sandbox::attach(c, f);
                check::digest_after_restore(checks, set.key, run, f, None, &|script| {
                    s.exec(script, None)
                })
            })
            .collect();
        samples.push(&format!("{key}_memory"), start.elapsed().as_secs_f64());
        for (f, digest) in forks.iter().zip(&digests) {
            let s = Sandbox::attach(c, f);
            check::restored(checks, set.key, run, f, digest, &|script| {
                s.exec(script, None)
            });
        }
    }
    for f in &forks {
        ctrd::remove(c, f);
    }
}

/// One more restore of the live container, by `belayer restore --json`, for the shim's own
/// split of the time; checked like the others.
fn breakdown(
    c: &Containerd,
    set: Settings,
    run: u32,
    id: &str,
    cp: &str,
    samples: &mut Samples,
    checks: &mut Checks,
) {
    let start = Instant::now();
    let out = c.belayer(&["restore", "--json", "--checkpoint", cp, id]);
    let secs = start.elapsed().as_secs_f64();
    let answer: Result<Value, String> = if out.code == 0 {
        serde_json::from_str(out.stdout.trim())
            .map_err(|e| format!("unreadable answer {:?}: {e}", out.stdout))
    } else {
        Err(format!("belayer restore: {out:?}"))
    };
    let detail = match &answer {
        Ok(v) => v.to_string(),
        Err(e) => e.clone(),
    };
    let ok = answer.is_ok() && ctrd::task_status(c, id) == "RUNNING";
    checks.record(
        set.key,
        run,
        id,
        "belayer restore --json runs the task",
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
    eprintln!("  belayer restore --json {secs:.2}s: {info}");
    let s = Sandbox::attach(c, id);
    let exec = |script: &str| s.exec(script, None);
    let target = format!("{id} (restore --json)");
    let digest = check::digest_after_restore(checks, set.key, run, &target, None, &exec);
    check::restored(checks, set.key, run, &target, &digest, &exec);
}
