//! The reference episode of an agent in the Debian + Python sandbox, shared by the end-to-end
//! tests and `belayer-bench env`: a pip install of a local wheel, file edits, files and a
//! directory of the image deleted and replaced, chown/chmod/xattr/hardlink/symlink/fifo/sparse
//! file, a background Python process holding 300 MB of known bytes with an open file and a
//! listening socket, and a counter process proving one-instant consistency.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::containerd::{Containerd, Out};
use crate::prereq;

pub const SANDBOX: &str = "belayer.local/sandbox:latest";

const HOLDER: &[u8] = include_bytes!("../assets/holder.py");
const COUNTER: &[u8] = include_bytes!("../assets/counter.sh");
const TREE: &[u8] = include_bytes!("../assets/tree.py");

/// One action of the agent: a shell script run by `ctr task exec`, with optional stdin.
pub struct Action {
    pub name: &'static str,
    pub script: String,
    pub stdin: Option<Vec<u8>>,
}

fn action(name: &'static str, script: &str) -> Action {
    Action {
        name,
        script: script.to_string(),
        stdin: None,
    }
}

fn upload(name: &'static str, path: &str, data: Vec<u8>) -> Action {
    Action {
        name,
        script: format!("mkdir -p \"$(dirname {path})\" && cat > {path}"),
        stdin: Some(data),
    }
}

/// A local wheel (`belayer_demo` 1.0), made with the host's python3 once per test process (its
/// tests run side by side and each builds the episode).
pub fn wheel() -> Vec<u8> {
    static WHEEL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    WHEEL
        .get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("belayer-wheel-{}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("wheel dir");
            let script = dir.join("mkwheel.py");
            std::fs::write(&script, include_bytes!("../assets/mkwheel.py"))
                .expect("write mkwheel.py");
            let out = dir.join("belayer_demo-1.0-py3-none-any.whl");
            let status = std::process::Command::new("python3")
                .arg(&script)
                .arg(&out)
                .status()
                .expect("python3");
            assert!(status.success(), "mkwheel.py failed");
            let bytes = std::fs::read(&out).expect("wheel");
            let _ = std::fs::remove_dir_all(&dir);
            bytes
        })
        .clone()
}

/// The episode, in order. `holder_mb` sizes the background process's memory.
pub fn actions(holder_mb: u32) -> Vec<Action> {
    vec![
        upload("upload-tools", "/opt/belayer/tree.py", TREE.to_vec()),
        upload("upload-holder", "/work/holder.py", HOLDER.to_vec()),
        upload("upload-counter", "/work/counter.sh", COUNTER.to_vec()),
        upload(
            "upload-wheel",
            "/work/dist/belayer_demo-1.0-py3-none-any.whl",
            wheel(),
        ),
        action(
            "pip-install",
            "pip install --no-index --break-system-packages -q /work/dist/belayer_demo-1.0-py3-none-any.whl \
             && python3 -c 'import belayer_demo; assert belayer_demo.answer() == 42'",
        ),
        action(
            "edit-files",
            "printf 'def main():\\n    return 1\\n' > /work/main.py && sed -i 's/return 1/return 2/' /work/main.py \
             && echo edited >> /etc/debian_version && mkdir -p /work/src/pkg && echo 'x = 1' > /work/src/pkg/mod.py",
        ),
        action(
            "replace-image-files",
            "rm /etc/issue.net && rm /etc/issue && echo replaced > /etc/issue \
             && rm -rf /usr/share/doc/apt && mkdir /usr/share/doc/apt && echo new > /usr/share/doc/apt/NEW",
        ),
        action(
            "metadata",
            "chown 1000:1000 /work/main.py && cp /bin/true /work/suid && chmod 4755 /work/suid \
             && setfattr -n user.belayer -v yes /work/main.py && ln /work/main.py /work/hard \
             && ln -s main.py /work/soft && mkfifo /work/fifo \
             && dd if=/dev/urandom of=/work/sparse bs=4096 count=1 seek=25600 status=none",
        ),
        Action {
            name: "start-holder",
            script: format!(
                "cd /work && (nohup python3 /work/holder.py {} > /dev/null 2>&1 &) \
                 && while [ ! -s /work/holder.ready ]; do sleep 0.05; done",
                u64::from(holder_mb) << 20
            ),
            stdin: None,
        },
        action(
            "start-counter",
            "(nohup sh /work/counter.sh > /dev/null 2>&1 &) && sleep 0.2",
        ),
    ]
}

/// Changes made after a checkpoint, which a restore must undo.
pub fn more_changes() -> Vec<Action> {
    vec![
        action(
            "later-edit",
            "echo changed > /work/main.py && rm -rf /work/src && touch /work/new-file",
        ),
        action(
            "later-pip",
            "pip uninstall -y -q --break-system-packages belayer-demo",
        ),
        action(
            "later-image",
            "rm -rf /usr/share/doc && echo again > /etc/issue",
        ),
    ]
}

static EXEC: AtomicU32 = AtomicU32::new(0);

/// A running sandbox container.
pub struct Sandbox<'a> {
    pub c: &'a Containerd,
    /// Its containerd id (for a docker container, docker's full id).
    pub id: String,
    /// The docker daemon that runs it (`DOCKER_HOST`), when docker is its client: its
    /// actions then go through `docker exec`.
    pub docker: Option<String>,
}

/// The sandbox image's name in a docker daemon ([`Sandbox::start_docker`]).
pub const DOCKER_SANDBOX: &str = "belayer/sandbox";

impl<'a> Sandbox<'a> {
    /// Imports the sandbox image (once per containerd) and starts `sleep infinity` in it.
    #[track_caller]
    pub fn start(c: &'a Containerd, runtime: &str, id: &str) -> Self {
        Self::start_annotated(c, runtime, id, &[])
    }

    /// [`Sandbox::start`] with OCI annotations (`key=value`).
    #[track_caller]
    pub fn start_annotated(
        c: &'a Containerd,
        runtime: &str,
        id: &str,
        annotations: &[&str],
    ) -> Self {
        let flags: Vec<&str> = annotations
            .iter()
            .flat_map(|a| ["--annotation", a])
            .collect();
        Self::start_with(c, runtime, id, &flags)
    }

    /// [`Sandbox::start`] with more `ctr run` flags.
    #[track_caller]
    pub fn start_with(c: &'a Containerd, runtime: &str, id: &str, flags: &[&str]) -> Self {
        if !c
            .ctr(&["images", "ls", "-q"])
            .stdout
            .lines()
            .any(|l| l == SANDBOX)
        {
            c.import(&prereq::image("sandbox.tar"));
        }
        let mut args = vec!["run", "-d", "--runtime", runtime];
        args.extend(flags);
        args.extend([SANDBOX, id, "sleep", "infinity"]);
        c.ctr(&args).ok();
        Self {
            c,
            id: id.to_string(),
            docker: None,
        }
    }

    /// Starts `sleep infinity` in the sandbox image as docker container `name` on `docker`
    /// (whose containers live in `c`'s namespace: [`Docker::start_in_namespace`]), with
    /// `--runtime`, OCI annotations and no network but its own loopback; imports the image into
    /// docker first if it lacks it.
    ///
    /// [`Docker::start_in_namespace`]: crate::docker::Docker::start_in_namespace
    #[track_caller]
    pub fn start_docker(
        c: &'a Containerd,
        docker: &crate::docker::Docker,
        runtime: &str,
        name: &str,
        annotations: &[&str],
    ) -> Self {
        if docker.docker(&["image", "inspect", DOCKER_SANDBOX]).code != 0 {
            let rootfs = prereq::image("sandbox.rootfs.tar");
            docker
                .docker(&[
                    "import",
                    "--change",
                    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    &rootfs.display().to_string(),
                    DOCKER_SANDBOX,
                ])
                .ok();
        }
        let mut args = vec!["run", "-d", "--runtime", runtime, "--network", "none"];
        args.extend(annotations.iter().flat_map(|a| ["--annotation", *a]));
        args.extend(["--name", name, DOCKER_SANDBOX, "sleep", "infinity"]);
        docker.docker(&args).ok();
        Self {
            c,
            id: docker.id(name),
            docker: Some(docker.host.clone()),
        }
    }

    /// Wraps an existing container (a fork, say).
    pub fn attach(c: &'a Containerd, id: &str) -> Self {
        Self {
            c,
            id: id.to_string(),
            docker: None,
        }
    }

    pub fn exec(&self, script: &str, stdin: Option<&[u8]>) -> Out {
        if let Some(host) = &self.docker {
            let mut cmd = std::process::Command::new("docker");
            cmd.env("DOCKER_HOST", host).arg("exec");
            if stdin.is_some() {
                cmd.arg("-i");
            }
            cmd.args([self.id.as_str(), "sh", "-c", script]);
            return crate::containerd::run(&mut cmd, stdin, Duration::from_secs(120));
        }
        let exec_id = format!("a{}", EXEC.fetch_add(1, Ordering::Relaxed));
        let args = [
            "tasks",
            "exec",
            "--exec-id",
            &exec_id,
            &self.id,
            "sh",
            "-c",
            script,
        ];
        match stdin {
            Some(data) => self.c.ctr_stdin(&args, data),
            None => self.c.ctr(&args),
        }
    }

    /// Runs actions in order, asserting each succeeds; returns each one's wall time.
    #[track_caller]
    pub fn run(&self, actions: &[Action]) -> Vec<(&'static str, Duration)> {
        actions
            .iter()
            .map(|a| {
                let start = Instant::now();
                let out = self.exec(&a.script, a.stdin.as_deref());
                assert_eq!(
                    out.code, 0,
                    "action {} failed in {}: {out:?}",
                    a.name, self.id
                );
                (a.name, start.elapsed())
            })
            .collect()
    }

    /// The filesystem tree, one line a node (see assets/tree.py).
    #[track_caller]
    pub fn tree(&self) -> Vec<String> {
        let out = self.exec("python3 /opt/belayer/tree.py", None);
        assert_eq!(out.code, 0, "tree of {}: {}", self.id, out.stderr);
        out.stdout.lines().map(str::to_string).collect()
    }

    /// The digest the background process reports for its memory now, and the one it had at
    /// start (written to /work/holder.ready).
    pub fn holder_digests(&self) -> (String, String) {
        let ask = "python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", 8765), timeout=30); print(s.recv(64).decode())'";
        let now = self.exec(ask, None);
        let start = self.exec("cat /work/holder.ready", None);
        (
            now.stdout.trim().to_string(),
            start.stdout.trim().to_string(),
        )
    }

    /// The counter file's numbers, its complete lines only: a `cat` beside the counter's append
    /// can see the part of a line written into one page before the rest (a write across a page
    /// boundary is copied page by page, the size growing with each; the chaos soak read
    /// "…, 78309, 7831"). A torn line the counter goes on after would still show, joined to the
    /// next number.
    pub fn counter(&self) -> Vec<u64> {
        complete_lines(&self.exec("cat /work/counter", None).stdout)
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// The lines of `text` that end in a newline (a last one being written is left out).
fn complete_lines(text: &str) -> impl Iterator<Item = &str> {
    let end = text.rfind('\n').map_or(0, |i| i + 1);
    text[..end].lines()
}

/// Whether `numbers` is exactly 1..=N (N ≥ 1).
pub fn is_contiguous(numbers: &[u64]) -> bool {
    !numbers.is_empty() && numbers.iter().enumerate().all(|(i, &n)| n == i as u64 + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_being_written_is_not_read() {
        let lines = |t| complete_lines(t).collect::<Vec<_>>();
        assert_eq!(lines("1\n2\n78"), ["1", "2"]);
        assert_eq!(lines("1\n2\n"), ["1", "2"]);
        assert!(lines("7").is_empty());
        // A torn line the writer went on after stays visible.
        assert_eq!(lines("1\n2\n34\n"), ["1", "2", "34"]);
    }
}
