//! A private dockerd on top of a test's containerd, with its own data root and socket.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::containerd::{Containerd, Out, run};
use crate::prereq;

pub struct Docker {
    pub host: String,
    dir: PathBuf,
    child: Child,
    /// The bridge of a networked daemon, deleted on drop.
    bridge: Option<String>,
}

static BRIDGES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Docker {
    /// Starts dockerd against `containerd` and imports the busybox rootfs as `belayer/busybox`.
    #[track_caller]
    pub fn start(containerd: &Containerd) -> Self {
        Self::start_with_config(containerd, None)
    }

    /// Like [`Docker::start`], with a `daemon.json`.
    #[track_caller]
    pub fn start_with_config(containerd: &Containerd, config: Option<&std::path::Path>) -> Self {
        Self::spawn(containerd, config, None, false)
    }

    /// Like [`Docker::start`], with docker's containers in `containerd`'s own namespace (not
    /// `moby`), so that `ctr` and `belayer` of that containerd see them as they see their own:
    /// the chaos soak drives some sandboxes through docker and checks them all alike.
    #[track_caller]
    pub fn start_in_namespace(containerd: &Containerd) -> Self {
        Self::spawn(containerd, None, None, true)
    }

    /// Like [`Docker::start`], with container networking: a private Linux bridge (its own /24)
    /// that containers attach to, so `docker run -p HOST:CONTAINER` reaches them through
    /// docker-proxy. No iptables rules are written.
    #[track_caller]
    pub fn start_networked(containerd: &Containerd) -> Self {
        prereq::require_bin("ip");
        let n = BRIDGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let name = format!("blbr{}x{n}", pid % 100_000);
        let subnet = format!("10.{}.{}.1/24", 200 + pid % 50, n % 250);
        let _ = run(
            Command::new("ip").args(["link", "del", &name]),
            None,
            Duration::from_secs(10),
        );
        for args in [
            vec!["link", "add", &name, "type", "bridge"],
            vec!["addr", "add", &subnet, "dev", &name],
            vec!["link", "set", &name, "up"],
        ] {
            run(
                Command::new("ip").args(&args),
                None,
                Duration::from_secs(10),
            )
            .ok();
        }
        Self::spawn(containerd, None, Some(name), false)
    }

    #[track_caller]
    fn spawn(
        containerd: &Containerd,
        config: Option<&std::path::Path>,
        bridge: Option<String>,
        same_namespace: bool,
    ) -> Self {
        prereq::require_bin("dockerd");
        prereq::require_bin("docker");
        let dir = containerd.dir.join("docker");
        std::fs::create_dir_all(&dir).expect("docker dir");
        let host = format!("unix://{}/docker.sock", dir.display());
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("log");
        let mut cmd = Command::new("dockerd");
        if let Some(config) = config {
            cmd.arg("--config-file").arg(config);
        }
        if same_namespace {
            cmd.args(["--containerd-namespace", &containerd.ns]).args([
                "--containerd-plugins-namespace",
                &format!("{}-plugins", containerd.ns),
            ]);
        }
        let child = cmd
            .args(["--data-root", &format!("{}/data", dir.display())])
            .args(["--exec-root", &format!("{}/exec", dir.display())])
            .args(["--pidfile", &format!("{}/dockerd.pid", dir.display())])
            .args([
                "-H",
                &host,
                "--containerd",
                &containerd.sock.display().to_string(),
            ])
            .args(["--iptables=false", "--ip6tables=false"])
            .arg(format!("--bridge={}", bridge.as_deref().unwrap_or("none")))
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    prereq::bin_dir().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn dockerd");
        let d = Self {
            host,
            dir,
            child,
            bridge,
        };
        let start = Instant::now();
        while d.docker(&["version"]).code != 0 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "dockerd did not come up; log:\n{}",
                std::fs::read_to_string(d.dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let rootfs = prereq::image("busybox.rootfs.tar");
        d.docker(&["import", &rootfs.display().to_string(), "belayer/busybox"])
            .ok();
        d
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("docker");
        cmd.env("DOCKER_HOST", &self.host).args(args);
        cmd
    }

    pub fn docker(&self, args: &[&str]) -> Out {
        run(&mut self.cmd(args), None, Duration::from_secs(120))
    }

    pub fn docker_stdin(&self, args: &[&str], input: &[u8]) -> Out {
        run(&mut self.cmd(args), Some(input), Duration::from_secs(120))
    }

    /// dockerd's pid (a test that loses the node kills it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The full id of container `name`: its containerd container id in namespace `moby`.
    #[track_caller]
    pub fn id(&self, name: &str) -> String {
        self.docker(&["inspect", "-f", "{{.Id}}", name])
            .ok()
            .stdout
            .trim()
            .to_string()
    }
}

impl Drop for Docker {
    fn drop(&mut self) {
        let ids = self.docker(&["ps", "-aq"]).stdout;
        for id in ids.lines() {
            let _ = self.docker(&["rm", "-f", id]);
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none()
            && start.elapsed() < Duration::from_secs(15)
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        crate::leaks::unmount_under(&self.dir);
        if let Some(bridge) = &self.bridge {
            let _ = run(
                Command::new("ip").args(["link", "del", bridge]),
                None,
                Duration::from_secs(10),
            );
        }
    }
}
