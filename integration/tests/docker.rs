//! `docker run --runtime io.containerd.belayer.v1` and `docker exec` behave as with runc-v2,
//! on a dockerd the test starts itself (own data root, on the test's containerd).

mod common;

use belayer_integration::{Containerd, Docker, Flavor};
use common::*;
use std::time::Duration;

fn scenario(d: &Docker, rt: &str, name: &str) -> Vec<String> {
    let mut v = Vec::new();
    let out = d.docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--runtime",
        rt,
        "belayer/busybox",
        "sh",
        "-c",
        "echo hi; echo oops >&2; exit 3",
    ]);
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (3, "hi\n"),
        "{rt}: {out:?}"
    );
    v.extend(observe("run", &out, name));
    let out = d.docker_stdin(
        &[
            "run",
            "--rm",
            "-i",
            "--network",
            "none",
            "--runtime",
            rt,
            "belayer/busybox",
            "sh",
            "-c",
            "read a; echo got:$a",
        ],
        b"x\n",
    );
    v.extend(observe("run-stdin", &out, name));
    d.docker(&[
        "run",
        "-d",
        "--name",
        name,
        "--network",
        "none",
        "--runtime",
        rt,
        "belayer/busybox",
        "sleep",
        "1000",
    ])
    .ok();
    let out = d.docker(&["exec", name, "sh", "-c", "echo out; echo err >&2; exit 5"]);
    assert_eq!(out.code, 5, "{rt}: {out:?}");
    v.extend(observe("exec", &out, name));
    v.extend(observe(
        "exec-stdin",
        &d.docker_stdin(&["exec", "-i", name, "cat"], b"piped\n"),
        name,
    ));
    let line = format!(
        "DOCKER_HOST={} docker exec -t {name} sh -c 'test -t 1 && echo tty; exit 6'",
        d.host
    );
    let out = belayer_integration::containerd::run(
        std::process::Command::new("script").args(["-qec", &line, "/dev/null"]),
        None,
        std::time::Duration::from_secs(60),
    );
    v.extend(observe("exec-tty", &out, name));
    let out = d.docker(&["exec", name, "no-such-command"]);
    v.push(format!(
        "exec-missing: code={} found={}",
        out.code,
        out.stdout.contains("executable file not found")
            || out.stderr.contains("executable file not found")
    ));
    v.extend(observe("pause", &d.docker(&["pause", name]), name));
    v.push(
        d.docker(&["inspect", "-f", "{{.State.Status}}", name])
            .stdout
            .trim()
            .to_string(),
    );
    v.extend(observe("unpause", &d.docker(&["unpause", name]), name));
    let top = d.docker(&["top", name]).ok();
    v.push(format!("top rows: {}", top.stdout.lines().count()));
    let stats = d
        .docker(&["stats", "--no-stream", "--format", "{{.MemUsage}}", name])
        .ok();
    assert!(
        !stats.stdout.starts_with("0B"),
        "{rt}: no memory usage: {stats:?}"
    );
    v.extend(observe(
        "update",
        &d.docker(&[
            "update",
            "--memory",
            "64m",
            "--memory-swap",
            "-1",
            "--cpus",
            "0.5",
            name,
        ]),
        name,
    ));
    let limit = d
        .docker(&["stats", "--no-stream", "--format", "{{.MemUsage}}", name])
        .ok();
    v.push(format!(
        "limit: {}",
        limit.stdout.split('/').nth(1).unwrap_or("").trim()
    ));
    v.extend(observe("kill", &d.docker(&["kill", name]), name));
    v.push(
        d.docker(&[
            "inspect",
            "-f",
            "{{.State.Status}} {{.State.ExitCode}}",
            name,
        ])
        .stdout
        .trim()
        .to_string(),
    );
    v.extend(observe("rm", &d.docker(&["rm", name]), name));
    v
}

#[test]
fn docker_run_and_exec_same_as_runc_v2() {
    let c = Containerd::start(Flavor::V2);
    let d = Docker::start(&c);
    let reference = scenario(&d, RUNC, "dk-runc");
    let ours = scenario(&d, BELAYER, "dk-belayer");
    assert_eq!(reference, ours);
    assert!(ours.iter().any(|l| l == "limit: 64MiB"), "{ours:?}");
    let docker_ns = Containerd::ns_shims_of(&c, "moby");
    assert!(
        docker_ns.is_empty(),
        "shims left running after docker rm: {docker_ns:?}"
    );
}

#[test]
fn belayer_cli_checkpoints_and_restores_docker_containers() {
    let c = Containerd::start(Flavor::V2);
    let d = Docker::start(&c);
    d.docker(&[
        "run",
        "-d",
        "--name",
        "dk",
        "--network",
        "none",
        "--runtime",
        BELAYER,
        "belayer/busybox",
        "sh",
        "-c",
        "i=0; while true; do i=$((i+1)); echo $i >> /c; sleep 0.01; done",
    ])
    .ok();
    let id = d.id("dk");
    d.docker(&["exec", "dk", "sh", "-c", "echo kept > /marker"])
        .ok();
    let belayer = |args: &[&str]| {
        belayer_integration::containerd::run(
            &mut c.belayer_cmd_in("moby", args),
            None,
            Duration::from_secs(120),
        )
    };
    let cp = belayer(&["checkpoint", &id]).ok().stdout.trim().to_string();
    d.docker(&["exec", "dk", "sh", "-c", "rm /marker"]).ok();
    belayer(&["restore", &id, "--checkpoint", &cp]).ok();
    assert_eq!(
        d.docker(&["inspect", "-f", "{{.State.Status}}", "dk"])
            .stdout
            .trim(),
        "running"
    );
    assert_eq!(
        d.docker(&["exec", "dk", "cat", "/marker"]).stdout,
        "kept\n",
        "docker exec after a restore"
    );
    let counter = d.docker(&["exec", "dk", "cat", "/c"]).stdout;
    let numbers: Vec<u64> = counter.lines().filter_map(|l| l.parse().ok()).collect();
    assert!(
        belayer_integration::episode::is_contiguous(&numbers),
        "counter and process disagree"
    );
    d.docker(&["rm", "-f", "dk"]).ok();
    let left = belayer_integration::leaks::mounts_under(std::path::Path::new("/"))
        .into_iter()
        .filter(|m| m.contains(&id))
        .collect::<Vec<_>>();
    assert!(left.is_empty(), "mounts left: {left:?}");
}

/// A docker container's output after Belayer restored it, in place and after a crash: its
/// init prints `tick N M`, M read from `/marker`, which the test writes only after the
/// restore, so a line with it in `docker logs` came from the restored process. With a
/// terminal (`-t`) the restored init is on a new pty, and a fork of it runs on one too.
fn restored_output_reaches_docker_logs(tty: bool) {
    let c = Containerd::start(Flavor::V2);
    let d = Docker::start(&c);
    let name = if tty { "dk-tty" } else { "dk-pipes" };
    let mut run = vec!["run", "-d", "--name", name, "--network", "none"];
    if tty {
        run.push("-t");
    }
    run.extend([
        "--annotation",
        "io.belayer.recover=auto",
        "--runtime",
        BELAYER,
        "belayer/busybox",
        "sh",
        "-c",
        "i=0; while true; do i=$((i+1)); echo $i >> /c; m=; [ -f /marker ] && read m < /marker; \
         echo \"tick $i $m\"; sleep 0.05; done",
    ]);
    d.docker(&run).ok();
    let id = d.id(name);
    let belayer = |args: &[&str]| {
        belayer_integration::containerd::run(
            &mut c.belayer_cmd_in("moby", args),
            None,
            Duration::from_secs(120),
        )
    };
    let ctr = |args: &[&str]| c.ctr_in("moby", args);
    let logs_show = |marker: &str| {
        wait_until(Duration::from_secs(20), || {
            let out = d.docker(&["logs", name]);
            format!("{}{}", out.stdout, out.stderr).contains(&format!(" {marker}"))
        })
    };
    let on_terminal = |exec: &dyn Fn(&str) -> String| {
        let fd1 = exec("readlink /proc/1/fd/1");
        assert_eq!(
            fd1.trim().starts_with("/dev/pts/"),
            tty,
            "{name}: init's stdout is {fd1:?}"
        );
    };
    let docker_exec = |script: &str| d.docker(&["exec", name, "sh", "-c", script]).ok().stdout;
    // What the restored init prints once `/marker` holds `stage` reaches `docker logs`.
    let reaches_logs = |stage: &str, what: &str| {
        docker_exec(&format!("echo {stage} > /marker"));
        assert!(
            logs_show(stage),
            "{name}: docker logs lost the output of the container {what}:\n{}",
            d.docker(&["logs", "--tail", "5", name]).stdout
        );
    };
    assert!(logs_show(""), "{name}: no output before the checkpoint");
    let cp = belayer(&["checkpoint", &id]).ok().stdout.trim().to_string();

    belayer(&["restore", &id, "--checkpoint", &cp]).ok();
    reaches_logs("after-restore", "restored in place");
    on_terminal(&docker_exec);

    // docker's State.Pid is the first init's; containerd knows the restored one.
    let pid: i64 = task_row_in(&c, "moby", &id)
        .first()
        .and_then(|p| p.parse().ok())
        .expect("the restored init's pid in ctr tasks ls");
    belayer_integration::sigkill(pid).expect("SIGKILL the init");
    let recoveries = || {
        serde_json::from_str::<serde_json::Value>(&belayer(&["status", &id]).stdout)
            .ok()
            .and_then(|v| v["recoveries"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    assert!(
        wait_until(Duration::from_secs(30), || recoveries() == 1),
        "{name}: no recovery after SIGKILL: {}",
        belayer(&["status", &id]).stdout
    );
    reaches_logs("after-recovery", "recovered after a crash");
    on_terminal(&docker_exec);

    let fork = belayer(&["fork", &id, "--checkpoint", &cp, "--count", "1"])
        .ok()
        .stdout
        .trim()
        .to_string();
    let fork_exec = |script: &str| {
        ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            "probe",
            &fork,
            "sh",
            "-c",
            script,
        ])
        .ok()
        .stdout
    };
    let ticks =
        |exec: &dyn Fn(&str) -> String| exec("wc -l < /c").trim().parse::<u64>().unwrap_or(0);
    let before = ticks(&fork_exec);
    assert!(
        wait_until(Duration::from_secs(10), || ticks(&fork_exec) > before + 5),
        "{name}: the fork's init does not run (it would block on a full pty nobody reads)"
    );
    on_terminal(&fork_exec);
    ctr(&["tasks", "kill", "-s", "9", &fork]);
    wait_until(Duration::from_secs(10), || {
        matches!(
            task_row_in(&c, "moby", &fork).get(1).map(String::as_str),
            None | Some("STOPPED")
        )
    });
    ctr(&["tasks", "rm", &fork]).ok();
    ctr(&["containers", "rm", &fork]).ok();
    d.docker(&["rm", "-f", name]).ok();
}

#[test]
fn restored_output_reaches_docker_logs_through_pipes() {
    restored_output_reaches_docker_logs(false);
}

#[test]
fn restored_terminal_output_reaches_docker_logs_and_forks_run_on_a_pty() {
    restored_output_reaches_docker_logs(true);
}
