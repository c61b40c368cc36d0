//! The bound on a checkpoint's frozen window. Whatever CRIU or the kernel does — a task CRIU
//! waits on in the kernel, an action script that hangs, a runc that never answers — a container
//! is not kept frozen past [`CheckpointRequest::frozen_limit`](crate::CheckpointRequest): a
//! watcher thread ends CRIU (and whatever it started) and, if CRIU cannot be found, the
//! `runc checkpoint` that waits for it. So it does as soon as the container's init has died. The dump then fails, and the checkpoint's own error path
//! undoes the network lock and thaws the container.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::blocked::BlockedTask;

/// What a checkpoint that stayed frozen past its bound was waiting on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The CRIU processes ended (none when only runc could be found, or neither).
    pub criu: Vec<i32>,
    /// The container's task CRIU was waiting on, when its system call or the container's tasks
    /// tell.
    pub task: Option<BlockedTask>,
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.task, self.criu.first()) {
            (Some(task), Some(criu)) => write!(f, "CRIU (pid {criu}) was waiting on {task}"),
            (Some(task), None) => write!(f, "waiting on {task}"),
            (None, Some(criu)) => write!(f, "CRIU (pid {criu}) had not finished"),
            (None, None) => write!(f, "runc checkpoint had not finished"),
        }
    }
}

/// Watches one `runc checkpoint` of container `id` (init `init`) while it runs.
pub(crate) struct FrozenWatch {
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Option<Stall>>>,
}

/// How often the container's init is looked at while the dump runs: once it has died (a crash
/// during the checkpoint), the dump is ended at once instead of at the bound, so that the
/// recovery need not wait for it.
const INIT_LOOK_EVERY: Duration = Duration::from_millis(100);
/// How often an overdue dump's processes are looked for again and ended.
const KILL_EVERY: Duration = Duration::from_millis(100);
/// How long after the bound runc itself is ended when no CRIU of it can be found.
const RUNC_GRACE: Duration = Duration::from_secs(1);

impl FrozenWatch {
    /// Starts watching the dump of `id` by the runc of state dir `root`: past `left`, the dump
    /// is ended.
    pub fn arm(id: &str, root: &Path, init: i32, left: Duration) -> Self {
        let (done, rx) = mpsc::channel::<()>();
        let id = id.to_string();
        let root: PathBuf = root.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("belayer-frozen-watch".into())
            .spawn(move || {
                let deadline = Instant::now() + left;
                loop {
                    let wait = deadline.saturating_duration_since(Instant::now());
                    match rx.recv_timeout(wait.min(INIT_LOOK_EVERY)) {
                        Err(RecvTimeoutError::Timeout) => {}
                        _ => return None,
                    }
                    // A dead init ends the dump's purpose: CRIU may wait on it until the bound.
                    if Instant::now() >= deadline || crate::blocked::is_dead(init) {
                        return Some(end_dump(&id, &root, init, &rx));
                    }
                }
            })
            .map_err(|e| tracing::error!(error = %e, "cannot start the frozen-window watch"))
            .ok();
        Self {
            done: Some(done),
            thread,
        }
    }

    /// Stops watching once the dump returned; what the watch ended, if it ended anything.
    pub fn disarm(mut self) -> Option<Stall> {
        self.finish()
    }

    fn finish(&mut self) -> Option<Stall> {
        drop(self.done.take());
        self.thread.take().and_then(|t| t.join().ok().flatten())
    }
}

impl Drop for FrozenWatch {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Ends the overdue dump of container `id`: names what CRIU waits on, then SIGKILLs CRIU and
/// its descendants — again every [`KILL_EVERY`] until `done` says the dump returned (runc may
/// not have started CRIU yet) — and runc itself if no CRIU turns up within [`RUNC_GRACE`].
fn end_dump(id: &str, root: &Path, init: i32, done: &mpsc::Receiver<()>) -> Stall {
    let overdue = Instant::now();
    let mut stall = Stall {
        criu: Vec::new(),
        task: None,
    };
    loop {
        let runcs = runcs("checkpoint", id, root);
        let criu: Vec<i32> = runcs.iter().flat_map(|&r| descendants(r)).collect();
        if stall.task.is_none() {
            stall.task = criu
                .iter()
                .find_map(|&c| waited_on(c))
                .or_else(|| crate::blocked::stopped_task(init))
                .or_else(|| crate::blocked::traced_task(init));
        }
        for &pid in criu.iter().rev() {
            kill(pid);
        }
        if stall.criu.is_empty() && !criu.is_empty() {
            tracing::warn!(container = id, criu = ?criu, "the checkpoint is frozen too long; ending CRIU");
            stall.criu = criu;
        } else if stall.criu.is_empty() && overdue.elapsed() >= RUNC_GRACE {
            tracing::warn!(container = id, runc = ?runcs, "the checkpoint is frozen too long and runc started no CRIU; ending runc");
            runcs.iter().for_each(|&r| kill(r));
        }
        match done.recv_timeout(KILL_EVERY) {
            Err(RecvTimeoutError::Timeout) => continue,
            _ => return stall,
        }
    }
}

fn kill(pid: i32) {
    // SAFETY: kill has no memory effects; a pid that has gone meanwhile gets ESRCH.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// The `runc <verb>` processes of container `id` under runc state dir `root` (the id is runc's
/// last argument; the root tells apart containers of one id in other namespaces).
pub(crate) fn runcs(verb: &str, id: &str, root: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let root = root.as_os_str().as_bytes();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let args = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = args.split(|&b| b == 0).filter(|a| !a.is_empty()).collect();
            args.first().is_some_and(|a| a.ends_with(b"runc"))
                && args.contains(&verb.as_bytes())
                && args.windows(2).any(|w| w[0] == b"--root" && w[1] == root)
                && args.last() == Some(&id.as_bytes())
        })
        .collect()
}

/// Every descendant of `pid`, parents before children.
pub(crate) fn descendants(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut pending = vec![pid];
    while let Some(p) = pending.pop() {
        let Ok(threads) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in threads.flatten() {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                if !found.contains(&c) && found.len() < 4096 {
                    found.push(c);
                    pending.push(c);
                }
            }
        }
    }
    found
}

/// The task CRIU process `criu` is blocked on, from the system call it is in
/// (`/proc/<pid>/syscall`): `ptrace(PTRACE_SEIZE, pid)`, `ptrace(…, pid)` or `wait4(pid)`.
fn waited_on(criu: i32) -> Option<BlockedTask> {
    let call = std::fs::read_to_string(format!("/proc/{criu}/syscall")).ok()?;
    let pid = syscall_target(&call)?;
    let proc = std::path::Path::new("/proc");
    crate::blocked::task(proc, pid)
}

/// The pid a `/proc/<pid>/syscall` line's call waits on: the second argument of `ptrace`, the
/// first of `wait4`.
fn syscall_target(line: &str) -> Option<i32> {
    let mut fields = line.split_whitespace();
    let nr: i64 = fields.next()?.parse().ok()?;
    let arg = |s: Option<&str>| -> Option<i32> {
        let v = i64::from_str_radix(s?.trim_start_matches("0x"), 16).ok()?;
        i32::try_from(v).ok().filter(|&p| p > 0)
    };
    if nr == libc::SYS_ptrace {
        fields.next()?;
        arg(fields.next())
    } else if nr == libc::SYS_wait4 {
        arg(fields.next())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_waited_on_pid_is_read_from_the_system_call() {
        let seize = format!("{} 0x4206 0x3b9a 0x0 0x0 0x7ffd 0x0", libc::SYS_ptrace);
        assert_eq!(syscall_target(&seize), Some(0x3b9a));
        let wait = format!("{} 0x3b9a 0x7ffd 0x40000000 0x0 0x0 0x0", libc::SYS_wait4);
        assert_eq!(syscall_target(&wait), Some(0x3b9a));
        let any = format!("{} 0xffffffffffffffff 0x7ffd", libc::SYS_wait4);
        assert_eq!(syscall_target(&any), None, "wait4(-1) names no task");
        assert_eq!(syscall_target("running"), None);
        assert_eq!(syscall_target("0 0x3 0x7ffd 0x1000"), None, "read");
    }

    #[test]
    fn a_watch_disarmed_in_time_ends_nothing() {
        let w = FrozenWatch::arm(
            "no-such-container",
            Path::new("/run/no-such-runc-root"),
            std::process::id() as i32,
            Duration::from_secs(5),
        );
        assert_eq!(w.disarm(), None);
    }

    #[test]
    fn an_overdue_watch_ends_the_checkpoints_runc_and_criu() {
        // A stand-in pair named as runc and its CRIU would be: `runc --root R checkpoint … <id>`
        // with a child. Both are ended; the stall names the child as CRIU.
        let dir = tempfile::tempdir().unwrap();
        let runc = dir.path().join("runc");
        std::os::unix::fs::symlink("/bin/sh", &runc).unwrap();
        let id = format!("watch-test-{}", std::process::id());
        let root = dir.path().join("root");
        let mut fake = std::process::Command::new(&runc)
            .args(["-c", "sleep 600 & wait", "--root"])
            .arg(&root)
            .args(["checkpoint", &id])
            .spawn()
            .unwrap();
        // spawn returns once the child's exec has replaced its memory, which can be before the
        // loader has set its arguments (an empty cmdline for that instant): wait for them.
        let start = Instant::now();
        while runcs("checkpoint", &id, &root).is_empty() {
            assert!(
                start.elapsed().as_secs() < 10,
                "the stand-in runc never showed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The shell's child carries the shell's command line until its exec of `sleep`, and
        // would count as a second runc until then (seen: two pids): wait for the exec.
        let is_sleep = |p: i32| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|a| a.starts_with(b"sleep\0"))
        };
        while !descendants(fake.id() as i32)
            .first()
            .is_some_and(|&p| is_sleep(p))
        {
            assert!(start.elapsed().as_secs() < 10);
            std::thread::sleep(Duration::from_millis(5));
        }
        let sleeper = descendants(fake.id() as i32)[0];
        // A runc of the same id under another state dir (another namespace) is not this dump's.
        assert!(runcs("checkpoint", &id, &dir.path().join("other")).is_empty());
        assert_eq!(runcs("checkpoint", &id, &root), vec![fake.id() as i32]);
        assert!(runcs("restore", &id, &root).is_empty());
        let w = FrozenWatch::arm(&id, &root, 1, Duration::from_millis(50));
        // The "dump" returns once runc does: it ends when its child is killed.
        fake.wait().unwrap();
        let stall = w.disarm().expect("the watch ended the dump");
        assert_eq!(stall.criu, vec![sleeper]);
        assert!(crate::blocked::is_dead(sleeper));
    }
}
