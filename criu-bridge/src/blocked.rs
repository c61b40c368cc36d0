//! Tasks CRIU cannot seize now. CRIU stops a container's tasks with ptrace and waits, with no
//! limit but its `--timeout` (10 s by default), for each to stop; all that time the container is
//! frozen. Two kinds of task do not stop until something else happens:
//!
//! - a task in uninterruptible sleep (`D`), most often waiting for disk I/O: it stops when the
//!   wait ends, seconds later on a disk busy writing back gigabytes;
//! - a task in the middle of `vfork` (dash runs every command this way): it waits until its
//!   child calls `exec`, but CRIU stops the child first, so the parent never stops and the dump
//!   fails after the full timeout.
//!
//! A checkpoint looks for them first: [`blocked_task`] before freezing (a running task in `D` is
//! really blocked), [`vfork_waiter`] once frozen (the freezer reports frozen tasks as `D` too,
//! but a vfork wait keeps its kernel function).
//!
//! Two more kinds CRIU cannot take from a frozen container as runc has it dump:
//!
//! - a task of another tracer (a debugger, `strace`): CRIU's `PTRACE_SEIZE` fails. Found by
//!   [`traced_task`] before anything is frozen, and refused;
//! - under the cgroup v1 freezer, a stopped task (SIGSTOP, SIGTSTP, job control): the kernel's
//!   `PTRACE_SEIZE` of a stopped task waits for it to re-enter its stop as a ptrace trap, which a
//!   task frozen by the v1 freezer never does. CRIU waits in the kernel, the container frozen,
//!   for as long as nobody thaws it. Found by [`stopped_task`] once frozen; the checkpoint then
//!   has CRIU seize the tasks one by one instead ([`crate::runc::Seize::OneByOne`]), which
//!   [`outside_tree`] tells apart from a container where that would let an exec'd process run
//!   through the dump. The cgroup v2 freezer lets the trap happen: CRIU records the task as
//!   stopped and a restore stops it again.

use std::path::Path;

/// A task that CRIU could not stop now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedTask {
    /// Its thread id (the pid, for a single-threaded process).
    pub tid: i32,
    /// Its command name.
    pub comm: String,
    /// The kernel function it waits in, when the kernel tells.
    pub wchan: String,
    /// Its state letter (`D`, `T`, `t`, …).
    pub state: char,
    /// The pid of the process tracing it, 0 for none.
    pub tracer: i32,
}

impl BlockedTask {
    /// Is it waiting for a vfork child to exec or exit?
    pub fn in_vfork(&self) -> bool {
        is_vfork_wait(&self.wchan)
    }

    /// Is it stopped (by a signal or job control, or in a ptrace stop), frozen or not?
    pub fn is_stopped(&self) -> bool {
        is_stopped(self.state, &self.wchan)
    }
}

impl std::fmt::Display for BlockedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "task {} ({})", self.tid, self.comm)?;
        if self.tracer != 0 {
            write!(f, " is traced by pid {}", self.tracer)
        } else if self.is_stopped() {
            write!(f, " is stopped (SIGSTOP, SIGTSTP or job control)")
        } else if self.in_vfork() {
            write!(f, " is in vfork, waiting for its child to exec")
        } else if self.state != 'D' {
            write!(f, " is in state {} in {}", self.state, self.wchan)
        } else if self.wchan.is_empty() || self.wchan == "0" {
            write!(f, " is in uninterruptible sleep")
        } else {
            write!(f, " is in uninterruptible sleep in {}", self.wchan)
        }
    }
}

/// Kernel functions a vfork parent waits in: `kernel_clone` since Linux 5.10 (the wait is
/// inlined into it), `_do_fork` before, `wait_for_vfork_done` where it is not inlined.
fn is_vfork_wait(wchan: &str) -> bool {
    matches!(
        wchan,
        "kernel_clone" | "_do_fork" | "do_fork" | "wait_for_vfork_done"
    )
}

/// A task stopped by a signal, or in a ptrace stop: `T`/`t` running, or frozen (every frozen
/// task reads `D`) in the kernel function that stops it.
fn is_stopped(state: char, wchan: &str) -> bool {
    matches!(state, 'T' | 't')
        || (state == 'D' && matches!(wchan, "do_signal_stop" | "ptrace_stop"))
}

/// The first task of the container whose init is `init` — every task of its PID namespace,
/// exec'd processes included, which CRIU's freezer-cgroup seize meets too — that another
/// process traces: CRIU cannot checkpoint it. A container that shares the host's PID namespace
/// is looked at through init's tree.
pub fn traced_task(init: i32) -> Option<BlockedTask> {
    in_container(init, &|_, _, tracer| tracer != 0)
}

/// The first task of the container whose init is `init` (as [`traced_task`] looks) that is
/// stopped by a signal or job control, frozen or not.
pub fn stopped_task(init: i32) -> Option<BlockedTask> {
    in_container(init, &|state, wchan, _| is_stopped(state, wchan))
}

/// The first task of the container whose init is `init` that `pred(state, wchan, tracer)`
/// accepts.
fn in_container(init: i32, pred: &impl Fn(char, &str, i32) -> bool) -> Option<BlockedTask> {
    let proc = Path::new("/proc");
    match namespace_peers(proc, init) {
        Some(pids) => pids.into_iter().find_map(|pid| look(proc, pid, pred)),
        None => find_in_tree(proc, init, pred),
    }
}

/// The first of `tasks` (thread ids, those of the container's freezer cgroup) that is not a
/// thread of `init` or of its descendants: a process exec'd into the container, which CRIU's
/// dump of init's tree does not hold. A task gone meanwhile is skipped.
pub fn outside_tree(init: i32, tasks: &[i32]) -> Option<BlockedTask> {
    let proc = Path::new("/proc");
    let tree = tree_threads(proc, init);
    tasks
        .iter()
        .filter(|t| !tree.contains(t))
        .find_map(|&tid| read_task(&proc.join(tid.to_string()), tid))
}

/// The threads of `init` and of its descendants.
fn tree_threads(proc: &Path, init: i32) -> std::collections::HashSet<i32> {
    let mut threads = std::collections::HashSet::new();
    walk_tree(proc, init, &mut |tid, _| {
        threads.insert(tid);
        false
    });
    threads
}

/// Does runc freeze containers with the cgroup v1 freezer here (no unified hierarchy at
/// `/sys/fs/cgroup`, runc's own test)?
pub fn freezer_is_v1() -> bool {
    !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The pids of `/proc` that share `init`'s PID namespace; `None` when that is the caller's own
/// (a container without a PID namespace of its own) or cannot be read.
fn namespace_peers(proc: &Path, init: i32) -> Option<Vec<i32>> {
    use std::os::unix::fs::MetadataExt;
    let ns = |pid: &str| std::fs::metadata(proc.join(pid).join("ns/pid")).map(|m| m.ino());
    let theirs = ns(&init.to_string()).ok()?;
    if ns("self").ok()? == theirs {
        return None;
    }
    let mut pids: Vec<i32> = std::fs::read_dir(proc)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| ns(&pid.to_string()).is_ok_and(|n| n == theirs))
        .collect();
    pids.sort_unstable();
    Some(pids)
}

/// The first thread of process `pid` that `pred(state, wchan, tracer)` accepts.
fn look(proc: &Path, pid: i32, pred: &impl Fn(char, &str, i32) -> bool) -> Option<BlockedTask> {
    let threads = std::fs::read_dir(proc.join(pid.to_string()).join("task")).ok()?;
    threads.flatten().find_map(|t| {
        let tid = t.file_name().to_str()?.parse::<i32>().ok()?;
        let task = read_task(&t.path(), tid)?;
        pred(task.state, &task.wchan, task.tracer).then_some(task)
    })
}

/// Task `pid` as `/proc` describes it (its main thread); `None` once it is gone.
pub(crate) fn task(proc: &Path, pid: i32) -> Option<BlockedTask> {
    read_task(&proc.join(pid.to_string()), pid)
}

/// Thread `tid` as its `/proc` directory `dir` describes it; `None` once it is gone.
fn read_task(dir: &Path, tid: i32) -> Option<BlockedTask> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let (comm, state) = parse_stat(&stat)?;
    let wchan = std::fs::read_to_string(dir.join("wchan")).unwrap_or_default();
    let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
    let tracer = status
        .lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    Some(BlockedTask {
        tid,
        comm: comm.to_string(),
        wchan: wchan.trim().to_string(),
        state,
        tracer,
    })
}

/// The first thread of `init` or of its descendants in uninterruptible sleep. Only meaningful
/// while the tree runs: frozen tasks read as `D` too. A task that exits during the walk is
/// skipped.
pub fn blocked_task(init: i32) -> Option<BlockedTask> {
    find(Path::new("/proc"), init, |state, _| state == 'D')
}

/// The first thread of `init` or of its descendants waiting for a vfork child to exec, frozen or
/// not.
pub fn vfork_waiter(init: i32) -> Option<BlockedTask> {
    find(Path::new("/proc"), init, |state, wchan| {
        state == 'D' && is_vfork_wait(wchan)
    })
}

/// Walks the threads of `init` and its descendants (through each thread's `children`) for the
/// first one in `D` that `pred(state, wchan)` accepts.
fn find(proc: &Path, init: i32, pred: impl Fn(char, &str) -> bool) -> Option<BlockedTask> {
    find_in_tree(proc, init, |state, wchan, _| {
        state == 'D' && pred(state, wchan)
    })
}

/// Walks the threads of `init` and its descendants (through each thread's `children`) for the
/// first one `pred(state, wchan, tracer)` accepts.
fn find_in_tree(
    proc: &Path,
    init: i32,
    pred: impl Fn(char, &str, i32) -> bool,
) -> Option<BlockedTask> {
    let mut found = None;
    walk_tree(proc, init, &mut |tid, dir| {
        found = read_task(dir, tid).filter(|t| pred(t.state, &t.wchan, t.tracer));
        found.is_some()
    });
    found
}

/// Calls `visit(tid, its /proc dir)` on the threads of `init` and its descendants (through each
/// thread's `children`) until it returns true.
fn walk_tree(proc: &Path, init: i32, visit: &mut impl FnMut(i32, &Path) -> bool) {
    let mut pending = vec![init];
    // A tree that forks faster than the walk reads must not keep it going.
    let mut visited = 0usize;
    while let Some(pid) = pending.pop() {
        visited += 1;
        if visited > 100_000 {
            break;
        }
        let Ok(threads) = std::fs::read_dir(proc.join(pid.to_string()).join("task")) else {
            continue;
        };
        for t in threads.flatten() {
            let dir = t.path();
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if visit(tid, &dir) {
                return;
            }
            if let Ok(children) = std::fs::read_to_string(dir.join("children")) {
                pending.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
}

/// The state letter of task `pid` (`R`, `S`, `D`, `Z`, …); `None` once it is gone.
pub fn task_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, state)| state)
}

/// Task `pid` has died or is about to: gone, a zombie, exiting, or with a SIGKILL pending (a
/// task killed while frozen dies only once thawed; an init that is exiting first waits for the
/// rest of its PID namespace to die).
pub fn is_dead(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    dead_or_dying(&stat, &status)
}

/// `PF_EXITING` in the flags of `/proc/<pid>/stat`: the task is in `do_exit`.
const PF_EXITING: u64 = 0x4;

/// [`is_dead`] on the text of `/proc/<pid>/stat` and `/proc/<pid>/status`.
fn dead_or_dying(stat: &str, status: &str) -> bool {
    let Some((_, fields)) = split_stat(stat) else {
        return false;
    };
    let mut fields = fields.split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return true;
    }
    // After the state: ppid, pgrp, session, tty_nr, tpgid, flags.
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    let sigkill = 1u64 << (libc::SIGKILL - 1);
    let pending = status.lines().any(|l| {
        ["SigPnd:", "ShdPnd:"].iter().any(|key| {
            l.strip_prefix(key)
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & sigkill != 0)
        })
    });
    flags & PF_EXITING != 0 || pending
}

/// Command name and state of a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> Option<(&str, char)> {
    let (comm, fields) = split_stat(stat)?;
    Some((comm, fields.trim_start().chars().next()?))
}

/// A `/proc/<pid>/stat` line split into the command name and the fields after it. The name is
/// in parentheses and may itself hold spaces and parentheses: it ends at the last `)`.
fn split_stat(stat: &str) -> Option<(&str, &str)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    Some((stat.get(open + 1..close)?, stat.get(close + 1..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_names_may_hold_parentheses_and_spaces() {
        assert_eq!(
            parse_stat("42 (a (b) c) D 1 42 42 0 -1"),
            Some(("a (b) c", 'D'))
        );
        assert_eq!(parse_stat("7 (sh) S 1"), Some(("sh", 'S')));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_dead_child_is_a_zombie_until_reaped_then_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        let start = std::time::Instant::now();
        while task_state(pid) != Some('Z') {
            assert!(!is_dead(pid) || task_state(pid) == Some('Z'));
            assert!(
                start.elapsed().as_secs() < 10,
                "{pid}: {:?}",
                task_state(pid)
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(is_dead(pid));
        child.wait().unwrap();
        assert_eq!(task_state(pid), None);
        assert!(is_dead(pid));
        assert!(matches!(
            task_state(std::process::id() as i32),
            Some('R' | 'S')
        ));
    }

    #[test]
    fn dying_is_told_from_the_flags_and_a_pending_sigkill() {
        let stat = |state: char, flags: u64| format!("9 (sh (x)) {state} 1 9 9 0 -1 {flags} 0 0");
        let status = |sig: &str, shd: &str| format!("Name:\tsh\nSigPnd:\t{sig}\nShdPnd:\t{shd}\n");
        let none = status("0000000000000000", "0000000000000000");
        assert!(!dead_or_dying(&stat('S', 0x400100), &none));
        assert!(dead_or_dying(&stat('Z', 0), &none));
        assert!(dead_or_dying(&stat('D', 0x400104), &none), "PF_EXITING");
        let killed = status("0000000000000100", "0000000000000000");
        assert!(
            dead_or_dying(&stat('D', 0x400100), &killed),
            "SIGKILL pending"
        );
        let shared = status("0000000000000000", "0000000000000100");
        assert!(
            dead_or_dying(&stat('S', 0), &shared),
            "SIGKILL pending, shared"
        );
        let term = status("0000000000004000", "0000000000000000");
        assert!(!dead_or_dying(&stat('S', 0), &term), "SIGTERM is no death");
    }

    #[test]
    fn a_stopped_child_is_found_until_continued_and_is_not_traced() {
        let mut child = std::process::Command::new("sleep")
            .arg("100")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        // SAFETY: kill has no memory effects; pid is our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let start = std::time::Instant::now();
        while task_state(pid) != Some('T') {
            assert!(start.elapsed().as_secs() < 10, "{:?}", task_state(pid));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let found = stopped_task(pid).expect("a stopped task");
        assert_eq!((found.tid, found.state, found.tracer), (pid, 'T', 0));
        assert!(found.is_stopped());
        assert_eq!(
            found.to_string(),
            format!("task {pid} (sleep) is stopped (SIGSTOP, SIGTSTP or job control)")
        );
        assert_eq!(traced_task(pid), None);
        // It is the tree's own: nothing outside it.
        assert_eq!(outside_tree(pid, &[pid]), None);
        let me = std::process::id() as i32;
        assert_eq!(outside_tree(pid, &[pid, me]).map(|t| t.tid), Some(me));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
        while task_state(pid) == Some('T') {
            assert!(start.elapsed().as_secs() < 10);
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(stopped_task(pid), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_frozen_stopped_task_is_told_by_its_kernel_function() {
        assert!(is_stopped('T', "do_signal_stop"));
        assert!(is_stopped('t', "ptrace_stop"));
        assert!(is_stopped('D', "do_signal_stop"));
        assert!(!is_stopped('D', "__refrigerator"));
        assert!(!is_stopped('S', "do_wait"));
        let traced = BlockedTask {
            tid: 3,
            comm: "sh".into(),
            wchan: "do_wait".into(),
            state: 'S',
            tracer: 77,
        };
        assert_eq!(traced.to_string(), "task 3 (sh) is traced by pid 77");
    }

    /// A fake /proc: pid 1 (thread 1) with child 5 (threads 5 and 6); thread 6 has `state6`
    /// and `wchan6`.
    fn fake_proc(state6: char, wchan6: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let thread = |pid: i32, tid: i32, state: char, wchan: &str, children: &str| {
            let t = dir.path().join(format!("{pid}/task/{tid}"));
            std::fs::create_dir_all(&t).unwrap();
            std::fs::write(t.join("stat"), format!("{tid} (w{tid}) {state} 1 1")).unwrap();
            std::fs::write(t.join("wchan"), wchan).unwrap();
            std::fs::write(t.join("children"), children).unwrap();
        };
        thread(1, 1, 'S', "do_wait", "5 ");
        thread(5, 5, 'R', "0", "");
        thread(5, 6, state6, wchan6, "");
        dir
    }

    #[test]
    fn finds_a_blocked_thread_of_a_descendant() {
        let p = fake_proc('D', "folio_wait_bit_common");
        let found = find(p.path(), 1, |s, _| s == 'D').unwrap();
        assert_eq!(
            found,
            BlockedTask {
                tid: 6,
                comm: "w6".into(),
                wchan: "folio_wait_bit_common".into(),
                state: 'D',
                tracer: 0,
            }
        );
        assert!(!found.in_vfork());
        assert_eq!(
            found.to_string(),
            "task 6 (w6) is in uninterruptible sleep in folio_wait_bit_common"
        );
        let p = fake_proc('S', "hrtimer_nanosleep");
        assert_eq!(find(p.path(), 1, |s, _| s == 'D'), None);
        // A tree that is gone has nothing blocked.
        assert_eq!(find(p.path(), 99, |s, _| s == 'D'), None);
    }

    #[test]
    fn a_vfork_parent_is_told_from_a_frozen_task() {
        let vfork = |state, wchan| {
            find(fake_proc(state, wchan).path(), 1, |s, w| {
                s == 'D' && is_vfork_wait(w)
            })
        };
        // Frozen in a freezable sleep: reads D, but CRIU can stop it.
        assert_eq!(vfork('D', "hrtimer_nanosleep"), None);
        assert_eq!(vfork('D', "__refrigerator"), None);
        let parent = vfork('D', "kernel_clone").unwrap();
        assert!(parent.in_vfork());
        assert_eq!(
            parent.to_string(),
            "task 6 (w6) is in vfork, waiting for its child to exec"
        );
        assert!(vfork('D', "_do_fork").is_some());
    }
}
