//! `docker run --runtime io.containerd.belayer.v1` and `docker exec` behave as with runc-v2,
//! on a dockerd the test starts itself (own data root, on the test's containerd).

mod common;

use belayer_integration::{Containerd, Docker, Flavor};
use common::*;

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
    let id = d
        .docker(&["inspect", "-f", "{{.Id}}", "dk"])
        .ok()
        .stdout
        .trim()
        .to_string();
    d.docker(&["exec", "dk", "sh", "-c", "echo kept > /marker"])
        .ok();
    let belayer = |args: &[&str]| {
        belayer_integration::containerd::run(
            &mut c.belayer_cmd_in("moby", args),
            None,
            std::time::Duration::from_secs(120),
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
