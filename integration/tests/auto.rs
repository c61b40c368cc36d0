//! Automatic mode on a 12-turn agent episode with simulated LLM gaps of 1–3 s: checkpoints land in
//! the gaps (at least 8 begin in one; their cost against runc-v2 is `belayer-bench auto`'s to
//! measure), and a sandbox killed mid-episode comes
//! back at its newest checkpoint with the journal position reported; one killed while a checkpoint
//! is being taken comes back too, and the execs sent meanwhile wait for it. A checkpoint asked for
//! during an automatic one waits. An init that exits 0 is not recovered, a crash loop ends, and an
//! exec that cannot start is journalled as ended. A death asked for (a kill through containerd, an
//! exit-mode checkpoint) is not recovered; a signal the init survives leaves recovery on.

mod common;

use std::time::Duration;

use belayer_integration::bench::auto::{Episode, IN_GAPS, TURNS, action, agent_loop, auto_sandbox};
use belayer_integration::episode::{self, Sandbox};
use belayer_integration::{Containerd, Flavor};
use common::*;

#[test]
fn automatic_checkpoints_land_in_the_gaps_and_recovery_rewinds() {
    let c = Containerd::start(Flavor::V2);

    // One episode in automatic mode, alone on the machine: its checkpoints begin (freeze the
    // sandbox) in think gaps, not while an action runs. What they cost against runc-v2 is a
    // speed claim, measured by `belayer-bench auto` (BENCHMARKS.md), not by this test.
    let alone = machine_alone();
    let e = Episode::run(&c, true, 0);
    drop(alone);
    println!("{e:?}");
    assert!(
        e.in_gaps() >= IN_GAPS,
        "only {} automatic checkpoints began in the {TURNS} turns' gaps: {e:?}",
        e.in_gaps()
    );

    // A crash mid-episode: init killed from outside containerd.
    let s = auto_sandbox(&c, "loop-crash");
    agent_loop(&c, &s, true, 0..7);
    let newest = c
        .belayer(&["checkpoints", "loop-crash"])
        .stdout
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    let pid: i32 = task_pid(&c, "loop-crash").parse().expect("pid");
    belayer_integration::sigkill(pid.into()).expect("SIGKILL the sandbox's init");
    let status = || {
        serde_json::from_str::<serde_json::Value>(&c.belayer(&["status", "loop-crash"]).stdout)
            .unwrap_or_default()
    };
    assert!(
        wait_until(Duration::from_secs(30), || status()["recoveries"]
            .as_array()
            .is_some_and(|r| !r.is_empty())),
        "no recovery: {}",
        status()
    );
    assert_eq!(task_status(&c, "loop-crash"), "RUNNING");
    let st = status();
    let position = &st["recoveries"][0]["position"];
    assert_eq!(
        position["checkpoint"],
        newest.as_str(),
        "not recovered from the newest checkpoint: {st}"
    );
    let k = position["action"].as_u64().expect("journal position");
    assert_eq!(
        position["reflects"],
        format!("checkpoint {newest}, taken after action {k}")
    );
    // The environment reflects exactly the episode's actions up to k: its setup actions, then turns.
    let setup = episode::actions(64).len() as u64;
    let turns_done = k.saturating_sub(setup);
    let turns = s.exec("cat /work/turns 2>/dev/null", None).stdout;
    let expected: String = (1..=turns_done).map(|t| format!("{t}\n")).collect();
    assert_eq!(turns, expected, "files do not match journal position {k}");
    // The agent loop rewinds to turn k and goes on.
    agent_loop(&c, &s, true, turns_done as usize..TURNS);
    assert_eq!(
        s.exec("wc -l < /work/turns", None).stdout.trim(),
        TURNS.to_string()
    );
    remove(&c, "loop-crash");
}

/// An automatic checkpoint that meets a task held in vfork skips it — CRIU could not stop the
/// task, and trying would keep the container frozen for CRIU's 10 s timeout — and is tried again
/// later; once the vfork ends, the next one is taken. The container never stops meanwhile.
#[test]
fn automatic_checkpoints_skip_a_task_held_in_vfork() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let s = Sandbox::start_annotated(&c, BELAYER, "vfork-auto", &["io.belayer.checkpoint=auto"]);
    let started = s.exec(
        &format!("mkdir -p /work && (nohup sh -c '{COUNTER}' > /dev/null 2>&1 &)"),
        None,
    );
    assert_eq!(started.code, 0, "{started:?}");
    hold_in_vfork(&s);
    let count = || {
        s.exec("wc -l < /counter", None)
            .stdout
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    let checkpoints = || c.belayer(&["checkpoints", "vfork-auto"]).stdout;
    // The set-up's own execs are actions too: a checkpoint they started may still be finishing.
    std::thread::sleep(Duration::from_secs(1));
    let before_turns = checkpoints();
    for turn in 1..=3 {
        let out = s.exec(&action(turn), None);
        assert_eq!(out.code, 0, "turn {turn}: {out:?}");
        c.belayer(&["hint", "vfork-auto", "llm-start", "--expected-ms", "2000"])
            .ok();
        // The model thinks; the scheduler wants a checkpoint now.
        let before = count();
        std::thread::sleep(Duration::from_secs(2));
        let after = count();
        assert!(
            after >= before + 20,
            "turn {turn}: the counter went from {before} to {after} in 2 s: the container was \
             kept frozen"
        );
    }
    assert_eq!(
        checkpoints(),
        before_turns,
        "a checkpoint with a task held in vfork"
    );
    let log = std::fs::read_to_string(c.log_path()).unwrap_or_default();
    assert!(
        log.contains("container vfork-auto: automatic checkpoint skipped for now"),
        "no automatic checkpoint was skipped"
    );
    release_vfork(&s);
    let out = s.exec(&action(4), None);
    assert_eq!(out.code, 0, "turn 4: {out:?}");
    c.belayer(&["hint", "vfork-auto", "llm-start", "--expected-ms", "2000"])
        .ok();
    assert!(
        wait_until(Duration::from_secs(20), || checkpoints() != before_turns),
        "no automatic checkpoint after the vfork ended"
    );
    remove(&c, "vfork-auto");
}

/// Retention of automatic checkpoints (`io.belayer.keep=1`) keeps one that a running fork stacks
/// on, however many newer ones come, and lets it go once the fork is gone.
#[test]
fn retention_keeps_a_checkpoint_a_running_fork_stacks_on() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let s = keeping_one(&c, "kept");
    let checkpoints = || listed(&c, "kept");
    let turn = |n: usize, after: Option<&String>| checkpointed_turn(&c, &s, n, after);
    let first = turn(1, None).last().cloned().expect("a checkpoint");
    let out = c.belayer(&["fork", "kept", "--checkpoint", &first, "--count", "1"]);
    assert_eq!(out.code, 0, "fork: {out:?}");
    let fork = out.stdout.trim().to_string();

    let mut newest = first.clone();
    for n in 2..=3 {
        let listed = turn(n, Some(&newest));
        newest = listed.last().cloned().expect("a checkpoint");
        assert!(
            listed.contains(&first),
            "turn {n}: retention removed checkpoint {first}, which fork {fork} stacks on: {listed:?}"
        );
    }
    let f = Sandbox::attach(&c, &fork);
    assert_eq!(
        f.exec("cat /turn1", None).stdout,
        "1\n",
        "the fork lost a file"
    );
    let log = std::fs::read_to_string(c.log_path()).unwrap_or_default();
    assert!(
        log.contains(&format!("retention keeps checkpoint {first}")),
        "retention did not say why it kept {first}"
    );

    remove(&c, &fork);
    turn(4, Some(&newest));
    // Retention runs right after the checkpoint is listed.
    assert!(
        wait_until(Duration::from_secs(10), || !checkpoints().contains(&first)),
        "checkpoint {first} outlived its last fork: {:?}; shim log:\n{}",
        checkpoints(),
        c.log_lines("kept", 30)
    );
    // The fork's own automatic checkpoints (its exec above was an action) stacked on checkpoint
    // {first}'s layer: retention compacted them into standalone ones, which borrow no layer of
    // another container any more.
    let fork_cps = c.belayer(&["checkpoints", &fork]).stdout;
    for cp in fork_cps.lines() {
        let out = c.belayer(&["inspect", &fork, cp]);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
        let dir = v["path"].as_str().unwrap_or_default();
        let manifest = std::fs::read_to_string(format!("{dir}/manifest.json")).unwrap_or_default();
        let m: serde_json::Value = serde_json::from_str(&manifest).unwrap_or_default();
        let borrowed: Vec<&serde_json::Value> = m["image_lowers"]
            .as_array()
            .map(|l| {
                l.iter()
                    .filter(|l| l.as_str().is_some_and(|l| l.contains("/checkpoints/")))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            m.is_object() && borrowed.is_empty(),
            "the removed fork's checkpoint {cp} still borrows {borrowed:?}: {out:?}"
        );
    }
    println!("the removed fork's checkpoints: {fork_cps:?}");
    remove(&c, "kept");
}

/// A checkpoint the running rootfs stacks on stays whatever `io.belayer.keep` says; once a
/// restore mounts another chain, it goes at once, not only after the next automatic checkpoint
/// (the chaos soak found chains of 11 outliving restores until then: seed 2, init-kill-restore)
/// — also when the restore comes after the shim's death, through a task created anew by a shim
/// that never knew the old chain (seed 601, shim-kill).
#[test]
fn a_restore_lets_retention_drop_the_chain_the_old_rootfs_stacked_on() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    restore_unpins(&c, "unpinned", false);
    restore_unpins(&c, "unpinned-shim", true);
}

/// [`a_restore_lets_retention_drop_the_chain_the_old_rootfs_stacked_on`] for sandbox `id`,
/// restored in place or, with `shim_dies`, by `belayer restore` after its shim is SIGKILLed.
fn restore_unpins(c: &Containerd, id: &str, shim_dies: bool) {
    let s = keeping_one(c, id);
    let checkpoints = || listed(c, id);
    let turn = |n: usize, after: Option<&String>| {
        let listed = checkpointed_turn(c, &s, n, after);
        listed.last().cloned().expect("a checkpoint")
    };
    let first = turn(1, None);
    let out = c.belayer(&["restore", id, "--checkpoint", &first]);
    assert_eq!(out.code, 0, "{id}: restore from {first}: {out:?}");
    // Two more turns: keep=1 would drop {first}, but the rootfs stacks on it.
    let mut newest = first.clone();
    for n in 2..=3 {
        newest = turn(n, Some(&newest));
    }
    assert!(
        checkpoints().contains(&first),
        "{id}: retention removed checkpoint {first}, which the mounted rootfs stacks on: {:?}",
        checkpoints()
    );
    // Retention after {newest} (keep=1) compacts it and drops the one between: settled before
    // the shim dies. A compaction the SIGKILL cuts short leaves {newest} stacked on {first},
    // which the restore below then mounts, rightly keeping {first} (a loaded machine lost
    // that race once).
    assert!(
        wait_until(Duration::from_secs(30), || checkpoints()
            == [first.clone(), newest.clone()]),
        "{id}: retention after checkpoint {newest} did not settle on [{first}, {newest}]: {:?}",
        checkpoints()
    );
    if shim_dies {
        let shim = c.shim_of(id).expect("the sandbox's shim");
        belayer_integration::sigkill(shim.into()).expect("SIGKILL the shim");
        assert!(
            wait_until(Duration::from_secs(30), || c.task_row(id).is_empty()),
            "{id}: containerd kept the task of its killed shim"
        );
    }
    // Mounted on {newest}'s chain now: {first} is nobody's lower dir any more.
    let out = c.belayer(&["restore", id, "--checkpoint", &newest]);
    assert_eq!(out.code, 0, "{id}: restore from {newest}: {out:?}");
    assert!(
        wait_until(Duration::from_secs(10), || !checkpoints().contains(&first)),
        "{id}: checkpoint {first} outlived the restore that unmounted it: {:?}; shim log:\n{}",
        checkpoints(),
        c.log_lines(id, 30)
    );
    // Without a checkpoint after the restore (else the old path, retention after a checkpoint,
    // would have removed it).
    assert_eq!(
        checkpoints().last(),
        Some(&newest),
        "{id}: an automatic checkpoint came after the restore: this test shows nothing"
    );
    assert_eq!(
        s.exec("cat /turn3", None).stdout,
        "3\n",
        "{id}: the restore lost a file"
    );
    remove(c, id);
}

/// In automatic mode `io.belayer.keep` bounds the store after a requested checkpoint too: the
/// chaos soak (seed 605) found stores one over their bound after a `belayer checkpoint` until
/// the next automatic checkpoint, since retention ran only after automatic ones.
#[test]
fn retention_follows_a_requested_checkpoint_in_automatic_mode() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let id = "requested";
    // No exec: no action ends, so no automatic checkpoint (and its retention) comes between.
    let _s = keeping_one(&c, id);
    let mut newest = String::new();
    for _ in 0..3 {
        newest = checkpoint(&c, id);
    }
    assert!(
        wait_until(Duration::from_secs(10), || listed(&c, id)
            == [newest.clone()]),
        "keep=1, three requested checkpoints: {:?} listed, not [{newest}]; shim log:\n{}",
        listed(&c, id),
        c.log_lines(id, 30)
    );
    remove(&c, id);
}

/// A sandbox in automatic mode whose retention keeps one checkpoint (`io.belayer.keep=1`).
fn keeping_one<'a>(c: &'a Containerd, id: &str) -> Sandbox<'a> {
    Sandbox::start_annotated(
        c,
        BELAYER,
        id,
        &["io.belayer.checkpoint=auto", "io.belayer.keep=1"],
    )
}

/// The checkpoints `belayer checkpoints` lists for `id`, oldest first.
fn listed(c: &Containerd, id: &str) -> Vec<String> {
    c.belayer(&["checkpoints", id])
        .stdout
        .lines()
        .map(str::to_string)
        .collect()
}

/// Turn `n` of an automatic-mode sandbox: an action, then the model "thinks" while the scheduler
/// checkpoints; returns the listed checkpoints once one newer than `after` is.
fn checkpointed_turn(c: &Containerd, s: &Sandbox, n: usize, after: Option<&String>) -> Vec<String> {
    let out = s.exec(&format!("echo {n} > /turn{n}"), None);
    assert_eq!(out.code, 0, "turn {n}: {out:?}");
    c.belayer(&["hint", &s.id, "llm-start", "--expected-ms", "2000"])
        .ok();
    let newer = |l: &[String]| l.last().is_some_and(|x| Some(x) != after);
    assert!(
        wait_until(Duration::from_secs(20), || newer(&listed(c, &s.id))),
        "turn {n}: no automatic checkpoint"
    );
    listed(c, &s.id)
}

/// Whether CRIU is writing the images of a checkpoint of `id` not yet listed.
fn dumping(c: &Containerd, id: &str) -> bool {
    let dir = c.checkpoints_dir(id);
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(".tmp-")
                && !name.starts_with(".tmp-compact")
                && !name.starts_with(".tmp-deleted")
                && std::fs::read_dir(e.path().join("criu"))
                    .is_ok_and(|mut images| images.next().is_some())
        })
}

/// A sandbox whose init is killed while a checkpoint of it is being taken is recovered once that
/// checkpoint has ended (failed, or listed and then the newest), and an exec sent right after the
/// kill waits for the recovery instead of meeting a dead container. In CI, mini-swe-agent's
/// sandbox was lost this way: its init was killed during the automatic checkpoint after an
/// action, the recovery gave up with "already in progress", and every later action failed.
#[test]
fn a_crash_during_a_checkpoint_is_recovered_and_execs_wait_for_it() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let id = "crash-mid";
    let s = Sandbox::start_annotated(&c, BELAYER, id, &["io.belayer.recover=auto"]);
    // The memory holder makes the dump long enough to be caught in the act.
    s.run(&episode::actions(256));
    let marker = |text: &str| {
        let out = s.exec(&format!("echo {text} > /work/marker"), None);
        assert_eq!(out.code, 0, "{out:?}");
    };
    marker("one");
    c.belayer(&["checkpoint", id]).ok();
    marker("two");
    let second = c
        .belayer_cmd(&["checkpoint", id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn belayer checkpoint");
    // Kill the init once CRIU has begun writing the second checkpoint's images.
    let dir = c.checkpoints_dir(id);
    assert!(
        wait_until(Duration::from_secs(30), || dumping(&c, id)),
        "the second checkpoint never started dumping"
    );
    let pid: i32 = task_pid(&c, id).parse().expect("pid");
    belayer_integration::sigkill(pid.into()).expect("SIGKILL the sandbox's init");
    let after_kill = s.exec("cat /work/marker", None);
    let second = second.wait_with_output().expect("belayer checkpoint");
    let status = status(&c, id);
    let listed: Vec<String> = c
        .belayer(&["checkpoints", id])
        .stdout
        .lines()
        .map(str::to_string)
        .collect();
    let context = format!(
        "second checkpoint: {second:?}\nstatus: {status}\nlisted: {listed:?}\ncontainerd's log:\n{}",
        c.log_lines(id, 30)
    );
    println!("{context}");
    // The second checkpoint either made it whole or failed with one line saying why.
    if second.status.success() {
        assert_eq!(listed, ["1", "2"], "{context}");
    } else {
        let err = String::from_utf8_lossy(&second.stderr);
        assert!(
            err.trim().lines().count() == 1
                && err.contains(&format!("container {id} died during the checkpoint")),
            "{context}"
        );
        assert_eq!(listed, ["1"], "a partial checkpoint is listed: {context}");
    }
    let recoveries = status["recoveries"].as_array().cloned().unwrap_or_default();
    assert_eq!(recoveries.len(), 1, "{context}");
    let newest = listed.last().expect("a checkpoint");
    assert_eq!(
        recoveries[0]["position"]["checkpoint"].as_str(),
        Some(newest.as_str()),
        "not recovered from the newest checkpoint: {context}"
    );
    // The exec sent as the init died ran in the recovered sandbox.
    let expected = if newest == "2" { "two\n" } else { "one\n" };
    assert_eq!(after_kill.code, 0, "{after_kill:?}\n{context}");
    assert_eq!(after_kill.stdout, expected, "{context}");
    assert_eq!(task_status(&c, id), "RUNNING");
    let (now, at_start) = s.holder_digests();
    assert_eq!(
        now, at_start,
        "the holder's memory changed across the recovery"
    );
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .expect("the container's checkpoints")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "left in the store: {leftovers:?}");
    remove(&c, id);
}

/// A checkpoint asked for while the shim takes an automatic one waits for it and is taken after
/// it (the state at the request, not an error); two asked for at once still meet one error
/// (`checkpoint_errors.rs`).
#[test]
fn a_checkpoint_asked_for_during_an_automatic_one_waits_for_it() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let id = "asked-mid";
    let s = Sandbox::start_annotated(
        &c,
        BELAYER,
        id,
        &["io.belayer.checkpoint=auto", "io.belayer.keep=100"],
    );
    s.run(&episode::actions(256));
    let listed = || c.belayer(&["checkpoints", id]).stdout;
    // A turn, then the model "thinks": the scheduler checkpoints in the gap.
    let mut caught = false;
    for turn in 1..=5 {
        let out = s.exec(&action(turn), None);
        assert_eq!(out.code, 0, "turn {turn}: {out:?}");
        c.belayer(&["hint", id, "llm-start", "--expected-ms", "3000"])
            .ok();
        if wait_until(Duration::from_secs(3), || dumping(&c, id)) {
            caught = true;
            break;
        }
    }
    assert!(
        caught,
        "no automatic checkpoint in 5 turns; listed:\n{}",
        listed()
    );
    let before = listed();
    let asked = c.belayer(&["checkpoint", id]);
    let after = listed();
    assert_eq!(
        asked.code,
        0,
        "a checkpoint asked for during an automatic one: {asked:?}\n{}",
        c.log_lines(id, 10)
    );
    let seq = asked.stdout.trim();
    assert_eq!(
        after.lines().last(),
        Some(seq),
        "the asked-for checkpoint is not the newest: before {before:?}, after {after:?}"
    );
    assert!(
        after.lines().count() >= before.lines().count() + 2,
        "the automatic checkpoint under way and the asked-for one are not both listed: before \
         {before:?}, after {after:?}"
    );
    assert_eq!(task_status(&c, id), "RUNNING");
    remove(&c, id);
}

fn recoveries(c: &Containerd, id: &str) -> usize {
    status(c, id)["recoveries"].as_array().map_or(0, Vec::len)
}

/// Runs `script` in a sandbox container `id` under automatic recovery, and checkpoints it once.
fn run_recovering(c: &Containerd, id: &str, script: &str) {
    c.ctr(&[
        "run",
        "-d",
        "--runtime",
        BELAYER,
        "--annotation",
        "io.belayer.recover=auto",
        belayer_integration::episode::SANDBOX,
        id,
        "sh",
        "-c",
        script,
    ])
    .ok();
    c.belayer(&["checkpoint", id]).ok();
}

/// An init that exits 0 finished: it is not restored. An init that dies again each time it is
/// restored from the same checkpoint is restored three times, then left dead, its exit reported.
#[test]
fn a_clean_exit_is_not_recovered_and_a_crash_loop_ends() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);

    // The crash loop first: its sandbox imports the image.
    let id = "crash-loop";
    let s = Sandbox::start_annotated(&c, BELAYER, id, &["io.belayer.recover=auto"]);
    c.belayer(&["checkpoint", id]).ok();
    for kill in 1..=4 {
        let pid: i32 = task_pid(&c, id).parse().expect("pid");
        belayer_integration::sigkill(pid.into()).expect("SIGKILL the init");
        let context = || {
            format!(
                "kill {kill}: task {}, status {}\n{}",
                task_status(&c, id),
                status(&c, id),
                c.log_lines(id, 20)
            )
        };
        if kill <= 3 {
            assert!(
                wait_until(Duration::from_secs(30), || recoveries(&c, id) == kill
                    && task_status(&c, id) == "RUNNING"),
                "not recovered: {}",
                context()
            );
            let out = s.exec("true", None);
            assert_eq!(out.code, 0, "{out:?}\n{}", context());
        } else {
            assert!(
                wait_until(Duration::from_secs(30), || task_status(&c, id) == "STOPPED"),
                "a crash loop went on: {}",
                context()
            );
            assert_eq!(recoveries(&c, id), 3, "{}", context());
            assert!(
                c.log_lines(id, 20).contains("a crash loop"),
                "the shim's log does not say why: {}",
                context()
            );
        }
    }
    c.ctr(&["tasks", "rm", id]).ok();
    c.ctr(&["containers", "rm", id]).ok();

    let done = "exits-clean";
    run_recovering(&c, done, "while [ ! -e /stop ]; do sleep 0.05; done");
    let s = Sandbox::attach(&c, done);
    let out = s.exec("touch /stop", None);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(
        wait_until(Duration::from_secs(10), || task_status(&c, done)
            == "STOPPED"),
        "an init that exited 0 was not left stopped: {}, status {}\n{}",
        task_status(&c, done),
        status(&c, done),
        c.log_lines(done, 10)
    );
    assert_eq!(recoveries(&c, done), 0, "{}", status(&c, done));
    c.ctr(&["tasks", "rm", done]).ok();
    c.ctr(&["containers", "rm", done]).ok();
}

/// An exec runc cannot start (no such binary) fails, and the journal records it as ended
/// (exit 255) instead of waiting on it forever: later actions count, and automatic checkpoints
/// go on.
#[test]
fn an_exec_that_cannot_start_is_journalled_as_ended() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    let id = "no-binary";
    let s = Sandbox::start_annotated(
        &c,
        BELAYER,
        id,
        &["io.belayer.checkpoint=auto", "io.belayer.keep=100"],
    );
    let before = status(&c, id)["actions"].as_u64().expect("actions");
    let failed = c.ctr(&["tasks", "exec", "--exec-id", "nb", id, "/no/such/binary"]);
    assert_ne!(failed.code, 0, "{failed:?}");
    let out = s.exec("echo after > /after", None);
    assert_eq!(out.code, 0, "{out:?}");
    let st = status(&c, id);
    assert_eq!(st["actions"].as_u64(), Some(before + 2), "{st}");
    let journal = c.belayer(&["journal", id, "--json"]).ok().stdout;
    let entry: serde_json::Value = journal
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["exec_id"] == "nb")
        .unwrap_or_else(|| panic!("no journal entry for the failed exec:\n{journal}"));
    assert_eq!(entry["exit_code"].as_u64(), Some(255), "{entry}");
    // The scheduler heard the action end: the next gap gets a checkpoint.
    let listed = || c.belayer(&["checkpoints", id]).stdout.lines().count();
    let taken = listed();
    c.belayer(&["hint", id, "llm-start", "--expected-ms", "5000"])
        .ok();
    assert!(
        wait_until(Duration::from_secs(20), || listed() > taken),
        "no automatic checkpoint after the failed exec: {}\n{}",
        status(&c, id),
        c.log_lines(id, 20)
    );
    assert_eq!(task_status(&c, id), "RUNNING");
    remove(&c, id);
}

/// A death containerd or the user asked for is not recovered: one by a signal `ctr task kill`
/// sent, and the end of an exit-mode checkpoint. A signal the init survives (a reload on
/// SIGHUP) does not turn recovery off: a later crash is still recovered.
#[test]
fn a_death_asked_for_is_not_recovered_and_a_survived_signal_keeps_recovery() {
    let _machine = machine_shared();
    let c = Containerd::start(Flavor::V2);
    c.import(&belayer_integration::prereq::image("sandbox.tar"));
    let run = |id: &str, script: &str| run_recovering(&c, id, script);
    let context = |id: &str| {
        format!(
            "task {}, status {}\n{}",
            task_status(&c, id),
            status(&c, id),
            c.log_lines(id, 20)
        )
    };
    let stopped =
        |id: &str| wait_until(Duration::from_secs(15), || task_status(&c, id) == "STOPPED");

    // SIGHUP reloads, then a crash (SIGKILL from outside containerd): recovered.
    let hup = "reloads";
    // The init is pid 1 of its namespace: only signals it handles reach it. It dies of USR1 as
    // a shell does, exit status 128 + 10.
    run(
        hup,
        "trap 'echo reload' HUP; trap 'exit 138' USR1; while :; do sleep 0.05; done",
    );
    c.ctr(&["tasks", "kill", "-s", "SIGHUP", hup]).ok();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(task_status(&c, hup), "RUNNING", "{}", context(hup));
    let pid: i32 = task_pid(&c, hup).parse().expect("pid");
    belayer_integration::sigkill(pid.into()).expect("SIGKILL the init");
    assert!(
        wait_until(Duration::from_secs(30), || recoveries(&c, hup) == 1
            && task_status(&c, hup) == "RUNNING"),
        "a crash after a survived SIGHUP was not recovered: {}",
        context(hup)
    );

    // Killed by the signal containerd sent: left stopped.
    c.ctr(&["tasks", "kill", "-s", "SIGUSR1", hup]).ok();
    assert!(stopped(hup), "killed by ctr's SIGUSR1: {}", context(hup));
    assert_eq!(recoveries(&c, hup), 1, "{}", context(hup));
    remove(&c, hup);

    // An exit-mode checkpoint ends the container: left stopped, the checkpoint kept.
    let ends = "exit-checkpoint";
    run(ends, "while :; do sleep 0.05; done");
    c.belayer(&["checkpoint", "--exit", ends]).ok();
    assert!(stopped(ends), "after checkpoint --exit: {}", context(ends));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(task_status(&c, ends), "STOPPED", "{}", context(ends));
    assert_eq!(recoveries(&c, ends), 0, "{}", context(ends));
    assert_eq!(
        c.belayer(&["checkpoints", ends])
            .ok()
            .stdout
            .lines()
            .count(),
        2,
        "the exit checkpoint was not kept"
    );
    remove(&c, ends);
}
