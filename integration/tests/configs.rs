//! The files in configs/ do what the README says: containerd 2.x and 1.7 accept the runtime
//! entries, docker runs containers through Belayer by runtime name and as default runtime.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use belayer_integration::{Containerd, Docker, Flavor};

fn config(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../configs")
        .join(rel)
}

fn dump(containerd: &str, file: &str) -> String {
    let out = Command::new(containerd)
        .arg("--config")
        .arg(config(file))
        .args(["config", "dump"])
        .output()
        .expect("containerd");
    assert!(
        out.status.success(),
        "{containerd} rejects {file}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn containerd_accepts_the_runtime_entries() {
    let v2 = dump("containerd", "containerd/config-2.x.toml");
    assert!(
        v2.contains("runtimes.belayer]")
            && v2.contains("runtime_type = 'io.containerd.belayer.v1'"),
        "{v2}"
    );
    let v17 = dump(
        "/opt/belayer/containerd-1.7/usr/bin/containerd",
        "containerd/config-1.7.toml",
    );
    assert!(
        v17.contains("runtimes.belayer]")
            && v17.contains("runtime_type = \"io.containerd.belayer.v1\""),
        "{v17}"
    );
}

/// The runtime containerd recorded for a docker container (namespace `moby`).
fn runtime_of(c: &Containerd, d: &Docker, name: &str) -> String {
    let out = c.ctr_in("moby", &["containers", "info", &d.id(name)]);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_default();
    v["Runtime"]["Name"].as_str().unwrap_or("?").to_string()
}

#[test]
fn docker_daemon_json_runtime_entries_work() {
    let c = Containerd::start(Flavor::V2);
    {
        let d = Docker::start_with_config(&c, Some(&config("docker/daemon.json")));
        let out = d.docker(&[
            "run",
            "--rm",
            "--network",
            "none",
            "--runtime",
            "belayer",
            "belayer/busybox",
            "sh",
            "-c",
            "echo via-name; exit 4",
        ]);
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (4, "via-name\n"),
            "{out:?}"
        );
        d.docker(&[
            "run",
            "-d",
            "--name",
            "named",
            "--network",
            "none",
            "--runtime",
            "belayer",
            "belayer/busybox",
            "sleep",
            "100",
        ])
        .ok();
        assert_eq!(runtime_of(&c, &d, "named"), "io.containerd.belayer.v1");
    }
    let d = Docker::start_with_config(&c, Some(&config("docker/daemon-default-runtime.json")));
    d.docker(&[
        "run",
        "-d",
        "--name",
        "default",
        "--network",
        "none",
        "belayer/busybox",
        "sleep",
        "100",
    ])
    .ok();
    assert_eq!(runtime_of(&c, &d, "default"), "io.containerd.belayer.v1");
}
