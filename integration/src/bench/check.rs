//! Correctness checks on a restored or forked episode, so a broken restore cannot be reported as
//! a fast one: the background process's memory digest, and the counter file (exactly 1..N, and
//! still growing: memory and filesystem from one instant, processes alive).

use std::time::Duration;

use crate::containerd::Out;
use crate::episode::is_contiguous;

/// Asks the background process for the sha256 of its memory now.
const ASK_DIGEST: &str = "python3 -c 'import socket; s = socket.create_connection((\"127.0.0.1\", 8765), timeout=30); print(s.recv(64).decode())'";

/// What only the baselines' restores show, and no check of the restored state: their network
/// namespace comes back with loopback down. Reported as a finding, not gating.
pub const REACHABLE: &str = "127.0.0.1 reachable after restore";

/// One check's outcome. Every side's checks of the restored state (memory, counter,
/// filesystem) gate the exit status alike: a baseline whose restore is broken would flatter
/// its time. Loopback found down ([`REACHABLE`]) is a finding.
#[derive(Clone, Debug)]
pub struct Check {
    pub system: &'static str,
    pub run: u32,
    /// The container checked.
    pub target: String,
    pub what: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn gating(&self) -> bool {
        self.what != REACHABLE
    }
}

/// Every check of a benchmark run.
#[derive(Clone, Debug, Default)]
pub struct Checks(pub Vec<Check>);

impl Checks {
    /// Records a check and says so on stderr when it fails.
    pub fn record(
        &mut self,
        system: &'static str,
        run: u32,
        target: &str,
        what: &str,
        ok: bool,
        detail: impl Into<String>,
    ) {
        let c = Check {
            system,
            run,
            target: target.into(),
            what: what.into(),
            ok,
            detail: detail.into(),
        };
        if !c.ok {
            let kind = if c.gating() {
                "CHECK FAILED"
            } else {
                "finding"
            };
            eprintln!(
                "{kind} [{} run {}] {}: {}: {}",
                c.system, c.run, c.target, c.what, c.detail
            );
        }
        self.0.push(c);
    }

    /// Failed checks that gate the exit status.
    pub fn failed(&self) -> usize {
        self.0.iter().filter(|c| c.gating() && !c.ok).count()
    }

    /// Per system and check: (system, what, passed, total, first failure's detail).
    pub fn summary(&self) -> Vec<(&'static str, String, usize, usize, Option<String>)> {
        let mut rows: Vec<(&'static str, String, usize, usize, Option<String>)> = Vec::new();
        for c in &self.0 {
            let i = match rows.iter().position(|r| r.0 == c.system && r.1 == c.what) {
                Some(i) => i,
                None => {
                    rows.push((c.system, c.what.clone(), 0, 0, None));
                    rows.len() - 1
                }
            };
            let r = &mut rows[i];
            r.3 += 1;
            if c.ok {
                r.2 += 1;
            } else if r.4.is_none() {
                r.4 = Some(c.detail.clone());
            }
        }
        rows
    }
}

fn numbers(out: &Out) -> Vec<u64> {
    out.stdout
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

fn tail(ns: &[u64]) -> String {
    format!(
        "{} numbers, last {:?}",
        ns.len(),
        &ns[ns.len().saturating_sub(4)..]
    )
}

/// Asks the episode's background process for the digest of its memory now.
pub fn ask_digest(exec: &dyn Fn(&str) -> Out) -> Out {
    exec(ASK_DIGEST)
}

/// Asks the restored episode's background process for the digest of its memory (it touches
/// every page to compute it, so the answer means the memory is all there): the stop point
/// "memory intact". `pid`: a process of the container, for the baselines: when their restored
/// network namespace has its loopback down (so the holder is unreachable), that is recorded,
/// loopback is brought up from the host with `nsenter … ip link set lo up`, and it is asked
/// again.
pub fn digest_after_restore(
    checks: &mut Checks,
    system: &'static str,
    run: u32,
    target: &str,
    pid: Option<u32>,
    exec: &dyn Fn(&str) -> Out,
) -> Out {
    let now = exec(ASK_DIGEST);
    let Some(pid) = pid else {
        return now;
    };
    let up = now.code == 0;
    let why = if up {
        String::new()
    } else {
        format!(
            "{} (then: nsenter -t {pid} -n ip link set lo up)",
            last_line(&now.stderr)
        )
    };
    checks.record(system, run, target, REACHABLE, up, why);
    if up {
        return now;
    }
    let _ = std::process::Command::new("nsenter")
        .args([
            "-t",
            &pid.to_string(),
            "-n",
            "ip",
            "link",
            "set",
            "lo",
            "up",
        ])
        .status();
    exec(ASK_DIGEST)
}

/// Checks a restored episode through `exec` (runs a shell script in the container named
/// `target`): the memory digest `now` (from [`digest_after_restore`]) equals the one at the
/// start, the counter file is 1..N and still grows, and the filesystem tree is the
/// checkpoint's (a file made after it is gone, the package installed before it imports).
pub fn restored(
    checks: &mut Checks,
    system: &'static str,
    run: u32,
    target: &str,
    now: &Out,
    exec: &dyn Fn(&str) -> Out,
) {
    let at_start = exec("cat /work/holder.ready");
    let (digest, at_start) = (now.stdout.trim(), at_start.stdout.trim());
    checks.record(
        system,
        run,
        target,
        "holder memory digest unchanged",
        !digest.is_empty() && digest == at_start,
        format!(
            "now {digest:?}, at start {at_start:?} {}",
            last_line(&now.stderr)
        ),
    );
    let first = numbers(&exec("cat /work/counter"));
    checks.record(
        system,
        run,
        target,
        "counter file is 1..N",
        is_contiguous(&first),
        tail(&first),
    );
    std::thread::sleep(Duration::from_millis(300));
    let later = numbers(&exec("cat /work/counter"));
    checks.record(
        system,
        run,
        target,
        "counter continues",
        later.len() > first.len() && is_contiguous(&later),
        tail(&later),
    );
    rolled_back(checks, system, run, target, exec);
}

fn last_line(s: &str) -> &str {
    s.trim().lines().last().unwrap_or_default()
}

/// Checks that a file made after the checkpoint is gone (the filesystem was rolled back).
fn rolled_back(
    checks: &mut Checks,
    system: &'static str,
    run: u32,
    target: &str,
    exec: &dyn Fn(&str) -> Out,
) {
    let out = exec(
        "test ! -e /work/new-file && test -f /work/src/pkg/mod.py && python3 -c 'import belayer_demo'",
    );
    checks.record(
        system,
        run,
        target,
        "filesystem back at the checkpoint",
        out.code == 0,
        format!("exit {} {}", out.code, out.stderr.trim()),
    );
}
