//! A private containerd for one test: its own root, state, socket and namespace, with the shim
//! under test first on its PATH. Dropping it kills what it ran and removes what it left.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::prereq;

/// Which containerd the test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// The installed containerd 2.x (`/usr/bin/containerd`).
    V2,
    /// containerd 1.7 unpacked beside it by scripts/setup.
    V1_7,
}

const V1_7_DIR: &str = "/opt/belayer/containerd-1.7/usr/bin";

/// What a command printed and how it exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    #[track_caller]
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "command failed: {self:?}");
        self
    }
}

/// How long a containerd may take to serve its API after it started.
const UP_LIMIT: Duration = Duration::from_secs(60);

/// The goroutine stack dump a containerd log holds after SIGUSR1: logrus writes it as one
/// quoted message, `=== BEGIN goroutine stack dump ===\n…\n=== END goroutine stack dump ===`.
fn stack_dump(log: &str) -> Option<String> {
    let (_, body) = log.split_once("=== BEGIN goroutine stack dump ===")?;
    let (body, _) = body.split_once("=== END goroutine stack dump ===")?;
    Some(
        body.replace("\\n", "\n")
            .replace("\\t", "\t")
            .replace("\\\"", "\"")
            .trim()
            .to_string(),
    )
}

/// Runs `cmd` with an optional stdin, under a time limit so a hung command fails the test.
pub fn run(cmd: &mut Command, stdin: Option<&[u8]>, limit: Duration) -> Out {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    if let Some(data) = stdin {
        let mut w = child.stdin.take().expect("stdin");
        let _ = w.write_all(data);
    }
    let pid = child.id();
    // The watchdog wakes as soon as the command is done (the sender is dropped), so a command's
    // wall time is its own: benchmarks time commands through here.
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        match finished.recv_timeout(limit) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                // SAFETY: kill(2) on a pid we spawned and have not reaped yet.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                true
            }
            _ => false,
        }
    });
    let out = child.wait_with_output().expect("wait");
    drop(done);
    let timed_out = watchdog.join().unwrap_or(false);
    assert!(!timed_out, "command timed out after {limit:?}: {cmd:?}");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

static SEQ: AtomicU32 = AtomicU32::new(0);

pub struct Containerd {
    pub flavor: Flavor,
    pub dir: PathBuf,
    pub sock: PathBuf,
    pub ns: String,
    /// The Belayer checkpoint store its shims use (`$BELAYER_STORE`).
    pub store: PathBuf,
    /// The Belayer config its shims read (`$BELAYER_CONFIG`), if not the machine's.
    pub belayer_config: Option<PathBuf>,
    /// containerd (and so its shims, runc and CRIU) runs in a mount namespace of its own whose
    /// `/sys/fs/cgroup` is the cgroup2 hierarchy: see [`Containerd::start_unified`].
    pub unified: bool,
    bin_dir: PathBuf,
    child: Option<Child>,
}

impl Containerd {
    /// Starts a containerd of `flavor` and imports the busybox image.
    #[track_caller]
    pub fn start(flavor: Flavor) -> Self {
        Self::start_with_store(flavor, None)
    }

    /// Like [`Containerd::start`], with Belayer's store at `store` (default: inside the test dir).
    #[track_caller]
    pub fn start_with_store(flavor: Flavor, store: Option<PathBuf>) -> Self {
        Self::start_configured(flavor, store, None)
    }

    /// Like [`Containerd::start_with_store`], with the Belayer config file `belayer_config`
    /// (`config.toml` format) for its shims: the machine-wide defaults a user sets in
    /// `/etc/belayer/config.toml`.
    #[track_caller]
    pub fn start_configured(
        flavor: Flavor,
        store: Option<PathBuf>,
        belayer_config: Option<PathBuf>,
    ) -> Self {
        Self::start_inner(flavor, store, belayer_config, None, false)
    }

    /// A containerd 2.x with its CRI plugin, Belayer registered as runtime handler `belayer` by
    /// the shipped `configs/containerd/config-2.x.toml`, `belayer.local/pause` as the sandbox
    /// image and no CNI (pods use the host's network). Works in CRI's namespace `k8s.io`, into
    /// which busybox and the pause image are imported.
    #[track_caller]
    pub fn start_cri() -> Self {
        Self::start_cri_configured(None)
    }

    /// [`Containerd::start_cri`] with the Belayer config file `belayer_config` for its shims
    /// (see [`Containerd::start_configured`]).
    #[track_caller]
    pub fn start_cri_configured(belayer_config: Option<PathBuf>) -> Self {
        let shipped =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/containerd/config-2.x.toml");
        let entries =
            std::fs::read_to_string(&shipped).expect("read the shipped containerd config");
        let c = Self::start_inner(Flavor::V2, None, belayer_config, Some(entries), false);
        c.import(&prereq::image("pause.tar"));
        c
    }

    /// A containerd 2.x that sees a cgroup v2 (unified) host whatever the host boots: it runs in
    /// a mount namespace of its own with the kernel's cgroup2 hierarchy mounted on
    /// `/sys/fs/cgroup`, so its shims, runc and CRIU take their v2 paths. On a host that boots
    /// cgroup v1 every controller stays bound to its v1 hierarchy and the v2 one has none
    /// (containers must then come without resource settings); on a v2 host it is the host's own
    /// hierarchy, controllers and all. Its mounts are in that namespace:
    /// [`Containerd::mounts_under_dir`] reads them, and [`Containerd::cgroup_v2_dir`] finds a
    /// cgroup in the hierarchy it sees.
    #[track_caller]
    pub fn start_unified() -> Self {
        let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
        if !filesystems.lines().any(|l| l.ends_with("\tcgroup2")) {
            prereq::missing("cgroup2 in /proc/filesystems", "a kernel with cgroup v2");
        }
        Self::start_inner(Flavor::V2, None, None, None, true)
    }

    #[track_caller]
    fn start_inner(
        flavor: Flavor,
        store: Option<PathBuf>,
        belayer_config: Option<PathBuf>,
        cri_entries: Option<String>,
        unified: bool,
    ) -> Self {
        let bin_dir = prereq::bin_dir();
        prereq::require_bin("runc");
        match flavor {
            Flavor::V2 => drop(prereq::require_bin("containerd")),
            Flavor::V1_7 => {
                if !Path::new(V1_7_DIR).join("containerd").is_file() {
                    prereq::missing(
                        &format!("{V1_7_DIR}/containerd (containerd 1.7)"),
                        "run scripts/setup",
                    );
                }
            }
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(format!("/tmp/belayer-it-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create test dir");
        let sock = dir.join("containerd.sock");
        let version = if flavor == Flavor::V2 { 3 } else { 2 };
        let disabled = if cri_entries.is_none() {
            "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n"
        } else {
            ""
        };
        let plugins = match &cri_entries {
            None => String::new(),
            Some(entries) => {
                let entries: String = entries
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("version"))
                    .map(|l| format!("{l}\n"))
                    .collect();
                format!(
                    // The pod sandbox gets oom_score_adj -998, and lowering one needs
                    // CAP_SYS_RESOURCE, which these machines' root lacks (runc: "failed to
                    // update /proc/self/oom_score_adj: Permission denied").
                    "[plugins.'io.containerd.cri.v1.runtime']\n  restrict_oom_score_adj = true\n\
                     [plugins.'io.containerd.cri.v1.images'.pinned_images]\n  \
                     sandbox = \"belayer.local/pause:latest\"\n\
                     [plugins.'io.containerd.cri.v1.runtime'.cni]\n  \
                     bin_dirs = [\"{d}/cni/bin\"]\n  conf_dir = \"{d}/cni/conf\"\n{entries}",
                    d = dir.display()
                )
            }
        };
        // Each daemon gets its own NRI socket: containerd 2 starts NRI with its CRI service on
        // the host-wide /var/run/nri/nri.sock by default, whose listener removes, then binds, the
        // path; two test daemons starting together race there, and the loser dies at start
        // ("failed to set up NRI for CRI service: … bind: address already in use").
        let config = format!(
            "version = {version}\nroot = \"{d}/root\"\nstate = \"{d}/state\"\n{disabled}\
             [grpc]\n  address = \"{s}\"\n[ttrpc]\n  address = \"{s}.ttrpc\"\n\
             [plugins.'io.containerd.nri.v1.nri']\n  socket_path = \"{d}/nri.sock\"\n{plugins}",
            d = dir.display(),
            s = sock.display()
        );
        std::fs::write(dir.join("config.toml"), config).expect("write config");
        let mut c = Self {
            flavor,
            ns: if cri_entries.is_some() {
                "k8s.io".to_string()
            } else {
                format!("bt{}x{n}", std::process::id())
            },
            store: store.unwrap_or_else(|| dir.join("store")),
            belayer_config,
            unified,
            dir,
            sock,
            bin_dir,
            child: None,
        };
        c.spawn();
        c.import(&prereq::image("busybox.tar"));
        c
    }

    fn path_env(&self) -> String {
        let mut parts = vec![self.bin_dir.display().to_string()];
        if self.flavor == Flavor::V1_7 {
            parts.push(V1_7_DIR.to_string());
        }
        parts.push(std::env::var("PATH").unwrap_or_default());
        parts.join(":")
    }

    fn binary(&self, name: &str) -> PathBuf {
        match self.flavor {
            Flavor::V2 => PathBuf::from(name),
            Flavor::V1_7 => Path::new(V1_7_DIR).join(name),
        }
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.log_path()).expect("log");
        let mut cmd = Command::new(self.binary("containerd"));
        if let Some(config) = &self.belayer_config {
            cmd.env("BELAYER_CONFIG", config);
        }
        // containerd's temporary files (a checkpoint image it unpacks for a restore, which it
        // never removes) stay in the test's directory, where a test can look for them.
        let tmp = self.tmp_dir();
        std::fs::create_dir_all(&tmp).expect("create containerd's TMPDIR");
        if self.unified {
            // SAFETY: between fork and exec the child makes only raw syscalls (unshare, mount)
            // on static strings, all async-signal-safe, and touches nothing of the parent's.
            unsafe {
                cmd.pre_exec(|| {
                    let fail = || Err(std::io::Error::last_os_error());
                    if libc::unshare(libc::CLONE_NEWNS) != 0 {
                        return fail();
                    }
                    // Nothing mounted in here reaches the host's namespace.
                    let flags = libc::MS_REC | libc::MS_PRIVATE;
                    if libc::mount(
                        c"none".as_ptr(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        flags,
                        std::ptr::null(),
                    ) != 0
                    {
                        return fail();
                    }
                    let cgroup2 = c"cgroup2".as_ptr();
                    if libc::mount(
                        cgroup2,
                        c"/sys/fs/cgroup".as_ptr(),
                        cgroup2,
                        0,
                        std::ptr::null(),
                    ) != 0
                    {
                        return fail();
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .env("TMPDIR", &tmp)
            .env_remove("XDG_RUNTIME_DIR")
            .env("PATH", self.path_env())
            .env("BELAYER_STORE", &self.store)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        self.child = Some(child);
        let start = Instant::now();
        loop {
            let probe = run(
                &mut self.ctr_cmd(&["version"]),
                None,
                Duration::from_secs(20),
            );
            if probe.code == 0 {
                break;
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                panic!(
                    "containerd exited at start ({status}); the last lines of its log ({}):\n{}",
                    self.log_path().display(),
                    self.log_lines("", 25),
                );
            }
            if start.elapsed() > UP_LIMIT {
                // It comes up in a fraction of a second; this long, something in its plugins'
                // start waits. Its own stack dump says where (read after the log's tail, which
                // would otherwise end in the dump's one long line).
                let tail = self.log_lines("", 25);
                panic!(
                    "containerd did not come up in {UP_LIMIT:?} (`ctr version`: {}); where its \
                     start waits:\n{}\nthe last lines of its log ({}):\n{tail}",
                    probe.stderr.trim(),
                    self.waiting_goroutines(),
                    self.log_path().display(),
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The goroutines of a containerd whose start hangs that wait in its plugins' start (those
    /// whose stack names `server.New` or a plugin's init), from the stack dump it logs on
    /// SIGUSR1; all of the dump's first goroutines if none does.
    fn waiting_goroutines(&self) -> String {
        let Some(child) = &self.child else {
            return "(no containerd)".into();
        };
        if let Err(e) = crate::signal(child.id().into(), libc::SIGUSR1) {
            return format!("(SIGUSR1: {e})");
        }
        let log_path = self.log_path();
        let start = Instant::now();
        let dump = loop {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(dump) = stack_dump(&log) {
                break dump;
            }
            if start.elapsed() > Duration::from_secs(3) {
                return "(no stack dump in its log after SIGUSR1)".into();
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let goroutines: Vec<&str> = dump.split("\n\n").collect();
        let waiting: Vec<&str> = goroutines
            .iter()
            .copied()
            .filter(|g| g.contains("server.New(") || g.contains("InitFn") || g.contains(".Init("))
            .collect();
        if waiting.is_empty() {
            goroutines[..goroutines.len().min(4)].join("\n\n")
        } else {
            waiting.join("\n\n")
        }
    }

    /// This containerd's log (its shims log there too).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// The lines of containerd's log (its shims' logs among them) that mention `needle`, the
    /// last `n` of them: what a failing test shows of what the daemons said about a container.
    pub fn log_lines(&self, needle: &str, n: usize) -> String {
        let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(needle)).collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// containerd's `$TMPDIR` (its shims inherit it).
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// Container `id`'s checkpoints in the Belayer store: `<store>/checkpoints/<ns>/<id>`.
    pub fn checkpoints_dir(&self, id: &str) -> PathBuf {
        self.store.join("checkpoints").join(&self.ns).join(id)
    }

    /// containerd's work dir of task `id` (the bundle's `work`), where the shim keeps CRIU's
    /// scratch of its restores (`restore-<checkpoint>/restore.log`, the lazy-pages daemon's files).
    pub fn task_work_dir(&self, id: &str) -> PathBuf {
        self.dir
            .join("root/io.containerd.runtime.v2.task")
            .join(&self.ns)
            .join(id)
    }

    /// containerd's content store (`blobs/sha256/…`), e.g. for a [`crate::registry::Registry`].
    pub fn content_dir(&self) -> PathBuf {
        self.dir.join("root/io.containerd.content.v1.content")
    }

    /// Mount points at or below the test dir in containerd's mount namespace (the host's,
    /// unless [`Containerd::unified`]).
    pub fn mounts_under_dir(&self) -> Vec<String> {
        crate::leaks::mounts_under_in(&format!("/proc/{}/mountinfo", self.pid()), &self.dir)
    }

    /// The directory of `pid`'s cgroup in the cgroup2 hierarchy as containerd sees it (under
    /// [`Containerd::cgroup_root`]), from the `0::` line of `/proc/<pid>/cgroup`.
    pub fn cgroup_v2_dir(&self, pid: u32) -> Option<PathBuf> {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
        Some(self.cgroup_root().join(path.trim_start_matches('/')))
    }

    /// containerd's `/sys/fs/cgroup`, reached through `/proc/<containerd>/root` (which resolves
    /// in its mount namespace): the cgroup2 hierarchy's root when [`Containerd::unified`].
    pub fn cgroup_root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root/sys/fs/cgroup", self.pid()))
    }

    /// containerd's pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Stops containerd (SIGTERM) and starts it again on the same root, state and socket.
    pub fn restart(&mut self) {
        self.stop_daemon();
        self.spawn();
    }

    fn stop_daemon(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let start = Instant::now();
            while child.try_wait().ok().flatten().is_none() {
                if start.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// A `ctr` command against this containerd, in its namespace.
    pub fn ctr_cmd(&self, args: &[&str]) -> Command {
        self.ctr_cmd_in(&self.ns, args)
    }

    /// A `ctr` command against this containerd, in namespace `ns` (docker's is `moby`).
    pub fn ctr_cmd_in(&self, ns: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.binary("ctr"));
        cmd.arg("-a").arg(&self.sock).arg("-n").arg(ns).args(args);
        cmd.env("PATH", self.path_env());
        cmd
    }

    pub fn ctr(&self, args: &[&str]) -> Out {
        run(&mut self.ctr_cmd(args), None, Duration::from_secs(120))
    }

    /// [`Containerd::ctr`] in namespace `ns` (docker's is `moby`).
    pub fn ctr_in(&self, ns: &str, args: &[&str]) -> Out {
        run(
            &mut self.ctr_cmd_in(ns, args),
            None,
            Duration::from_secs(120),
        )
    }

    /// `sh -c SCRIPT` in container `id`'s task, as exec `exec_id`.
    pub fn sh(&self, id: &str, exec_id: &str, script: &str) -> Out {
        self.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            exec_id,
            id,
            "sh",
            "-c",
            script,
        ])
    }

    pub fn ctr_stdin(&self, args: &[&str], input: &[u8]) -> Out {
        run(
            &mut self.ctr_cmd(args),
            Some(input),
            Duration::from_secs(120),
        )
    }

    /// Runs `ctr` under a pseudo-terminal (`script`), for `-t`.
    pub fn ctr_tty(&self, args: &[&str]) -> Out {
        let mut line = vec![self.binary("ctr").display().to_string()];
        line.extend([
            "-a".into(),
            self.sock.display().to_string(),
            "-n".into(),
            self.ns.clone(),
        ]);
        line.extend(args.iter().map(|a| format!("'{a}'")));
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &line.join(" "), "/dev/null"])
            .env("PATH", self.path_env());
        run(&mut cmd, None, Duration::from_secs(120))
    }

    /// A `belayer` CLI command against this containerd, in its namespace, with its store.
    pub fn belayer_cmd(&self, args: &[&str]) -> Command {
        self.belayer_cmd_in(&self.ns, args)
    }

    /// [`Containerd::belayer_cmd`] in namespace `ns` (docker's is `moby`).
    pub fn belayer_cmd_in(&self, ns: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("belayer"));
        cmd.arg("--address")
            .arg(&self.sock)
            .arg("--namespace")
            .arg(ns)
            .args(args);
        cmd.env("BELAYER_STORE", &self.store);
        cmd
    }

    pub fn belayer(&self, args: &[&str]) -> Out {
        run(&mut self.belayer_cmd(args), None, Duration::from_secs(300))
    }

    /// [`Containerd::belayer`] with `$DOCKER_CONFIG` at `docker_config`: where `belayer push`
    /// and `pull` read a registry's credentials.
    pub fn belayer_docker(&self, docker_config: &Path, args: &[&str]) -> Out {
        let mut cmd = self.belayer_cmd(args);
        cmd.env("DOCKER_CONFIG", docker_config);
        run(&mut cmd, None, Duration::from_secs(300))
    }

    #[track_caller]
    pub fn import(&self, archive: &Path) {
        self.ctr(&["images", "import", &archive.display().to_string()])
            .ok();
    }

    /// Pids of shims this containerd started (any runtime).
    pub fn shim_pids(&self) -> Vec<u32> {
        crate::leaks::pids_with_args(&["-address", &self.sock.display().to_string()])
    }

    /// Kills and deletes every task and container in the namespace.
    pub fn reset(&self) {
        for line in self.ctr(&["tasks", "ls", "-q"]).stdout.lines() {
            let _ = self.ctr(&["tasks", "kill", "-s", "9", line]);
        }
        std::thread::sleep(Duration::from_millis(200));
        for line in self.ctr(&["tasks", "ls", "-q"]).stdout.lines() {
            let _ = self.ctr(&["tasks", "rm", "-f", line]);
        }
        for line in self.ctr(&["containers", "ls", "-q"]).stdout.lines() {
            let _ = self.ctr(&["containers", "rm", line]);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.reset();
        }
        self.stop_daemon();
        for pid in self.shim_pids() {
            // A leftover shim of this test's containerd.
            let _ = crate::sigkill(pid.into());
        }
        crate::leaks::unmount_under(&self.dir);
        if self.ns != "k8s.io" {
            crate::leaks::remove_namespace_cgroups(&self.ns);
        }
        // BELAYER_KEEP_TEST_DIR=1 keeps logs and state for a post-mortem.
        if std::env::var_os("BELAYER_KEEP_TEST_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Containerd {
    /// `ctr tasks ls`'s columns after the id for task `id` (pid, status); empty when it is not
    /// listed.
    pub fn task_row(&self, id: &str) -> Vec<String> {
        self.task_row_in(&self.ns, id)
    }

    /// [`Containerd::task_row`] in namespace `ns` (docker's is `moby`).
    pub fn task_row_in(&self, ns: &str, id: &str) -> Vec<String> {
        self.ctr_in(ns, &["tasks", "ls"])
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect()
    }
}

impl Containerd {
    /// Pids of shims still running for namespace `ns` of this containerd.
    pub fn ns_shims_of(&self, ns: &str) -> Vec<u32> {
        let of_ns = crate::leaks::pids_with_args(&["-namespace", ns]);
        self.shim_pids()
            .into_iter()
            .filter(|p| of_ns.contains(p))
            .collect()
    }

    /// The pid of the shim serving container `id` in this containerd's namespace, if exactly
    /// one does.
    pub fn shim_of(&self, id: &str) -> Option<u32> {
        let of_id = crate::leaks::pids_with_args(&["-id", id]);
        match self
            .ns_shims_of(&self.ns)
            .into_iter()
            .filter(|p| of_id.contains(p))
            .collect::<Vec<_>>()[..]
        {
            [pid] => Some(pid),
            _ => None,
        }
    }
}

impl Containerd {
    /// SIGKILLs containerd process `pid` (this handle's own, [`Containerd::pid`], or one that
    /// [`Containerd::spawn_again`] started) and waits for it to end: a crash, where
    /// [`Containerd::restart`] stops it cleanly. Its shims and their containers stay.
    pub fn kill_daemon(&self, pid: u32) {
        let _ = crate::sigkill(pid.into());
        let start = Instant::now();
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
            && start.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts containerd again on this handle's config, root, state and socket — for a caller
    /// that shares the handle (`&self`) and so cannot [`Containerd::restart`] it — and waits
    /// until it answers. The process is the caller's to stop (SIGTERM, then wait) before the
    /// handle is dropped; [`Containerd::pid`] still names the first one. Not for a
    /// [`Containerd::unified`] one (its mount namespace is the first process's).
    pub fn spawn_again(&self) -> std::io::Result<Child> {
        if self.unified {
            return Err(std::io::Error::other(
                "a unified containerd cannot be started again beside its handle",
            ));
        }
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.log_path())?;
        let mut cmd = Command::new(self.binary("containerd"));
        if let Some(config) = &self.belayer_config {
            cmd.env("BELAYER_CONFIG", config);
        }
        let mut child = cmd
            .arg("--config")
            .arg(self.dir.join("config.toml"))
            .env("TMPDIR", self.tmp_dir())
            .env_remove("XDG_RUNTIME_DIR")
            .env("PATH", self.path_env())
            .env("BELAYER_STORE", &self.store)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let start = Instant::now();
        loop {
            let probe = run(
                &mut self.ctr_cmd(&["version"]),
                None,
                Duration::from_secs(20),
            );
            if probe.code == 0 {
                return Ok(child);
            }
            if let Some(status) = child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "containerd exited at start ({status}): {}",
                    self.log_lines("", 10)
                )));
            }
            if start.elapsed() > UP_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other(format!(
                    "containerd did not come up in {UP_LIMIT:?}: {}",
                    probe.stderr.trim()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::stack_dump;

    #[test]
    fn a_logged_stack_dump_is_unquoted() {
        let log = "time=\"t\" level=info msg=\"loading plugin\"\n\
                   time=\"t\" level=info msg=\"=== BEGIN goroutine stack dump ===\\ngoroutine 1 \
                   [syscall]:\\nos/exec.(*Cmd).Wait(...)\\n\\tos/exec/exec.go:1 +0x1\\n\\n\
                   goroutine 7 [select]:\\nmain.f(\\\"x\\\")\\n=== END goroutine stack dump ===\"\n";
        assert_eq!(
            stack_dump(log).as_deref(),
            Some(
                "goroutine 1 [syscall]:\nos/exec.(*Cmd).Wait(...)\n\tos/exec/exec.go:1 +0x1\n\n\
                 goroutine 7 [select]:\nmain.f(\"x\")"
            )
        );
        assert_eq!(stack_dump("time=\"t\" msg=\"serving...\"\n"), None);
    }
}
