//! `belayer-bench push`: checkpoints leaving their node through a real OCI registry (issue 25),
//! against containerd's own checkpoint image pushed by `ctr`, in one run. Two "nodes" (two
//! private containerds, each with its own root, state and Belayer store) and Debian's
//! `docker-registry` on loopback with htpasswd authentication.
//!
//! On each side the reference episode runs on node A; checkpoint 1 is taken and pushed (a first
//! push), the agent's next turn runs, checkpoint 2 is taken and pushed (incremental); node B
//! pulls checkpoint 2 by digest and restores it into a container of its own, checked as
//! `belayer-bench env` checks a restore (the holder's memory digest, the counter, the
//! filesystem) and for the next turn's file. Belayer: `belayer checkpoint`, `belayer push`,
//! `ctr containers create` + `belayer pull --into`. containerd: `ctr c checkpoint --rw --task`,
//! `ctr images push`, `ctr images pull` + `ctr c restore --rw --live`, under runc. Bytes are
//! what the registry's storage gained (blobs and manifests), the same count for both. Then the
//! episode runs again in automatic mode with replication on ([`replication`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use belayer_registry::testing::{PASSWORD, Registry, USER};
use serde_json::{Value, json};

use crate::bench::check::{self, Checks};
use crate::bench::ctrd::{self, BELAYER, RUNC, remove, task_pid, wait_status};
use crate::bench::record::{Record, first_line};
use crate::bench::stats::{Samples, round3};
use crate::bench::{Common, replication};
use crate::containerd::Out;
use crate::episode::{self, Action, SANDBOX, Sandbox};
use crate::{Containerd, Flavor, prereq};

/// `belayer-bench push`: needs root, containerd 2.x, runc, CRIU, Debian's `docker-registry` and
/// `htpasswd`, the images of scripts/images and the workspace's binaries.
#[derive(clap::Args, Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Memory of the episode's background process, MB
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..))]
    pub holder_mb: u32,
    #[command(flatten)]
    pub common: Common,
}

/// The registry, a docker config with its credentials, and the two nodes.
struct Nodes {
    registry: Registry,
    /// `$DOCKER_CONFIG` for `belayer push`/`pull` (and node A's replication).
    docker: PathBuf,
    a: Containerd,
    b: Containerd,
}

/// A side of the comparison.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Belayer,
    Containerd,
}

impl Side {
    fn key(self) -> &'static str {
        match self {
            Self::Belayer => "belayer",
            Self::Containerd => "containerd",
        }
    }

    fn runtime(self) -> &'static str {
        match self {
            Self::Belayer => BELAYER,
            Self::Containerd => RUNC,
        }
    }

    /// Checkpoints container `id` of node A (`tag`: where the checkpoint will go).
    fn checkpoint(self, n: &Nodes, id: &str, tag: &str) -> Out {
        match self {
            Self::Belayer => n.a.belayer(&["checkpoint", id]),
            Self::Containerd => {
                n.a.ctr(&["containers", "checkpoint", "--rw", "--task", id, tag])
            }
        }
    }

    /// Pushes the checkpoint `checkpointed` printed to `tag`.
    fn push(self, n: &Nodes, id: &str, checkpointed: &Out, tag: &str) -> Out {
        match self {
            Self::Belayer => {
                let cp = checkpointed.stdout.trim();
                n.a.belayer_docker(&n.docker, &["push", "--json", id, cp, tag])
            }
            Self::Containerd => {
                n.a.ctr(&["images", "push", "--user", &user(), "--plain-http", tag])
            }
        }
    }

    /// The manifest (Belayer) or index (containerd) digest `tag` was pushed as, and what the
    /// push reported about itself.
    fn pushed(self, n: &Nodes, out: &Out, tag: &str) -> Option<(String, Value)> {
        match self {
            Self::Belayer => {
                let info: Value = serde_json::from_str(out.stdout.trim()).ok()?;
                Some((info["digest"].as_str()?.to_string(), info))
            }
            Self::Containerd => {
                let ls = n.a.ctr(&["images", "ls"]).stdout;
                let row = ls
                    .lines()
                    .find(|l| l.split_whitespace().next() == Some(tag))?;
                Some((row.split_whitespace().nth(2)?.to_string(), Value::Null))
            }
        }
    }

    /// Pulls `pinned` on node B into a new container `target` with a task; returns every
    /// command's output, the failed one last.
    fn pull(self, n: &Nodes, pinned: &str, target: &str) -> Vec<Out> {
        let steps: Vec<Box<dyn Fn() -> Out + '_>> = match self {
            Self::Belayer => vec![
                Box::new(|| {
                    n.b.ctr(&[
                        "containers",
                        "create",
                        "--runtime",
                        BELAYER,
                        SANDBOX,
                        target,
                        "sleep",
                        "infinity",
                    ])
                }),
                Box::new(|| {
                    n.b.belayer_docker(&n.docker, &["pull", pinned, "--into", target, "--json"])
                }),
            ],
            Self::Containerd => vec![
                Box::new(|| {
                    n.b.ctr(&["images", "pull", "--user", &user(), "--plain-http", pinned])
                }),
                Box::new(|| {
                    n.b.ctr(&["containers", "restore", "--rw", "--live", target, pinned])
                }),
            ],
        };
        let mut outs = Vec::new();
        for step in steps {
            let out = step();
            let failed = out.code != 0;
            outs.push(out);
            if failed {
                break;
            }
        }
        outs
    }
}

/// A failed command's stderr, with the end of the CRIU log it names (runc's "criu failed: …
/// path= LOG"), read before the container goes.
fn failure(out: &Out) -> String {
    let err = out.stderr.trim();
    let Some((_, path)) = err.rsplit_once("path= ") else {
        return err.to_string();
    };
    let log = std::fs::read_to_string(path.trim()).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(12)..].join("\n");
    format!("{err}\n{tail}")
}

fn user() -> String {
    format!("{USER}:{PASSWORD}")
}

/// The agent's next turn, between checkpoints 1 and 2: a new 8 MB file (its sha256 beside it)
/// and an edit, leaving in place what [`check::restored`] looks for.
fn next_turn() -> Vec<Action> {
    vec![Action {
        name: "next-turn",
        script: "head -c 8388608 /dev/urandom > /work/turn2.bin && sha256sum /work/turn2.bin > /work/turn2.sha \
                 && echo 'y = 2' >> /work/src/pkg/mod.py"
            .into(),
        stdin: None,
    }]
}

/// The blobs in the registry's storage (manifests are blobs there too) and their sizes.
pub fn stored(registry: &Registry) -> BTreeMap<PathBuf, u64> {
    let root = registry.storage.join("docker/registry/v2/blobs/sha256");
    let dirs = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    };
    dirs(&root)
        .iter()
        .flat_map(|prefix| dirs(prefix))
        .filter_map(|blob| {
            let data = blob.join("data");
            Some((data.clone(), std::fs::metadata(&data).ok()?.len()))
        })
        .collect()
}

/// Bytes of the blobs in `after` that `before` lacks.
fn gained(before: &BTreeMap<PathBuf, u64>, after: &BTreeMap<PathBuf, u64>) -> u64 {
    after
        .iter()
        .filter(|(p, _)| !before.contains_key(*p))
        .map(|(_, n)| n)
        .sum()
}

/// The size of everything manifest (or index) `digest` names, itself included.
fn artifact_bytes(registry: &Registry, digest: &str) -> Option<u64> {
    let file = registry.blob_file(&belayer_registry::Digest::parse(digest).ok()?);
    let bytes = std::fs::read(file).ok()?;
    let m: Value = serde_json::from_slice(&bytes).ok()?;
    let named: u64 = ["layers", "manifests"]
        .iter()
        .flat_map(|k| m[*k].as_array().into_iter().flatten())
        .chain(m.get("config"))
        .filter_map(|d| d["size"].as_u64())
        .sum();
    Some(bytes.len() as u64 + named)
}

/// One side: the episode on node A, checkpoints 1 and 2 each pushed, checkpoint 2 pulled and
/// restored on node B. Returns what each push reported.
fn measure(
    n: &Nodes,
    side: Side,
    actions: &[Action],
    samples: &mut Samples,
    checks: &mut Checks,
) -> Value {
    let key = side.key();
    let id = format!("push-{key}");
    let (sb, _) = ctrd::episode(&n.a, side.runtime(), &id, actions);
    let mut pushes = Vec::new();
    let mut pinned = None;
    for k in 1..=2 {
        if k == 2 {
            sb.run(&next_turn());
        }
        let tag = format!("{}/bench/{key}:cp-{k}", n.registry.addr);
        // Untimed, on both sides: with the machine's dirty pages written back first, no process
        // of the sandbox sits in uninterruptible writeback when the freeze comes (runc's CRIU
        // gave up after 10 s on one: "Unseizable non-zombie … state D").
        let _ = std::process::Command::new("sync").status();
        let t = Instant::now();
        let cp = side.checkpoint(n, &id, &tag);
        let secs = t.elapsed().as_secs_f64();
        let what = format!("checkpoint {k} succeeds");
        checks.record(key, 1, &id, &what, cp.code == 0, failure(&cp));
        if cp.code != 0 {
            break;
        }
        samples.push(&format!("{key}_checkpoint{k}"), secs);
        let before = stored(&n.registry);
        let t = Instant::now();
        let out = side.push(n, &id, &cp, &tag);
        let secs = t.elapsed().as_secs_f64();
        let new = gained(&before, &stored(&n.registry));
        let pushed = (out.code == 0)
            .then(|| side.pushed(n, &out, &tag))
            .flatten();
        let detail = format!("exit {}: {}", out.code, out.stderr.trim());
        checks.record(key, 1, &id, &format!("push {k}"), pushed.is_some(), detail);
        let Some((digest, info)) = pushed else { break };
        let artifact = artifact_bytes(&n.registry, &digest);
        samples.push(&format!("{key}_push{k}"), secs);
        samples.push(&format!("{key}_push{k}_bytes"), new as f64);
        if let Some(b) = artifact {
            samples.push(&format!("{key}_push{k}_artifact_bytes"), b as f64);
        }
        eprintln!(
            "  {key} checkpoint {k}: push {secs:.2} s, {:.1} MB new in the registry",
            new as f64 / 1e6
        );
        let reference = format!("{tag}@{digest}");
        pushes.push(
            json!({ "checkpoint": k, "reference": reference, "push_s": round3(secs),
            "registry_new_bytes": new, "artifact_bytes": artifact, "reported": info }),
        );
        pinned = Some(reference);
    }
    remove(&n.a, &id);
    if let Some(pinned) = pinned {
        restore_on_b(n, side, &pinned, samples, checks);
    }
    json!(pushes)
}

/// Node B: `pinned` pulled and restored into a new container, timed to running and to memory
/// intact, then checked; the container removed.
fn restore_on_b(n: &Nodes, side: Side, pinned: &str, samples: &mut Samples, checks: &mut Checks) {
    let key = side.key();
    let target = format!("push-{key}-b");
    let start = Instant::now();
    let outs = side.pull(n, pinned, &target);
    let pulled = outs.last().is_some_and(|o| o.code == 0);
    let running = pulled && wait_status(&n.b, &[&target], "RUNNING", Duration::from_secs(60));
    let secs = start.elapsed().as_secs_f64();
    // What the last command printed last (Belayer's pull: its JSON), or how each one exited.
    let detail = match outs.last() {
        Some(o) if running => o.stdout.lines().last().unwrap_or_default().to_string(),
        _ => outs
            .iter()
            .map(|o| format!("exit {}: {}", o.code, o.stderr.trim()))
            .collect::<Vec<_>>()
            .join("; "),
    };
    let what = "node B: pull + restore runs the task";
    checks.record(key, 1, &target, what, running, detail);
    if running {
        let s = Sandbox::attach(&n.b, &target);
        let exec = |script: &str| s.exec(script, None);
        let pid = task_pid(&n.b, &target);
        let digest = check::digest_after_restore(checks, key, 1, &target, pid, &exec);
        let memory = start.elapsed().as_secs_f64();
        samples.push(&format!("{key}_restore"), secs);
        samples.push(&format!("{key}_restore_memory"), memory);
        eprintln!("  {key} node B: running {secs:.2} s, memory intact {memory:.2} s");
        check::restored(checks, key, 1, &target, &digest, &exec);
        let turn = exec("cd /work && sha256sum -c --status turn2.sha");
        let what = "checkpoint 2's turn (8 MB file) there, intact";
        checks.record(key, 1, &target, what, turn.code == 0, turn.stderr.trim());
    }
    remove(&n.b, &target);
}

/// Rows of the table: label, sample suffix, unit.
const ROWS: &[(&str, &str, Unit)] = &[
    (
        "checkpoint 1 (the command, to its exit)",
        "checkpoint1",
        Unit::S,
    ),
    (
        "push 1, first: from the command's start to its exit (Belayer: pinned reference printed)",
        "push1",
        Unit::S,
    ),
    (
        "push 1: bytes the registry stored anew",
        "push1_bytes",
        Unit::B,
    ),
    (
        "push 1: the artifact (manifest/index and all it names)",
        "push1_artifact_bytes",
        Unit::B,
    ),
    (
        "checkpoint 2, after the next turn (an 8 MB file)",
        "checkpoint2",
        Unit::S,
    ),
    ("push 2, incremental: time", "push2", Unit::S),
    (
        "push 2: bytes the registry stored anew",
        "push2_bytes",
        Unit::B,
    ),
    (
        "push 2: the artifact (manifest/index and all it names)",
        "push2_artifact_bytes",
        Unit::B,
    ),
    (
        "node B: from the pull's start to the task RUNNING",
        "restore",
        Unit::S,
    ),
    (
        "… to the holder answering with its memory digest (memory intact)",
        "restore_memory",
        Unit::S,
    ),
];

#[derive(Clone, Copy)]
enum Unit {
    S,
    B,
}

impl Unit {
    fn show(self, v: Option<f64>) -> String {
        match (self, v) {
            (_, None) => "not measured".into(),
            (Self::S, Some(v)) => format!("{v:.2} s"),
            (Self::B, Some(v)) if v < 1e6 => format!("{:.1} kB", v / 1e3),
            (Self::B, Some(v)) => format!("{:.1} MB", v / 1e6),
        }
    }
}

/// What `belayer push --json` said of each push: blobs and bytes up and skipped, and where its
/// time went.
fn reported(pushes: &Value) -> String {
    let mb = |v: &Value| v.as_f64().unwrap_or(f64::NAN) / 1e6;
    let mut t = String::new();
    for p in pushes["belayer"].as_array().into_iter().flatten() {
        let r = &p["reported"];
        let _ = writeln!(
            t,
            "Belayer's push {} by its own count: {} blobs up ({:.1} MB), {} the registry had ({:.1} MB); \
             export {} ms, upload {} ms.",
            p["checkpoint"],
            r["uploaded"],
            mb(&r["uploaded_bytes"]),
            r["skipped"],
            mb(&r["skipped_bytes"]),
            r["export_ms"],
            r["push_ms"],
        );
    }
    t
}

fn table(s: &Samples, checks: &Checks, pushes: &Value, holder_mb: u32) -> String {
    let mut t = format!(
        "| reference episode, holder {holder_mb} MB, 1 run | Belayer | containerd + ctr (runc) | containerd ÷ Belayer |\n|---|---:|---:|---:|\n"
    );
    for (label, suffix, unit) in ROWS {
        let (b, c) = (
            s.median(&format!("belayer_{suffix}")),
            s.median(&format!("containerd_{suffix}")),
        );
        let ratio = b
            .zip(c)
            .filter(|(b, _)| *b > 0.0)
            .map_or_else(|| "—".into(), |(b, c)| format!("{:.2}×", c / b));
        let _ = writeln!(
            t,
            "| {label} | {} | {} | {ratio} |",
            unit.show(b),
            unit.show(c)
        );
    }
    t.push_str(
        "\nBelayer: `belayer checkpoint`; `belayer push --json ID CP REF`; node B: `ctr containers create` + \
         `belayer pull REF@sha256:… --into`. containerd: `ctr c checkpoint --rw --task ID REF`; \
         `ctr images push --user --plain-http REF`; node B: `ctr images pull --user --plain-http REF@sha256:…` + \
         `ctr c restore --rw --live`. Node B has the sandbox image on both sides beforehand.\n\n",
    );
    t.push_str(&reported(pushes));
    t.push_str("\n| system | check | passed | first failure |\n|---|---|---:|---|\n");
    for (system, what, passed, total, failure) in checks.summary() {
        let failure = failure.map_or_else(String::new, |f| f.replace('|', "/"));
        let _ = writeln!(t, "| {system} | {what} | {passed}/{total} | {failure} |");
    }
    t
}

/// Runs both sides, then the replication lag, and reports; `Ok(false)` when a check failed.
pub fn run(args: &Args) -> Result<bool, String> {
    let bins = crate::bench::snapshot_bins(&["containerd-shim-belayer-v1", "belayer"])?;
    let rec = Record::start("push", &args.common.out("push"))?;
    eprintln!("belayer-bench push: holder {} MB", args.holder_mb);
    let actions = episode::actions(args.holder_mb);
    let registry = Registry::start();
    let scratch = std::env::temp_dir().join(format!("belayer-bench-push-{}", std::process::id()));
    let docker = scratch.join("docker");
    registry.write_docker_config(&docker, USER, PASSWORD);
    // Node A's shims read the credentials for replication from its Belayer config.
    let config = scratch.join("node-a.toml");
    let text = format!(
        "[replication]\ndocker_config = \"{}\"\n",
        docker.join("config.json").display()
    );
    std::fs::write(&config, &text).map_err(|e| format!("write {}: {e}", config.display()))?;
    let n = Nodes {
        a: Containerd::start_configured(Flavor::V2, None, Some(config)),
        b: Containerd::start(Flavor::V2),
        registry,
        docker,
    };
    for node in [&n.a, &n.b] {
        node.import(&prereq::image("sandbox.tar"));
    }
    let (mut samples, mut checks) = (Samples::default(), Checks::default());
    let mut pushes = json!({});
    for side in [Side::Belayer, Side::Containerd] {
        eprintln!("{}", side.key());
        pushes[side.key()] = measure(&n, side, &actions, &mut samples, &mut checks);
    }
    eprintln!("replication");
    let repo = format!("{}/bench/replicated", n.registry.addr);
    let lag = replication::measure(&n.a, &n.registry, &repo, &actions, &mut checks);
    let versions = json!({
        "holder_mb": args.holder_mb,
        "containerd": first_line("containerd", &["--version"]),
        "runc": first_line("runc", &["--version"]),
        "criu": first_line("criu", &["--version"]),
        "registry": first_line(belayer_registry::testing::REGISTRY_BIN, &["--version"]),
        "bin_dir": std::env::var("BELAYER_BIN_DIR").unwrap_or_default(),
        "node_a_belayer_config": text,
    });
    drop(n);
    let _ = std::fs::remove_dir_all(&scratch);
    drop(bins);

    let failed = checks.failed();
    let mut t = table(&samples, &checks, &pushes, args.holder_mb);
    t.push('\n');
    t.push_str(&replication::table(&lag));
    if failed > 0 {
        let _ = writeln!(t, "\n{failed} checks FAILED (see stderr and results.json)");
    }
    let medians: serde_json::Map<String, Value> = samples
        .0
        .keys()
        .filter_map(|k| Some((k.clone(), json!(round3(samples.median(k)?)))))
        .collect();
    let summary = json!({
        "bench": "push",
        "medians": medians,
        "replication": replication::summary(&lag),
        "checks": checks.0.len(),
        "checks_failed": failed,
    });
    let mut results = summary.clone();
    results["stop_points"] = json!({
        "checkpoint": "from the command's start to its exit",
        "push": "from the command's start to its exit: `belayer push --json` having printed the pinned reference; `ctr images push` having pushed the index",
        "bytes": "bytes of the blobs (manifests included) the registry's storage gained during the push",
        "restore": "from the pull's start on node B (Belayer: `ctr containers create` of the target, then `belayer pull --into`; containerd: `ctr images pull`, then `ctr c restore --rw --live`) to `ctr tasks ls` showing it RUNNING; memory intact: to the holder answering with its memory's digest",
    });
    results["pushes"] = pushes;
    results["replication"] = lag;
    results["checks_detail"] = checks
        .0
        .iter()
        .map(|c| json!({ "system": c.system, "target": c.target, "what": c.what, "ok": c.ok, "detail": c.detail }))
        .collect();
    results["versions"] = versions;
    rec.report(&t, results, None, summary)?;
    Ok(failed == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_and_units() {
        let a: Args = crate::bench::parse_args(&["--holder-mb", "64"]).unwrap();
        assert_eq!(a.holder_mb, 64);
        assert_eq!(Unit::B.show(Some(2_500.0)), "2.5 kB");
        assert_eq!(Unit::B.show(Some(312_000_000.0)), "312.0 MB");
        assert_eq!(Unit::S.show(None), "not measured");
        let (before, mut after) = (BTreeMap::from([(PathBuf::from("a"), 5)]), BTreeMap::new());
        after.insert(PathBuf::from("a"), 5);
        after.insert(PathBuf::from("b"), 7);
        assert_eq!(gained(&before, &after), 7);
    }
}
