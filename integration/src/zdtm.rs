//! CRIU's ZDTM static tests as the acceptance test of process state: each test runs as a daemon
//! under a container's init, the container is checkpointed and restored (in place, as a fork,
//! automatically after a crash; containerd's own checkpoint/restore as the baseline), and the
//! test then checks its own state on SIGTERM and writes PASS or FAIL.
//!
//! The tests are built by `scripts/setup` in CRIU's source (`/var/cache/belayer/criu-4.2.1`,
//! `$BELAYER_CRIU_SRC`); their directory is bind-mounted read-only at `/zdtm` of a container of the
//! Debian sandbox image, and each test runs in a scratch directory of the container's own
//! writable layer (so a checkpoint carries it and a fork gets its own), started the way CRIU's
//! `zdtm.py` starts it: the command line of `make <test>.pid`, as uid 18943 unless its `.desc`
//! says `suid` (and the machine lets CRIU dump another uid: [`as_zdtm_uid`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::containerd::{Containerd, Out, run};
use crate::episode::SANDBOX;
use crate::prereq;

/// Belayer's runtime.
pub const BELAYER: &str = "io.containerd.belayer.v1";
/// containerd's runc shim: the baseline.
pub const RUNC: &str = "io.containerd.runc.v2";

/// Where the tests' directory is mounted in a container.
const MOUNT: &str = "/zdtm";
/// The scratch directory a test runs in (the container's writable layer).
const SCRATCH: &str = "/zdtm-run";
/// How long a test may take to check its state and exit after SIGTERM.
const STOP_LIMIT_S: u32 = 20;

/// The CRIU source tree `scripts/setup` keeps.
pub fn criu_src() -> PathBuf {
    std::env::var_os("BELAYER_CRIU_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/belayer/criu-4.2.1"))
}

/// One ZDTM static test.
#[derive(Clone, Debug)]
pub struct Test {
    pub name: String,
    /// Its start command as `make <name>.pid` runs it, relative to the static directory.
    pub start: String,
    /// `.desc` flags (`suid`, `crfail`, `noauto`, …).
    pub flags: Vec<String>,
    /// `.desc` CRIU options the test asks for (`opts`, `dopts`, `ropts`): the harness hands
    /// them to CRIU as a user would, in a CRIU configuration file the container's
    /// `org.criu.config` annotation names (runc reads it; Belayer adds its own options to it).
    pub criu_opts: String,
}

impl Test {
    fn flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }

    /// CRIU's own harness expects the dump of this test to fail (`crfail`): the checkpoint is
    /// to be refused, and the test, still running, to pass its own check.
    fn dump_fails(&self) -> bool {
        self.flag("crfail")
    }
}

/// `criu_opts` (`--ghost-limit 8M --no-ghost-fiemap`) as a CRIU configuration file: one option
/// a line, without its dashes, its value after a space (`ghost-limit 8M`); `--opt=value` too.
pub fn criu_config(criu_opts: &str) -> String {
    let mut lines: Vec<String> = Vec::new();
    for word in criu_opts.split_whitespace() {
        match word.strip_prefix("--") {
            Some(opt) => lines.push(opt.replacen('=', " ", 1)),
            None => match lines.last_mut() {
                Some(line) => {
                    line.push(' ');
                    line.push_str(word);
                }
                None => lines.push(word.to_string()),
            },
        }
    }
    lines.iter().map(|l| format!("{l}\n")).collect()
}

/// Whether tests run as `zdtm.py` runs them, as uid 18943 unless `suid`: only where this
/// process holds `CAP_SYS_RESOURCE`. Without it (a machine that is itself a container without
/// it, such as these) CRIU cannot read another uid's rlimits ("Can't get rlimit 0: Operation not
/// permitted"), under containerd's runc as under Belayer, and every test runs as root.
pub fn as_zdtm_uid() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Why a built test is not tried.
#[derive(Clone, Debug)]
pub struct NotTried {
    pub name: String,
    pub why: String,
}

/// The built static tests: those tried and those left out, with why.
pub struct Suite {
    /// `<criu_src>/test/zdtm`, mounted at `/zdtm`.
    pub zdtm_dir: PathBuf,
    pub tests: Vec<Test>,
    pub not_tried: Vec<NotTried>,
}

/// A `.desc` file's string value for `key` (they are Python dict literals).
fn desc_value(desc: &str, key: &str) -> Option<String> {
    let (_, rest) = desc.split_once(&format!("'{key}'"))?;
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('\'')?;
    rest.split_once('\'').map(|(v, _)| v.to_string())
}

impl Suite {
    /// Loads the tests `scripts/setup` built, or fails the caller naming what is missing.
    #[track_caller]
    pub fn load() -> Self {
        match Self::try_load() {
            Ok(s) => s,
            Err(e) => prereq::missing(&e, "run scripts/setup (it builds CRIU's ZDTM tests)"),
        }
    }

    /// [`Suite::load`] as a `Result`.
    pub fn try_load() -> Result<Self, String> {
        let zdtm_dir = criu_src().join("test/zdtm");
        let static_dir = zdtm_dir.join("static");
        let stamp = static_dir.join(".belayer-built");
        let built =
            std::fs::read_to_string(&stamp).map_err(|e| format!("{} ({e})", stamp.display()))?;
        let names: Vec<String> = built
            .lines()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        let starts = start_commands(&static_dir, &names)?;
        let mut features: HashMap<String, bool> = HashMap::new();
        let mut tests = Vec::new();
        let mut not_tried = Vec::new();
        for name in names {
            let desc = std::fs::read_to_string(static_dir.join(format!("{name}.desc")))
                .unwrap_or_default();
            let flags: Vec<String> = desc_value(&desc, "flags")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect();
            let flavor = desc_value(&desc, "flavor").unwrap_or_else(|| "h ns uns".into());
            let feature = desc_value(&desc, "feature").unwrap_or_default();
            let skip = |why: String| NotTried {
                name: name.clone(),
                why,
            };
            let Some(start) = starts.get(&name) else {
                not_tried.push(skip("no `make <test>.pid` rule".into()));
                continue;
            };
            if flags.iter().any(|f| f == "noauto") {
                not_tried.push(skip("noauto (zdtm.py runs it only by name)".into()));
                continue;
            }
            if !flavor.split_whitespace().any(|f| f == "ns") {
                not_tried.push(skip(format!("not for zdtm.py's ns flavour ({flavor})")));
                continue;
            }
            let missing: Vec<&str> = feature
                .split_whitespace()
                .filter(|f| {
                    !*features
                        .entry(f.to_string())
                        .or_insert_with(|| criu_has_feature(f))
                })
                .collect();
            if !missing.is_empty() {
                not_tried.push(skip(format!(
                    "`criu check --feature` fails: {}",
                    missing.join(" ")
                )));
                continue;
            }
            let criu_opts = ["opts", "dopts", "ropts"]
                .iter()
                .filter_map(|k| desc_value(&desc, k))
                .filter(|v| !v.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            tests.push(Test {
                name: name.clone(),
                start: start.clone(),
                flags,
                criu_opts,
            });
        }
        Ok(Self {
            zdtm_dir,
            tests,
            not_tried,
        })
    }

    /// The test called `name`, or fails the caller.
    #[track_caller]
    pub fn test(&self, name: &str) -> &Test {
        self.tests
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| {
                let why = self
                    .not_tried
                    .iter()
                    .find(|n| n.name == name)
                    .map(|n| n.why.clone())
                    .unwrap_or_else(|| "not built".into());
                panic!("ZDTM test {name} is not available here: {why}")
            })
    }
}

/// Whether this machine's CRIU has `feature` (as `zdtm.py` checks a `.desc`'s `feature`).
fn criu_has_feature(feature: &str) -> bool {
    Command::new("criu")
        .args(["check", "--feature", feature])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The command line `make <test>.pid` runs for each test, by test name.
fn start_commands(static_dir: &Path, names: &[String]) -> Result<HashMap<String, String>, String> {
    let out = Command::new("make")
        .arg("-n")
        .arg("-k")
        .arg("-C")
        .arg(static_dir)
        .args(names.iter().map(|n| format!("{n}.pid")))
        .output()
        .map_err(|e| format!("make -n in {} ({e})", static_dir.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut starts = HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("./") else {
            continue;
        };
        let Some((bin, _)) = rest.split_once(' ') else {
            continue;
        };
        if line.contains(&format!("--pidfile={bin}.pid")) {
            starts.insert(bin.to_string(), line.to_string());
        }
    }
    if starts.is_empty() {
        return Err(format!(
            "start commands of the ZDTM tests (`make -n <test>.pid` in {} printed none)",
            static_dir.display()
        ));
    }
    Ok(starts)
}

/// How a test was checkpointed and restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Mode {
    /// A plain Belayer container, no checkpoint: whether the test passes at all here.
    Control,
    /// `belayer checkpoint`, SIGKILL of the init, `belayer restore` in place.
    Restore,
    /// `belayer fork` of that checkpoint; the test checked in the fork.
    Fork,
    /// Automatic checkpoints and recovery (`io.belayer.checkpoint=auto`,
    /// `io.belayer.recover=auto`): an automatic checkpoint, a SIGKILL of the init, the recovery.
    Auto,
    /// containerd's own under runc: `ctr c checkpoint --rw --task`, SIGKILL,
    /// `ctr c restore --rw --live` into a new container.
    Containerd,
}

impl Mode {
    pub const ALL: [Mode; 5] = [
        Mode::Control,
        Mode::Restore,
        Mode::Fork,
        Mode::Auto,
        Mode::Containerd,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Control => "control",
            Mode::Restore => "restore",
            Mode::Fork => "fork",
            Mode::Auto => "auto",
            Mode::Containerd => "containerd",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// What a test said in one mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    /// The step that failed and why (the test's last words, or the tool's error).
    Fail(String),
}

impl Outcome {
    pub fn passed(&self) -> bool {
        *self == Outcome::Pass
    }
}

/// One test's outcomes, by mode (a mode not run is absent: all but control when control failed).
#[derive(Clone, Debug)]
pub struct Report {
    pub test: String,
    pub outcomes: BTreeMap<Mode, Outcome>,
    pub secs: f64,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// Runs ZDTM tests against one containerd.
pub struct Harness<'a> {
    c: &'a Containerd,
    zdtm_dir: PathBuf,
}

/// A container removed (task killed, container deleted) when dropped.
struct Ctr<'a> {
    c: &'a Containerd,
    id: String,
}

impl Drop for Ctr<'_> {
    fn drop(&mut self) {
        let _ = self.c.ctr(&["tasks", "kill", "-s", "9", &self.id]);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.c.ctr(&["tasks", "rm", "-f", &self.id]).code == 0
                || !self
                    .c
                    .ctr(&["tasks", "ls", "-q"])
                    .stdout
                    .lines()
                    .any(|l| l == self.id)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.c.ctr(&["containers", "rm", &self.id]);
    }
}

/// [`run`] under `limit`, a command that runs past it killed and answered as exit 124 (a test
/// whose start never returns, say), not a panic that would end the whole run.
fn limited(cmd: &mut Command, limit: Duration) -> Out {
    let shown = format!("{:?}", cmd.get_args().collect::<Vec<_>>());
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cmd, None, limit))).unwrap_or_else(
        |_| Out {
            code: 124,
            stdout: String::new(),
            stderr: format!("timed out after {limit:?}: {shown}"),
        },
    )
}

fn last_words(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

fn one_line(out: &Out) -> String {
    let text = if out.stderr.trim().is_empty() {
        &out.stdout
    } else {
        &out.stderr
    };
    last_words(text)
}

impl<'a> Harness<'a> {
    /// A harness over `c`, importing the sandbox image into it if needed.
    #[track_caller]
    pub fn new(c: &'a Containerd, suite: &Suite) -> Self {
        if !c
            .ctr(&["images", "ls", "-q"])
            .stdout
            .lines()
            .any(|l| l == SANDBOX)
        {
            c.import(&prereq::image("sandbox.tar"));
        }
        Self {
            c,
            zdtm_dir: suite.zdtm_dir.clone(),
        }
    }

    fn ctr(&self, args: &[&str]) -> Out {
        limited(&mut self.c.ctr_cmd(args), Duration::from_secs(120))
    }

    fn belayer(&self, args: &[&str]) -> Out {
        limited(&mut self.c.belayer_cmd(args), Duration::from_secs(120))
    }

    fn exec(&self, id: &str, script: &str) -> Out {
        let exec_id = format!("z{}", SEQ.fetch_add(1, Ordering::Relaxed));
        let args = [
            "tasks",
            "exec",
            "--exec-id",
            &exec_id,
            id,
            "sh",
            "-c",
            script,
        ];
        // Past the stop script's own wait for the test's verdict.
        let limit = Duration::from_secs(u64::from(STOP_LIMIT_S) + 25);
        limited(&mut self.c.ctr_cmd(&args), limit)
    }

    fn task_status(&self, id: &str) -> (String, String) {
        let out = self.ctr(&["tasks", "ls"]).stdout;
        out.lines()
            .find_map(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                (cols.first() == Some(&id)).then(|| {
                    (
                        cols.get(1).unwrap_or(&"").to_string(),
                        cols.get(2).unwrap_or(&"").to_string(),
                    )
                })
            })
            .unwrap_or_default()
    }

    fn wait_status(&self, id: &str, status: &str, limit: Duration) -> bool {
        crate::bench::wait_until(limit, || self.task_status(id).1 == status)
    }

    /// Starts a container of `runtime` for `test` with `flags` for `ctr run`.
    fn container(
        &self,
        runtime: &str,
        test: &Test,
        tag: &str,
        flags: &[&str],
    ) -> Result<Ctr<'a>, String> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let id = format!("zdtm-{}-{tag}-{n}", test.name.replace(['_', '.'], "-"));
        let mount = format!(
            "type=bind,src={},dst={MOUNT},options=rbind:ro",
            self.zdtm_dir.display()
        );
        let mut args = vec!["run", "-d", "--runtime", runtime, "--mount", &mount];
        let conf = self.c.tmp_dir().join(format!("criu-{id}.conf"));
        let annotation = format!("org.criu.config={}", conf.display());
        if !test.criu_opts.is_empty() {
            std::fs::create_dir_all(self.c.tmp_dir()).map_err(|e| e.to_string())?;
            std::fs::write(&conf, criu_config(&test.criu_opts))
                .map_err(|e| format!("write {}: {e}", conf.display()))?;
            args.extend(["--annotation", &annotation]);
        }
        args.extend(flags);
        args.extend([SANDBOX, &id, "sleep", "infinity"]);
        let out = self.ctr(&args);
        let ctr = Ctr { c: self.c, id };
        if out.code != 0 {
            return Err(format!("ctr run: {}", one_line(&out)));
        }
        Ok(ctr)
    }

    /// Starts `test` in container `id` as `zdtm.py` does; it has daemonized when this returns.
    fn start_test(&self, id: &str, test: &Test) -> Result<(), String> {
        let cmd = test.start.replacen("./", &format!("{MOUNT}/static/"), 1);
        let ids = if test.flag("suid") || !as_zdtm_uid() {
            ""
        } else {
            "ZDTM_UID=18943 ZDTM_GID=58467 ZDTM_GROUPS='27495 48244' "
        };
        let script = format!(
            "mkdir -p {SCRATCH} && chmod 0777 {SCRATCH} && cd {SCRATCH} && \
             export TMPDIR=/tmp {ids}&& {cmd} </dev/null >/dev/null 2>&1; rc=$?; \
             [ $rc = 0 ] || {{ tail -n 3 {n}.out.inprogress {n}.out 2>/dev/null; exit $rc; }}",
            n = test.name
        );
        let out = self.exec(id, &script);
        if out.code != 0 {
            return Err(format!("start (exit {}): {}", out.code, one_line(&out)));
        }
        Ok(())
    }

    /// SIGTERMs `test` in container `id` and reads its verdict.
    fn stop_test(&self, id: &str, test: &Test) -> Outcome {
        let n = &test.name;
        let script = format!(
            "cd {SCRATCH} || exit 3; p=$(cat {n}.pid) || exit 4; kill -TERM $p || exit 5; i=0; \
             while [ ! -e {n}.out ] && [ $i -lt {limit} ]; do sleep 0.05; i=$((i+1)); done; \
             if [ -e {n}.out ]; then tail -n 5 {n}.out; else echo TIMEOUT; tail -n 5 {n}.out.inprogress; fi",
            limit = STOP_LIMIT_S * 20
        );
        let out = self.exec(id, &script);
        let passed = out
            .stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .is_some_and(|l| l.split_whitespace().any(|w| w == "PASS"));
        match (out.code, passed) {
            (0, true) => Outcome::Pass,
            (3, _) => Outcome::Fail("scratch directory gone".into()),
            (4, _) => Outcome::Fail("no pidfile".into()),
            (5, _) => Outcome::Fail("test process gone before SIGTERM".into()),
            _ => Outcome::Fail(format!("check: {}", one_line(&out))),
        }
    }

    fn sigkill_init(&self, id: &str) -> Result<(), String> {
        let pid: i64 = self
            .task_status(id)
            .0
            .parse()
            .map_err(|_| format!("{id} has no task pid"))?;
        crate::sigkill(pid).map_err(|e| format!("SIGKILL {pid}: {e}"))
    }

    /// Control: the test in a plain Belayer container, no checkpoint.
    pub fn control(&self, test: &Test) -> Outcome {
        let run = || -> Result<Outcome, String> {
            let ctr = self.container(BELAYER, test, "ctl", &[])?;
            self.start_test(&ctr.id, test)?;
            Ok(self.stop_test(&ctr.id, test))
        };
        run().unwrap_or_else(Outcome::Fail)
    }

    /// Checkpoint with `belayer checkpoint`; fork it (if `fork`) and check the test in the fork;
    /// then (if `restore`) SIGKILL the init, `belayer restore` in place and check it there.
    pub fn restore_and_fork(&self, test: &Test, restore: bool, fork: bool) -> Vec<(Mode, Outcome)> {
        let mut results = Vec::new();
        let ctr = match self.container(BELAYER, test, "cr", &[]) {
            Ok(c) => c,
            Err(e) => return both(restore, fork, e),
        };
        if let Err(e) = self.start_test(&ctr.id, test) {
            return both(restore, fork, e);
        }
        let out = self.belayer(&["checkpoint", &ctr.id]);
        if out.code != 0 && test.dump_fails() {
            // Refused, as CRIU's harness expects: the container must run on unharmed.
            let intact = self.stop_test(&ctr.id, test);
            return [(fork, Mode::Fork), (restore, Mode::Restore)]
                .into_iter()
                .filter(|(on, _)| *on)
                .map(|(_, m)| (m, intact.clone()))
                .collect();
        }
        if out.code != 0 {
            return both(
                restore,
                fork,
                format!("belayer checkpoint: {}", one_line(&out)),
            );
        }
        let cp = out.stdout.trim().to_string();
        if fork {
            let out = self.belayer(&["fork", &ctr.id, "--checkpoint", &cp, "--count", "1"]);
            let outcome = if out.code != 0 {
                Outcome::Fail(format!("belayer fork: {}", one_line(&out)))
            } else {
                let f = Ctr {
                    c: self.c,
                    id: out.stdout.trim().to_string(),
                };
                let o = self.stop_test(&f.id, test);
                drop(f);
                o
            };
            results.push((Mode::Fork, outcome));
        }
        if restore {
            let outcome = (|| {
                self.sigkill_init(&ctr.id)?;
                if !self.wait_status(&ctr.id, "STOPPED", Duration::from_secs(20)) {
                    return Err("init did not stop after SIGKILL".to_string());
                }
                let out = self.belayer(&["restore", &ctr.id, "--checkpoint", &cp]);
                if out.code != 0 {
                    return Err(format!("belayer restore: {}", one_line(&out)));
                }
                Ok(self.stop_test(&ctr.id, test))
            })()
            .unwrap_or_else(Outcome::Fail);
            results.push((Mode::Restore, outcome));
        }
        results
    }

    /// Automatic checkpoints and recovery: the test starts (an exec: an action boundary), a
    /// hint says the model is thinking, an automatic checkpoint is taken, the init is SIGKILLed
    /// and the shim recovers the container; the test is checked there.
    pub fn auto(&self, test: &Test) -> Outcome {
        let run = || -> Result<Outcome, String> {
            let ctr = self.container(
                BELAYER,
                test,
                "auto",
                &[
                    "--annotation",
                    "io.belayer.checkpoint=auto",
                    "--annotation",
                    "io.belayer.recover=auto",
                ],
            )?;
            let id = ctr.id.as_str();
            let checkpoints = || self.belayer(&["checkpoints", id]).stdout;
            self.start_test(id, test)?;
            let before = checkpoints();
            let mut taken = false;
            for _ in 0..3 {
                self.exec(id, "true");
                let _ = self.belayer(&["hint", id, "llm-start", "--expected-ms", "2000"]);
                if crate::bench::wait_until(Duration::from_secs(8), || checkpoints() != before) {
                    taken = true;
                    break;
                }
            }
            if !taken && test.dump_fails() {
                // Every automatic checkpoint refused, as CRIU's harness expects: the container
                // runs on unharmed.
                return Ok(self.stop_test(id, test));
            }
            if !taken {
                return Err(format!(
                    "no automatic checkpoint (shim: {})",
                    last_words(&self.c.log_lines(id, 3))
                ));
            }
            // Let a checkpoint that is being written finish: the listing shows it once done.
            std::thread::sleep(Duration::from_millis(200));
            let status = || -> serde_json::Value {
                serde_json::from_str(&self.belayer(&["status", id]).stdout).unwrap_or_default()
            };
            self.sigkill_init(id)?;
            let recovered = crate::bench::wait_until(Duration::from_secs(30), || {
                status()["recoveries"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty())
            });
            if !recovered || !self.wait_status(id, "RUNNING", Duration::from_secs(10)) {
                return Err(format!(
                    "no recovery (shim: {})",
                    last_words(&self.c.log_lines(id, 3))
                ));
            }
            Ok(self.stop_test(id, test))
        };
        run().unwrap_or_else(Outcome::Fail)
    }

    /// Thaws container `id`'s cgroup (v1 freezer or v2 `cgroup.freeze`), as containerd sees it.
    fn thaw(&self, id: &str) {
        let root = self.c.cgroup_root();
        let ns = &self.c.ns;
        let _ = std::fs::write(
            root.join(format!("freezer/{ns}/{id}/freezer.state")),
            "THAWED",
        );
        let _ = std::fs::write(root.join(format!("{ns}/{id}/cgroup.freeze")), "0");
    }

    /// containerd's own, under runc: `ctr c checkpoint --rw --task`, SIGKILL, the container
    /// removed, `ctr c restore --rw --live` into a new one, the test checked there.
    pub fn containerd(&self, test: &Test) -> Outcome {
        let run = || -> Result<Outcome, String> {
            let ctr = self.container(RUNC, test, "runc", &[])?;
            self.start_test(&ctr.id, test)?;
            let image = format!("belayer.local/zdtm-checkpoint:{}", ctr.id);
            let out = self.ctr(&[
                "containers",
                "checkpoint",
                "--rw",
                "--task",
                &ctr.id,
                &image,
            ]);
            if out.code != 0 {
                if out.code == 124 {
                    // runc + CRIU hang on a stopped task in a frozen cgroup (README, stopped
                    // tasks): thaw it, so CRIU fails and the container can be removed.
                    self.thaw(&ctr.id);
                }
                if test.dump_fails() {
                    return Ok(self.stop_test(&ctr.id, test));
                }
                return Err(format!("ctr c checkpoint: {}", one_line(&out)));
            }
            let restored = format!("{}-r", ctr.id);
            drop(ctr);
            let out = self.ctr(&["containers", "restore", "--rw", "--live", &restored, &image]);
            let r = Ctr {
                c: self.c,
                id: restored,
            };
            let _ = self.ctr(&["images", "rm", &image]);
            if out.code != 0 {
                return Err(format!("ctr c restore: {}", one_line(&out)));
            }
            if !self.wait_status(&r.id, "RUNNING", Duration::from_secs(30)) {
                return Err("restored task not running".into());
            }
            Ok(self.stop_test(&r.id, test))
        };
        run().unwrap_or_else(Outcome::Fail)
    }

    /// Runs `test` in control and, if it passes there, in each of `modes`.
    pub fn run(&self, test: &Test, modes: &[Mode]) -> Report {
        let start = Instant::now();
        let mut outcomes = BTreeMap::new();
        let control = self.control(test);
        let passed = control.passed();
        outcomes.insert(Mode::Control, control);
        if passed {
            let restore = modes.contains(&Mode::Restore);
            let fork = modes.contains(&Mode::Fork);
            if restore || fork {
                outcomes.extend(self.restore_and_fork(test, restore, fork));
            }
            if modes.contains(&Mode::Auto) {
                outcomes.insert(Mode::Auto, self.auto(test));
            }
            if modes.contains(&Mode::Containerd) {
                outcomes.insert(Mode::Containerd, self.containerd(test));
            }
        }
        Report {
            test: test.name.clone(),
            outcomes,
            secs: start.elapsed().as_secs_f64(),
        }
    }

    /// Runs `tests` on `jobs` threads; `each` sees every report as it comes.
    pub fn run_all(
        &self,
        tests: &[Test],
        modes: &[Mode],
        jobs: usize,
        each: &(dyn Fn(&Report) + Sync),
    ) -> Vec<Report> {
        let next = AtomicU32::new(0);
        let reports = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for _ in 0..jobs.max(1) {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        let Some(test) = tests.get(i) else { break };
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            self.run(test, modes)
                        }))
                        .unwrap_or_else(|_| Report {
                            test: test.name.clone(),
                            outcomes: BTreeMap::from([(
                                Mode::Control,
                                Outcome::Fail("the harness panicked".into()),
                            )]),
                            secs: 0.0,
                        });
                        each(&r);
                        reports.lock().expect("reports").push(r);
                    }
                });
            }
        });
        let mut reports = reports.into_inner().expect("reports");
        reports.sort_by(|a, b| a.test.cmp(&b.test));
        reports
    }
}

fn both(restore: bool, fork: bool, why: String) -> Vec<(Mode, Outcome)> {
    let mut v = Vec::new();
    if fork {
        v.push((Mode::Fork, Outcome::Fail(why.clone())));
    }
    if restore {
        v.push((Mode::Restore, Outcome::Fail(why)));
    }
    v
}

/// Per mode: tests tried, passed in control, passed, and the failures with their reasons.
pub struct Tally {
    pub mode: Mode,
    pub tried: usize,
    pub control_passed: usize,
    pub passed: usize,
    pub failed: Vec<(String, String)>,
}

/// The [`Tally`] of each mode in `modes` (control first).
pub fn tally(reports: &[Report], modes: &[Mode]) -> Vec<Tally> {
    let control_passed = reports
        .iter()
        .filter(|r| r.outcomes.get(&Mode::Control).is_some_and(Outcome::passed))
        .count();
    let mut out = Vec::new();
    for mode in
        std::iter::once(Mode::Control).chain(modes.iter().copied().filter(|m| *m != Mode::Control))
    {
        let mut passed = 0;
        let mut failed = Vec::new();
        for r in reports {
            match r.outcomes.get(&mode) {
                Some(Outcome::Pass) => passed += 1,
                Some(Outcome::Fail(why)) => failed.push((r.test.clone(), why.clone())),
                None => {}
            }
        }
        out.push(Tally {
            mode,
            tried: reports.len(),
            control_passed,
            passed,
            failed,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_options_become_a_criu_configuration_file() {
        assert_eq!(
            criu_config("--ghost-limit 8M --no-ghost-fiemap"),
            "ghost-limit 8M\nno-ghost-fiemap\n"
        );
        assert_eq!(
            criu_config("--manage-cgroups=full --link-remap"),
            "manage-cgroups full\nlink-remap\n"
        );
        assert_eq!(criu_config(""), "");
    }
}
