//! Checkpoints leave the node through a real OCI registry (issue 25): two "nodes" on this
//! machine, each a containerd 2.x with its own root, state, namespace and Belayer store, and
//! Debian's `docker-registry` on loopback with htpasswd authentication, credentials read from a
//! docker config. A sandbox on node A is checkpointed twice and pushed after each checkpoint (the
//! second push uploads only the new checkpoint's blobs, by the push's own count and by the
//! registry's request log); node A is then killed whole (containerd, its shims, the container's
//! processes) and its store made unreachable; node B pulls the newest pushed checkpoint by digest
//! into a container of its own and the trajectory continues there, files and process memory.
//! A wrong digest pin, missing credentials and a tampered blob are refused, each with one clear
//! error, leaving nothing behind on node B. The reference episode's Python sandbox makes the same
//! trip: its filesystem tree and a 64 MB process's memory arrive intact. So does a docker
//! container, from node A's dockerd to node B's (`belayer pull --output` into docker's checkpoint
//! dir, `docker start --checkpoint`).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use belayer_integration::episode::{self, Sandbox, is_contiguous};
use belayer_integration::{Containerd, Docker, Flavor, Out, Scratch, prereq};
use belayer_registry::testing::{PASSWORD, Registry, USER};
use common::*;

/// A registry with htpasswd auth and two docker configs: one with its credentials, one empty.
fn registry_and_configs(scratch: &Scratch) -> (Registry, std::path::PathBuf, std::path::PathBuf) {
    let registry = Registry::start();
    let docker = scratch.path().join("docker");
    registry.write_docker_config(&docker, USER, PASSWORD);
    let none = scratch.path().join("no-docker");
    std::fs::create_dir_all(&none).unwrap();
    (registry, docker, none)
}

/// Asserts a CLI failure: non-zero exit `code`, one line on stderr containing `needle`.
#[track_caller]
fn assert_refused(out: &Out, code: i32, needle: &str) {
    assert_eq!(out.code, code, "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{:?}", out.stderr);
    assert!(
        out.stderr.starts_with("belayer: ") && out.stderr.contains(needle),
        "error {:?} does not say {needle:?}",
        out.stderr
    );
}

/// Asserts that a refused pull into `id` left nothing on `node`: no task, no checkpoint, no
/// staging directory in the store.
#[track_caller]
fn assert_nothing_left(node: &Containerd, id: &str) {
    assert_eq!(
        task_status(node, id),
        "ABSENT",
        "a task of {id} was created"
    );
    assert!(
        !node.checkpoints_dir(id).exists()
            || std::fs::read_dir(node.checkpoints_dir(id)).unwrap().count() == 0,
        "checkpoints of {id} were created"
    );
    let staging: Vec<String> = std::fs::read_dir(&node.store)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(staging.is_empty(), "left in the store: {staging:?}");
}

/// Creates container `id` of the counter loop on `node`, with no task: what a pull goes into.
fn create_counter(node: &Containerd, id: &str) {
    node.ctr(&[
        "containers",
        "create",
        "--runtime",
        BELAYER,
        BUSYBOX,
        id,
        "sh",
        "-c",
        COUNTER_LOOP,
    ])
    .ok();
}

/// `belayer push --json` on `node`, parsed.
#[track_caller]
fn push(node: &Containerd, docker: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["push", "--json"];
    all.extend_from_slice(args);
    let out = node.belayer_docker(docker, &all);
    assert_eq!(out.code, 0, "push {args:?}: {out:?}");
    serde_json::from_str(out.stdout.trim()).expect("push JSON")
}

#[test]
fn a_sandbox_continues_on_another_node_from_its_newest_pushed_checkpoint() {
    let started = Instant::now();
    let scratch = Scratch::new("replicate");
    let (registry, docker, no_credentials) = registry_and_configs(&scratch);
    let repo = format!("{}/belayer/sandbox", registry.addr);

    let a = Containerd::start(Flavor::V2);
    let b = Containerd::start(Flavor::V2);
    run_detached(&a, BELAYER, "sb", &["sh", "-c", COUNTER_LOOP]);
    assert!(wait_until(Duration::from_secs(10), || {
        a.sh("sb", "c0", "test -s /work/counter").code == 0
    }));

    // Checkpoint 1, pushed: all its blobs go up.
    a.sh("sb", "w1", "echo one > /work/one").ok();
    let cp1 = checkpoint(&a, "sb");
    let p1 = push(&a, &docker, &["sb", &cp1, &format!("{repo}:cp-1")]);
    assert_eq!(p1["checkpoint"], cp1.as_str());
    assert_eq!(
        (p1["uploaded"].as_u64(), p1["skipped"].as_u64()),
        (Some(3), Some(0)),
        "{p1}"
    );
    assert_eq!(registry.finished_uploads(), 3, "{p1}");

    // Checkpoint 2 (the newest: no id given) on the same chain: only its own blobs go up.
    a.sh("sb", "w2", "echo two > /work/two").ok();
    let cp2 = checkpoint(&a, "sb");
    let p2 = push(&a, &docker, &["sb", &format!("{repo}:cp-2")]);
    assert_eq!(p2["checkpoint"], cp2.as_str());
    assert_eq!(
        (p2["uploaded"].as_u64(), p2["skipped"].as_u64()),
        (Some(3), Some(2)),
        "{p2}"
    );
    assert_eq!(
        registry.finished_uploads(),
        6,
        "the registry saw more uploads than checkpoint 2's layer, images and config"
    );
    // Checkpoint 1's layer and images, all but its config (each checkpoint's CRIU images
    // are dumped whole, so checkpoint 2's weigh about as much as checkpoint 1's).
    let config1 = p1["uploaded_bytes"].as_u64().unwrap() - p2["skipped_bytes"].as_u64().unwrap();
    assert!(config1 > 0 && config1 < 64 << 10, "skipped {p2} of {p1}");
    let pinned = p2["reference"].as_str().unwrap().to_string();
    // The artifact carries the journal position: the execs completed at checkpoint 2 (none ran
    // since).
    let actions = status(&a, "sb")["actions"].as_u64();
    assert!(actions >= Some(3), "{actions:?}");
    assert_eq!(p2["journal_position"].as_u64(), actions, "{p2}");
    assert!(
        pinned.starts_with(&format!("{repo}:cp-2@sha256:")),
        "{pinned}"
    );
    // The container ran on through both pushes; a failed push (no credentials) leaves it so.
    let refused = a.belayer_docker(&no_credentials, &["push", "sb", &format!("{repo}:cp-x")]);
    assert_refused(&refused, 4, "no credentials");
    // Credentials from a credential helper, as docker finds them (`credsStore`): a real helper
    // process on PATH answers for the registry (named on its stdin with no newline, as docker
    // writes it), and the push goes through (nothing new to upload); when it answers wrong
    // credentials, the registry refuses them.
    let via_helper = |secret: &str| {
        let (config, bin) = (
            scratch.path().join("docker-helper"),
            scratch.path().join("bin"),
        );
        std::fs::create_dir_all(&config).unwrap();
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(
            config.join("config.json"),
            r#"{"credsStore": "belayertest"}"#,
        )
        .unwrap();
        let helper = bin.join("docker-credential-belayertest");
        std::fs::write(
            &helper,
            format!(
                "#!/bin/sh\nserver=$(cat)\n[ \"$1\" = get ] && [ \"$server\" = {} ] || exit 9\n\
                 printf '{{\"Username\":\"{USER}\",\"Secret\":\"{secret}\"}}'\n",
                registry.addr
            ),
        )
        .unwrap();
        let exec = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
        std::fs::set_permissions(&helper, exec).unwrap();
        let mut cmd = a.belayer_cmd(&["push", "--json", "sb", &format!("{repo}:cp-helper")]);
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("DOCKER_CONFIG", &config)
            .env("PATH", format!("{}:{path}", bin.display()));
        belayer_integration::containerd::run(&mut cmd, None, Duration::from_secs(120))
    };
    let helped = via_helper(PASSWORD);
    assert_eq!(helped.code, 0, "push with a credential helper: {helped:?}");
    assert_refused(&via_helper("wrong"), 4, "refused access (401)");
    // Nor does a push of a checkpoint that is not there, or to a reference that is not one.
    let missing = a.belayer_docker(&docker, &["push", "sb", "99", &format!("{repo}:cp-x")]);
    assert_refused(&missing, 3, "99");
    let bad = a.belayer_docker(&docker, &["push", "sb", "no-registry-host"]);
    assert_refused(&bad, 8, "no registry host");
    assert_eq!(task_status(&a, "sb"), "RUNNING");
    assert_eq!(
        a.belayer(&["checkpoints", "sb"])
            .ok()
            .stdout
            .lines()
            .count(),
        2
    );
    // Written after the last pushed checkpoint: lost with node A.
    a.sh("sb", "w3", "echo three > /work/three").ok();

    // Node A dies whole: its containerd, its shims, the container's processes; its store is
    // gone.
    let lost = kill_node(&a, "sb");

    // Node B: a container of its own from the same image, no task yet.
    let create = |id: &str| create_counter(&b, id);
    create("b1");
    run_detached(&b, BELAYER, "b1-running", &["sleep", "1000"]);
    // A pin to a manifest the registry does not hold: refused before anything is created.
    let wrong = format!("{repo}:cp-2@sha256:{}", "0".repeat(64));
    let out = b.belayer_docker(&docker, &["pull", &wrong, "--into", "b1"]);
    assert_refused(&out, 3, "404");
    assert_nothing_left(&b, "b1");
    // A registry off loopback in plain HTTP, not allowed (no --plain-http).
    let out = b.belayer_docker(&docker, &["pull", "10.0.0.1:5000/x/y:z", "--into", "b1"]);
    assert_refused(&out, 8, "loopback");
    // Into a container that already has a task.
    let out = b.belayer_docker(&docker, &["pull", &pinned, "--into", "b1-running"]);
    assert_refused(&out, 4, "already has a task");
    // Without credentials: refused by the registry.
    let out = b.belayer_docker(&no_credentials, &["pull", &pinned, "--into", "b1"]);
    assert_refused(&out, 4, "no credentials");
    assert_nothing_left(&b, "b1");

    let pulled = Instant::now();
    let out = b.belayer_docker(&docker, &["pull", &pinned, "--into", "b1", "--json"]);
    assert_eq!(
        out.code,
        0,
        "pull into b1: {out:?}\n{}",
        b.log_lines("b1", 20)
    );
    let pull_s = pulled.elapsed().as_secs_f64();
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(info["reference"], pinned.as_str());
    assert_eq!(info["source_checkpoint"], cp2.as_str());
    assert_eq!(info["container"], "b1");
    assert_eq!(info["journal_position"].as_u64(), actions);
    // The agent loop learns on node B which actions the environment reflects.
    let position = &status(&b, "b1")["position"];
    assert_eq!(position["checkpoint"], cp2.as_str(), "{position}");
    assert_eq!(position["action"].as_u64(), actions, "{position}");
    assert_eq!(task_status(&b, "b1"), "RUNNING");
    // Files as at checkpoint 2, the counter's memory and file from one instant, running on.
    let files = b
        .sh("b1", "f1", "cat /work/one /work/two; test ! -e /work/three")
        .ok();
    assert_eq!(files.stdout, "one\ntwo\n");
    let b1 = Sandbox::attach(&b, "b1");
    let first = b1.counter();
    assert!(
        is_contiguous(&first) && !first.is_empty(),
        "counter on node B: …{:?}",
        &first[first.len().saturating_sub(5)..]
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            let later = b1.counter();
            later.len() > first.len() && is_contiguous(&later)
        }),
        "the counter does not go on on node B"
    );
    // Node B's own store holds the chain, owned by b1; nothing staged is left.
    assert_eq!(
        b.belayer(&["checkpoints", "b1"])
            .ok()
            .stdout
            .lines()
            .count(),
        2
    );
    let staging = std::fs::read_dir(&b.store)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .count();
    assert_eq!(staging, 0);

    // A blob altered in the registry's storage: refused as corrupt, nothing created.
    create("b2");
    let manifest_digest = pinned.rsplit_once('@').unwrap().1;
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            registry.blob_file(&belayer_registry::Digest::parse(manifest_digest).unwrap()),
        )
        .unwrap(),
    )
    .unwrap();
    let layer = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| {
            l["annotations"]["io.belayer.checkpoint.seq"] == cp2.as_str()
                && l["annotations"]["io.belayer.checkpoint.part"] == "criu"
        })
        .expect("checkpoint 2's images in the manifest");
    let victim = registry
        .blob_file(&belayer_registry::Digest::parse(layer["digest"].as_str().unwrap()).unwrap());
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x01;
    std::fs::write(&victim, &bytes).unwrap();
    let out = b.belayer_docker(&docker, &["pull", &pinned, "--into", "b2"]);
    assert_refused(&out, 5, "hashes to");
    assert_nothing_left(&b, "b2");
    assert_eq!(task_status(&b, "b1"), "RUNNING");

    remove(&b, "b1");
    remove(&b, "b1-running");
    b.ctr(&["containers", "rm", "b2"]).ok();
    let _ = std::fs::remove_dir_all(&lost);
    eprintln!(
        "replicate: push 1 {} B up, push 2 {} B up and {} B skipped, pull + restore on node B {pull_s:.2} s, whole test {:.1} s",
        p1["uploaded_bytes"],
        p2["uploaded_bytes"],
        p2["skipped_bytes"],
        started.elapsed().as_secs_f64()
    );
}

/// The reference episode's sandbox (Debian + Python: a pip install, edits, metadata of every
/// kind, a 64 MB process of known bytes, a counter) pushed after two checkpoints, its node lost,
/// pulled on node B: the filesystem tree as at the newest pushed checkpoint, the process's memory
/// and the counter intact. Prints the push and pull figures.
#[test]
fn the_reference_episode_continues_on_another_node() {
    let scratch = Scratch::new("replicate-episode");
    let (registry, docker, _) = registry_and_configs(&scratch);
    let repo = format!("{}/belayer/episode", registry.addr);
    let a = Containerd::start(Flavor::V2);
    let b = Containerd::start(Flavor::V2);
    let s = Sandbox::start(&a, BELAYER, "episode");
    s.run(&episode::actions(64));
    let cp1 = checkpoint(&a, "episode");
    let t = Instant::now();
    let p1 = push(&a, &docker, &["episode", &cp1, &format!("{repo}:cp-1")]);
    let push1_s = t.elapsed().as_secs_f64();
    s.run(&episode::more_changes());
    let at_cp2 = s.tree();
    let cp2 = checkpoint(&a, "episode");
    let t = Instant::now();
    let p2 = push(&a, &docker, &["episode", &format!("{repo}:cp-2")]);
    let push2_s = t.elapsed().as_secs_f64();
    assert_eq!(p2["uploaded"].as_u64(), Some(3), "{p2}");
    assert!(p2["skipped"].as_u64() >= Some(2), "{p2}");
    let lost = kill_node(&a, "episode");

    b.import(&prereq::image("sandbox.tar"));
    b.ctr(&[
        "containers",
        "create",
        "--runtime",
        BELAYER,
        episode::SANDBOX,
        "episode-b",
        "sleep",
        "infinity",
    ])
    .ok();
    let t = Instant::now();
    let pinned = p2["reference"].as_str().unwrap();
    let out = b.belayer_docker(&docker, &["pull", pinned, "--into", "episode-b"]);
    let pull_s = t.elapsed().as_secs_f64();
    assert_eq!(
        out.code,
        0,
        "pull: {out:?}\n{}",
        b.log_lines("episode-b", 20)
    );
    let moved = Sandbox::attach(&b, "episode-b");
    assert_same_tree("node B", &at_cp2, &moved.tree());
    assert_processes_intact(&moved);
    assert_eq!(
        moved
            .exec("test ! -e /work/dist/none && cat /work/main.py", None)
            .stdout,
        "changed\n"
    );
    remove(&b, "episode-b");
    let _ = std::fs::remove_dir_all(&lost);
    eprintln!(
        "replicate episode: checkpoint {cp1} push {:.1} MB in {push1_s:.2} s; checkpoint {cp2} push {:.1} MB up, {:.1} MB skipped in {push2_s:.2} s; pull + restore on node B {pull_s:.2} s",
        p1["uploaded_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
        p2["uploaded_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
        p2["skipped_bytes"].as_u64().unwrap_or(0) as f64 / 1e6,
    );
}

/// A docker container makes the same trip, docker to docker: checkpointed and pushed from node
/// A's dockerd (namespace `moby`), node A lost whole (dockerd too), and on node B pulled as an
/// export (`belayer pull --output`) that `docker start --checkpoint` restores into a container
/// docker created (an experimental dockerd: docker's checkpoint flags are experimental). Host
/// network: docker 28 on containerd 2.x fails any `docker start --checkpoint` of a container
/// with a network namespace of its own, runc's too ("bind-mount /proc/0/ns/net": it sets up the
/// namespace from the task's pid before the start restores it; containerd/containerd#12141).
#[test]
fn a_docker_sandbox_continues_in_docker_on_another_node() {
    let scratch = Scratch::new("replicate-docker");
    let (registry, docker_config, _) = registry_and_configs(&scratch);
    let repo = format!("{}/belayer/docker", registry.addr);
    let a = Containerd::start(Flavor::V2);
    let b = Containerd::start(Flavor::V2);
    let da = Docker::start(&a);
    let experimental = scratch.path().join("daemon.json");
    std::fs::write(&experimental, r#"{"experimental": true}"#).unwrap();
    let db = Docker::start_with_config(&b, Some(&experimental));
    let run = [
        "--network",
        "host",
        "--runtime",
        BELAYER,
        "belayer/busybox",
        "sh",
        "-c",
        COUNTER_LOOP,
    ];
    let mut args = vec!["run", "-d", "--name", "dk"];
    args.extend(run);
    da.docker(&args).ok();
    let id = da.id("dk");
    da.docker(&["exec", "dk", "sh", "-c", "echo kept > /work/marker"])
        .ok();
    let on_a = |args: &[&str]| {
        let mut cmd = a.belayer_cmd_in("moby", args);
        cmd.env("DOCKER_CONFIG", &docker_config);
        belayer_integration::containerd::run(&mut cmd, None, Duration::from_secs(120))
    };
    on_a(&["checkpoint", &id]).ok();
    let pushed: serde_json::Value = serde_json::from_str(
        on_a(&["push", "--json", &id, &format!("{repo}:cp")])
            .ok()
            .stdout
            .trim(),
    )
    .unwrap();
    let _ = belayer_integration::sigkill(da.pid().into());
    let lost = kill_node_in(&a, "moby", &[&id]);

    // Node B: a container docker created alike, the export where docker keeps a container's
    // checkpoints (its data root's containers/ID/checkpoints/NAME: docker 28 refuses any
    // other --checkpoint-dir), and a start from it.
    let mut args = vec!["create", "--name", "dk2"];
    args.extend(run);
    db.docker(&args).ok();
    let checkpoint_dir = b
        .dir
        .join("docker/data/containers")
        .join(db.id("dk2"))
        .join("checkpoints");
    std::fs::create_dir_all(&checkpoint_dir).unwrap();
    let out = b.belayer_docker(
        &docker_config,
        &[
            "pull",
            pushed["reference"].as_str().unwrap(),
            "--output",
            &checkpoint_dir.join("cp").display().to_string(),
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let started = db.docker(&["start", "--checkpoint", "cp", "dk2"]);
    assert_eq!(started.code, 0, "{started:?}\n{}", b.log_lines("", 20));
    assert_eq!(
        db.docker(&["inspect", "-f", "{{.State.Status}}", "dk2"])
            .stdout
            .trim(),
        "running"
    );
    assert_eq!(
        db.docker(&["exec", "dk2", "cat", "/work/marker"]).stdout,
        "kept\n"
    );
    let counter = |d: &Docker| -> Vec<u64> {
        let text = d.docker(&["exec", "dk2", "cat", "/work/counter"]).stdout;
        let end = text.rfind('\n').map_or(0, |i| i + 1);
        text[..end].lines().filter_map(|l| l.parse().ok()).collect()
    };
    let first = counter(&db);
    assert!(
        is_contiguous(&first),
        "counter in docker on node B: {first:?}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || {
            let later = counter(&db);
            later.len() > first.len() && is_contiguous(&later)
        }),
        "the counter does not go on in docker on node B"
    );
    let _ = std::fs::remove_dir_all(&lost);
}

/// Automatic replication (issue 25, point 2): a sandbox in automatic mode on node A whose
/// annotation `io.belayer.replicate` names a repository; each automatic checkpoint goes up in the
/// background (node A's settings bound the upload rate and name the docker config with the
/// registry's credentials), and `belayer status` says which checkpoints are replicated and how
/// far behind replication is. Node A is then lost whole; node B pulls `REPO:<container>`, the
/// newest replicated checkpoint, and the trajectory continues there from the journal position
/// it reports.
#[test]
fn automatic_replication_carries_a_sandbox_through_a_node_loss() {
    let scratch = Scratch::new("replicate-auto");
    let (registry, docker, _) = registry_and_configs(&scratch);
    let repo = format!("{}/belayer/auto", registry.addr);
    let config = scratch.path().join("belayer.toml");
    std::fs::write(
        &config,
        format!(
            "[replication]\ndocker_config = \"{}\"\nmax_bytes_per_s = {}\n",
            docker.join("config.json").display(),
            32 << 20
        ),
    )
    .unwrap();
    let a = Containerd::start_configured(Flavor::V2, None, Some(config));
    let b = Containerd::start(Flavor::V2);
    let replicate = format!("io.belayer.replicate={repo}");
    run_detached_with(
        &a,
        BELAYER,
        &[
            "--annotation",
            "io.belayer.checkpoint=auto",
            "--annotation",
            &replicate,
        ],
        "ra",
        &["sh", "-c", COUNTER_LOOP],
    );
    let listed = || -> Vec<String> {
        a.belayer(&["checkpoints", "ra"])
            .stdout
            .lines()
            .map(str::to_string)
            .collect()
    };
    // Three turns, each an action then the model thinking while the scheduler checkpoints.
    let mut newest = String::new();
    for n in 1..=3 {
        a.sh("ra", &format!("t{n}"), &format!("echo {n} > /work/turn{n}"))
            .ok();
        a.belayer(&["hint", "ra", "llm-start", "--expected-ms", "2000"])
            .ok();
        assert!(
            wait_until(Duration::from_secs(20), || listed()
                .last()
                .is_some_and(|l| *l != newest)),
            "turn {n}: no automatic checkpoint"
        );
        newest = listed().last().unwrap().clone();
    }
    // Replicated in the background, up to the newest.
    let replication = || status(&a, "ra")["replication"].clone();
    assert!(
        wait_until(Duration::from_secs(60), || {
            let r = replication();
            r["newest"] == newest.as_str() && r["behind"].as_array().is_some_and(|b| b.is_empty())
        }),
        "replication did not reach checkpoint {newest}: {}; shim log:\n{}",
        replication(),
        a.log_lines("ra", 20)
    );
    let r = replication();
    eprintln!("replicate-auto: node A's status once replicated: {r}");
    assert_eq!(r["repository"], repo.as_str(), "{r}");
    assert_eq!(r["failures"], 0, "{r}");
    assert_eq!(r["behind_ms"], 0, "{r}");
    assert!(r["pushes"].as_u64() >= Some(1), "{r}");
    assert!(
        r["newest_reference"]
            .as_str()
            .is_some_and(|s| s.starts_with(&format!("{repo}:ra-{newest}@sha256:"))),
        "{r}"
    );
    let actions = status(&a, "ra")["actions"].as_u64();
    let lost = kill_node(&a, "ra");

    // Node B: the newest replicated, by the container's own tag.
    create_counter(&b, "rb");
    let out = b.belayer_docker(
        &docker,
        &["pull", &format!("{repo}:ra"), "--into", "rb", "--json"],
    );
    assert_eq!(out.code, 0, "pull: {out:?}\n{}", b.log_lines("rb", 20));
    let info: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(info["source_checkpoint"], newest.as_str(), "{info}");
    let position = &status(&b, "rb")["position"];
    assert_eq!(position["checkpoint"], newest.as_str(), "{position}");
    assert!(position["action"].as_u64() <= actions, "{position}");
    assert_eq!(
        b.sh("rb", "f", "cat /work/turn1 /work/turn2 /work/turn3")
            .ok()
            .stdout,
        "1\n2\n3\n"
    );
    let rb = Sandbox::attach(&b, "rb");
    let first = rb.counter();
    assert!(is_contiguous(&first) && !first.is_empty());
    assert!(
        wait_until(Duration::from_secs(10), || {
            let later = rb.counter();
            later.len() > first.len() && is_contiguous(&later)
        }),
        "the counter does not go on on node B"
    );
    remove(&b, "rb");
    let _ = std::fs::remove_dir_all(&lost);
}
