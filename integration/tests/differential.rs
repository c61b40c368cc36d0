//! The same scenarios under `io.containerd.runc.v2` (the reference) and Belayer: every observable
//! result must match — output, exit codes, errors, states, process lists, metric names, limits.
//! Runs against containerd 2.x and 1.7.

mod common;

use std::time::Duration;

use belayer_integration::{Containerd, Flavor, leaks};
use common::*;

type Scenario = fn(&Containerd, &str, &str) -> Vec<String>;

fn run_exit(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        rt,
        BUSYBOX,
        id,
        "sh",
        "-c",
        "echo hi; echo oops >&2; exit 3",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (3, "hi\n"),
        "{rt}: {out:?}"
    );
    observe("run", &out, id)
}

fn run_signal_exit(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            wait_until(Duration::from_secs(10), || task_status(c, id) == "RUNNING");
            c.ctr(&["tasks", "kill", "-s", "KILL", id]).ok();
        });
        c.ctr(&["run", "--rm", "--runtime", rt, BUSYBOX, id, "sleep", "1000"])
    });
    assert_eq!(out.code, 137, "{rt}: {out:?}");
    observe("run", &out, id)
}

fn run_stdin(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    let out = c.ctr_stdin(
        &[
            "run",
            "--rm",
            "--runtime",
            rt,
            BUSYBOX,
            id,
            "sh",
            "-c",
            "read a; read b; echo $b$a; echo done",
        ],
        b"a\nb\nc\n",
    );
    assert!(out.stdout.contains("done"), "{rt}: {out:?}");
    observe("run", &out, id)
}

fn run_tty(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    let out = c.ctr_tty(&[
        "run",
        "--rm",
        "-t",
        "--runtime",
        rt,
        BUSYBOX,
        id,
        "sh",
        "-c",
        "test -t 0 && test -t 1 && echo is-a-tty; exit 2",
    ]);
    assert!(out.stdout.contains("is-a-tty"), "{rt}: {out:?}");
    observe("run-tty", &out, id)
}

fn missing_command(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        rt,
        BUSYBOX,
        id,
        "/no/such/program",
    ]);
    assert_ne!(out.code, 0);
    let mut v = vec![format!("code={}", out.code)];
    // The wording before runc's own message names the shim ("runc-v2 shim" vs ours): compare runc's.
    v.push(out.stderr.contains("no such file or directory").to_string());
    let _ = c.ctr(&["containers", "rm", id]);
    v
}

fn exec(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(c, rt, id, &["sleep", "1000"]);
    let mut v = Vec::new();
    let out = c.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        "e1",
        id,
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!(out.code, 7, "{rt}: {out:?}");
    v.extend(observe("exec", &out, id));
    let out = c.ctr_stdin(
        &[
            "tasks",
            "exec",
            "--exec-id",
            "e2",
            id,
            "sh",
            "-c",
            "read x; echo got:$x",
        ],
        b"hello\n",
    );
    assert_eq!(out.stdout, "got:hello\n", "{rt}: {out:?}");
    v.extend(observe("exec-stdin", &out, id));
    let out = c.ctr_tty(&[
        "tasks",
        "exec",
        "-t",
        "--exec-id",
        "e3",
        id,
        "sh",
        "-c",
        "test -t 1 && echo tty; exit 4",
    ]);
    v.extend(observe("exec-tty", &out, id));
    let out = c.ctr(&["tasks", "exec", "--exec-id", "e4", id, "no-such-command"]);
    v.push(format!(
        "exec-missing: code={} found={}",
        out.code,
        out.stderr.contains("executable file not found")
    ));
    let out = c.ctr(&[
        "tasks",
        "exec",
        "--exec-id",
        "e5",
        "--cwd",
        "/tmp",
        "--user",
        "65534",
        id,
        "sh",
        "-c",
        "pwd; id -u",
    ]);
    v.extend(observe("exec-cwd-user", &out, id));
    remove(c, id);
    v
}

fn pause_resume(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(c, rt, id, &["sleep", "1000"]);
    let mut v = vec![format!("before: {}", task_status(c, id))];
    v.extend(observe("pause", &c.ctr(&["tasks", "pause", id]), id));
    v.push(format!("paused: {}", task_status(c, id)));
    v.extend(
        observe("pause-again", &c.ctr(&["tasks", "pause", id]), id)
            .into_iter()
            .map(|l| l.split(':').take(2).collect::<Vec<_>>().join(":")),
    );
    v.extend(observe("resume", &c.ctr(&["tasks", "resume", id]), id));
    v.push(format!("resumed: {}", task_status(c, id)));
    v.extend(observe(
        "exec-after",
        &c.ctr(&["tasks", "exec", "--exec-id", "x", id, "echo", "alive"]),
        id,
    ));
    assert!(v.contains(&"paused: PAUSED".to_string()), "{rt}: {v:?}");
    remove(c, id);
    v
}

fn kill(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(
        c,
        rt,
        id,
        &[
            "sh",
            "-c",
            "trap 'exit 42' TERM; while true; do sleep 0.1; done",
        ],
    );
    let mut v = observe("kill", &c.ctr(&["tasks", "kill", id]), id);
    assert!(
        wait_until(Duration::from_secs(10), || task_status(c, id) == "STOPPED"),
        "{rt}: not stopped"
    );
    v.push(format!("status: {}", task_status(c, id)));
    v.extend(observe("kill-stopped", &c.ctr(&["tasks", "kill", id]), id));
    v.extend(observe("rm", &c.ctr(&["tasks", "rm", id]), id));
    v.extend(observe("crm", &c.ctr(&["containers", "rm", id]), id));
    v
}

fn pids(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(c, rt, id, &["sh", "-c", "sleep 1000 & sleep 1000"]);
    c.ctr(&[
        "tasks",
        "exec",
        "-d",
        "--exec-id",
        "side",
        id,
        "sleep",
        "1000",
    ])
    .ok();
    assert!(wait_until(Duration::from_secs(5), || c
        .ctr(&["tasks", "ps", id])
        .stdout
        .lines()
        .count()
        >= 4));
    let out = c.ctr(&["tasks", "ps", id]);
    let mut rows: Vec<String> = out
        .stdout
        .lines()
        .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
        .collect();
    rows.sort();
    remove(c, id);
    rows.into_iter().map(|r| format!("ps: {r}")).collect()
}

fn metrics(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(c, rt, id, &["sleep", "1000"]);
    let out = c.ctr(&["tasks", "metrics", id]).ok();
    let mut names: Vec<String> = out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(|n| n.replace(id, "ID")))
        .collect();
    names.sort();
    let usage = out
        .stdout
        .lines()
        .find(|l| l.starts_with("memory.usage_in_bytes") || l.starts_with("memory.usage "))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(usage > 0, "{rt}: no memory usage in {out:?}");
    remove(c, id);
    names.into_iter().map(|n| format!("metric: {n}")).collect()
}

fn update(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(c, rt, id, &["sleep", "1000"]);
    let resources = serde_json::json!({"memory": {"limit": 67108864}, "cpu": {"quota": 50000, "period": 100000}});
    let mut v = vec![format!("update: {:?}", c.update_task(id, &resources))];
    let bad = serde_json::json!({"memory": {"limit": "lots"}});
    v.push(format!(
        "bad update fails: {}",
        c.update_task(id, &bad).is_err()
    ));
    let limits = cgroup_limits(c, id);
    assert!(limits.contains("67108864"), "{rt}: {limits}");
    v.push(format!("limits: {limits}"));

    remove(c, id);
    v
}

/// The memory limit and CPU quota of a task's cgroup, read on the host (v1 or v2).
fn cgroup_limits(c: &Containerd, id: &str) -> String {
    let pid = c
        .ctr(&["tasks", "ls"])
        .stdout
        .lines()
        .find(|l| l.starts_with(id))
        .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_default();
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let path_of = |sub: &str| {
        cgroup.lines().find_map(|l| {
            let mut p = l.splitn(3, ':');
            let (_, subs, path) = (p.next()?, p.next()?, p.next()?);
            subs.split(',').any(|s| s == sub).then(|| path.to_string())
        })
    };
    let read = |p: String| {
        std::fs::read_to_string(&p)
            .unwrap_or_else(|_| format!("unreadable {p}"))
            .trim()
            .to_string()
    };
    match path_of("memory") {
        Some(mem) => format!(
            "{} {}",
            read(format!("/sys/fs/cgroup/memory{mem}/memory.limit_in_bytes")),
            read(format!(
                "/sys/fs/cgroup/cpu{}/cpu.cfs_quota_us",
                path_of("cpu").unwrap_or_default()
            ))
        ),
        None => {
            let p = cgroup
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .unwrap_or("/")
                .to_string();
            format!(
                "{} {}",
                read(format!("/sys/fs/cgroup{p}/memory.max")),
                read(format!("/sys/fs/cgroup{p}/cpu.max"))
            )
        }
    }
}

fn delete(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    run_detached(c, rt, id, &["sh", "-c", "exit 5"]);
    assert!(wait_until(Duration::from_secs(10), || task_status(c, id) == "STOPPED"));
    let mut v = observe("rm", &c.ctr(&["tasks", "rm", id]), id);
    v.extend(observe("crm", &c.ctr(&["containers", "rm", id]), id));
    v.push(format!("after: {}", task_status(c, id)));
    let gone = wait_until(Duration::from_secs(10), || {
        leaks::pids_with_args(&["-id", id]).is_empty()
    });
    v.push(format!("shim exited: {gone}"));
    assert!(gone, "{rt}: shim of {id} still running");
    v
}

fn twenty_at_once(c: &Containerd, rt: &str, id: &str) -> Vec<String> {
    let mut outs: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..20)
            .map(|i| {
                s.spawn(move || {
                    let cid = format!("{id}-{i}");
                    let script = format!("echo n={i}; exit {}", i % 5);
                    let out = c.ctr(&[
                        "run",
                        "--rm",
                        "--runtime",
                        rt,
                        BUSYBOX,
                        &cid,
                        "sh",
                        "-c",
                        &script,
                    ]);
                    format!("{i}: code={} out={}", out.code, out.stdout.trim())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    outs.sort();
    assert_eq!(outs.len(), 20);
    assert!(outs.iter().all(|o| o.contains("out=n=")), "{rt}: {outs:?}");
    outs
}

const SCENARIOS: &[(&str, Scenario)] = &[
    ("run-exit", run_exit),
    ("run-signal", run_signal_exit),
    ("run-stdin", run_stdin),
    ("run-tty", run_tty),
    ("missing-cmd", missing_command),
    ("exec", exec),
    ("pause", pause_resume),
    ("kill", kill),
    ("pids", pids),
    ("metrics", metrics),
    ("update", update),
    ("delete", delete),
    ("twenty", twenty_at_once),
];

fn differential(flavor: Flavor) {
    let c = Containerd::start(flavor);
    let mut failures = Vec::new();
    for (name, scenario) in SCENARIOS {
        let reference = scenario(&c, RUNC, &format!("{name}-runc"));
        let ours = scenario(&c, BELAYER, &format!("{name}-belayer"));
        if reference != ours {
            failures.push(format!(
                "{name}:\n  runc-v2: {reference:#?}\n  belayer: {ours:#?}"
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) differ on {flavor:?}:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn same_as_runc_v2_on_containerd_2() {
    differential(Flavor::V2);
}

#[test]
fn same_as_runc_v2_on_containerd_1_7() {
    differential(Flavor::V1_7);
}
