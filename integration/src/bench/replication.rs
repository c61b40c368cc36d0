//! `belayer-bench push`'s replication lag: the reference episode, then `auto`'s 12-turn agent
//! loop (1–3 s think gaps, `llm-start` hinted), in a sandbox with `io.belayer.checkpoint=auto`
//! and `io.belayer.replicate=REPO` on node A (the node's default upload rate and in-flight
//! bounds), `belayer status` sampled every [`PERIOD`] from the sandbox's start until replication
//! has caught up after the last turn. Reported: `replication.behind_ms` (how long the oldest
//! checkpoint not yet in the registry has waited) and the checkpoints behind, over every sample;
//! per checkpoint, the time from its instant to the first sample in which it or a newer one was
//! replicated; pushes, failures, how long replication took to catch up after the last turn, and
//! the bytes the registry stored.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use belayer_registry::testing::Registry;
use serde_json::{Value, json};

use crate::Containerd;
use crate::bench::auto::{self, unix_ms};
use crate::bench::check::Checks;
use crate::bench::ctrd::{BELAYER, remove};
use crate::bench::stats::{percentile, round3};
use crate::bench::wait_until;
use crate::episode::{Action, Sandbox};

/// How often `belayer status` is asked.
pub const PERIOD: Duration = Duration::from_millis(200);
/// How long replication may take to catch up after the last turn.
const DRAIN_LIMIT: Duration = Duration::from_secs(180);

/// One `belayer status` of the sandbox.
struct Sample {
    at_ms: u64,
    /// Taken while the episode ran (not while replication caught up after it): the catching up
    /// is waited for from the first sample that is not.
    in_episode: bool,
    behind: usize,
    behind_ms: u64,
    newest: Option<u64>,
    pushing: bool,
}

/// What the sampler saw: the samples, each checkpoint's instant, the last status.
#[derive(Default)]
struct Seen {
    samples: Vec<Sample>,
    created_ms: BTreeMap<u64, u64>,
    last: Value,
}

fn seq(v: &Value) -> Option<u64> {
    v.as_str()?.parse().ok()
}

/// Asks `belayer status` once, and `belayer inspect` of each checkpoint not seen before.
fn sample(a: &Containerd, id: &str, in_episode: bool, seen: &mut Seen) {
    let at_ms = unix_ms();
    let Ok(status) = serde_json::from_str::<Value>(&a.belayer(&["status", id]).stdout) else {
        return;
    };
    for cp in status["checkpoints"].as_array().into_iter().flatten() {
        let Some(k) = seq(cp) else { continue };
        if let Entry::Vacant(e) = seen.created_ms.entry(k) {
            let info = a.belayer(&["inspect", id, &k.to_string()]).stdout;
            let created = serde_json::from_str::<Value>(&info).ok();
            if let Some(ms) = created.and_then(|v| v["created_unix_ms"].as_u64()) {
                e.insert(ms);
            }
        }
    }
    let r = &status["replication"];
    seen.samples.push(Sample {
        at_ms,
        in_episode,
        behind: r["behind"].as_array().map_or(0, Vec::len),
        behind_ms: r["behind_ms"].as_u64().unwrap_or(0),
        newest: seq(&r["newest"]),
        pushing: !r["pushing"].is_null(),
    });
    seen.last = status;
}

/// The sandbox in automatic mode replicating to `repo`, the episode and the agent loop run
/// while the sampler asks its status; returns the figures (see [`table`]).
pub fn measure(
    a: &Containerd,
    registry: &Registry,
    repo: &str,
    actions: &[Action],
    checks: &mut Checks,
) -> Value {
    let id = "push-auto";
    let replicate = format!("io.belayer.replicate={repo}");
    let annotations = ["io.belayer.checkpoint=auto", replicate.as_str()];
    let stored_before = registry_bytes(registry);
    let s = Sandbox::start_annotated(a, BELAYER, id, &annotations);
    let (episode_done, stop) = (AtomicBool::new(false), AtomicBool::new(false));
    let seen = Mutex::new(Seen::default());
    let (episode_s, drain_s) = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                sample(a, id, !episode_done.load(Ordering::Relaxed), &mut seen);
                drop(seen);
                std::thread::sleep(PERIOD);
            }
        });
        let start = Instant::now();
        s.run(actions);
        auto::agent_loop(a, &s, true, 0..auto::TURNS);
        let episode_s = start.elapsed().as_secs_f64();
        episode_done.store(true, Ordering::Relaxed);
        let drained = Instant::now();
        wait_until(DRAIN_LIMIT, || {
            let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            seen.samples
                .last()
                .is_some_and(|s| !s.in_episode && s.behind == 0 && !s.pushing)
        });
        let drain_s = drained.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        (episode_s, drain_s)
    });
    remove(a, id);
    let seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    let stored = registry_bytes(registry).saturating_sub(stored_before);
    figures(&seen, episode_s, drain_s, stored, checks)
}

/// The bytes of every blob in the registry's storage.
fn registry_bytes(registry: &Registry) -> u64 {
    super::push::stored(registry).values().sum()
}

fn figures(seen: &Seen, episode_s: f64, drain_s: f64, stored: u64, checks: &mut Checks) -> Value {
    let behind_ms: Vec<f64> = seen.samples.iter().map(|s| s.behind_ms as f64).collect();
    let behind: Vec<f64> = seen.samples.iter().map(|s| s.behind as f64).collect();
    // Per checkpoint: its instant to the first sample in which it, or a newer one, was
    // replicated (none: it never was).
    let to_safe: BTreeMap<u64, Option<u64>> = seen
        .created_ms
        .iter()
        .map(|(&k, &created)| {
            let first = seen
                .samples
                .iter()
                .find(|s| s.newest.is_some_and(|n| n >= k) && s.at_ms >= created);
            (k, first.map(|s| s.at_ms - created))
        })
        .collect();
    let safe_ms: Vec<f64> = to_safe.values().flatten().map(|&ms| ms as f64).collect();
    let r = &seen.last["replication"];
    let newest = seen.created_ms.keys().next_back().copied();
    let caught_up = newest.is_some()
        && seq(&r["newest"]) == newest
        && r["behind"].as_array().is_some_and(Vec::is_empty);
    let failures = r["failures"].as_u64();
    checks.record(
        "replication",
        1,
        "push-auto",
        "replication reached the newest automatic checkpoint, no push failed",
        caught_up && failures == Some(0),
        format!("{r}"),
    );
    let dist = |xs: &[f64]| {
        json!({
            "n": xs.len(),
            "p50": percentile(xs, 50.0),
            "p99": percentile(xs, 99.0),
            "max": xs.iter().copied().reduce(f64::max),
        })
    };
    json!({
        "period_ms": PERIOD.as_millis() as u64,
        "episode_s": round3(episode_s),
        "drain_s": round3(drain_s),
        "checkpoints_taken": seen.created_ms.len(),
        "pushes": r["pushes"],
        "failures": failures,
        "replicated": r["replicated"],
        "behind_ms": dist(&behind_ms),
        "behind": dist(&behind),
        "to_replicated_ms": dist(&safe_ms),
        "coalesced": seen.created_ms.len().saturating_sub(r["replicated"].as_array().map_or(0, Vec::len)),
        "never_replicated": to_safe.values().filter(|v| v.is_none()).count(),
        "per_checkpoint_ms": to_safe.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "registry_bytes_stored": stored,
        "last_status": seen.last,
    })
}

/// The one-line summary's part.
pub fn summary(lag: &Value) -> Value {
    json!({
        "checkpoints_taken": lag["checkpoints_taken"],
        "pushes": lag["pushes"],
        "behind_ms": lag["behind_ms"],
        "behind": lag["behind"],
        "to_replicated_ms": lag["to_replicated_ms"],
    })
}

/// The Markdown table of the replication lag.
pub fn table(lag: &Value) -> String {
    let cell = |v: &Value| v.as_f64().map_or_else(|| "—".into(), |x| format!("{x:.0}"));
    let row = |label: &str, d: &Value| {
        format!(
            "| {label} | {} | {} | {} | {} |\n",
            d["n"],
            cell(&d["p50"]),
            cell(&d["p99"]),
            cell(&d["max"])
        )
    };
    let mut t = format!(
        "| replication under automatic checkpoints (episode + {} turns, status every {} ms) | n | p50 | p99 | max |\n|---|---:|---:|---:|---:|\n",
        auto::TURNS,
        lag["period_ms"]
    );
    t.push_str(&row(
        "`behind_ms`, from the sandbox's start until caught up: how long the oldest checkpoint not yet in the registry had waited (ms)",
        &lag["behind_ms"],
    ));
    t.push_str(&row("checkpoints behind, the same samples", &lag["behind"]));
    t.push_str(&row(
        "per checkpoint: its instant → it or a newer one replicated (ms, to the sample that saw it)",
        &lag["to_replicated_ms"],
    ));
    let _ = writeln!(
        t,
        "\n{} automatic checkpoints, {} pushes ({} not pushed: a newer checkpoint went up in its place), \
         {} failed, {} never covered by a replicated one; the episode took {:.1} s and replication caught up {:.1} s \
         after its last turn; the registry stored {:.1} MB.",
        lag["checkpoints_taken"],
        lag["pushes"],
        lag["coalesced"],
        lag["failures"],
        lag["never_replicated"],
        lag["episode_s"].as_f64().unwrap_or(f64::NAN),
        lag["drain_s"].as_f64().unwrap_or(f64::NAN),
        lag["registry_bytes_stored"].as_f64().unwrap_or(0.0) / 1e6,
    );
    t
}
