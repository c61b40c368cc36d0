//! A `runc restore` whose CRIU dies midway (SIGKILLed, OOM-killed, crashed). runc has CRIU
//! restore the root task as runc's own child, and CRIU's helpers are runc's children too, so
//! once CRIU is gone the tasks it forked and had not restored yet (still named `criu`) stay
//! under runc holding CRIU's end of runc's RPC socket: runc never sees CRIU go and waits for
//! ever — and whoever restores, holding the container, with it. Killed later, in its
//! post-restore phase, CRIU leaves runc failing but the restored tree running in the
//! container's cgroup, where the next restore finds it ("cgroup is not empty"), and its cgroup
//! yard (`.criu.cgyard.*`) mounted under the work dir.
//!
//! [`RestoreWatch`] follows the tree under `runc restore`: CRIU is the first `criu` under runc
//! (its forks start after it); when it has gone and tasks named `criu` (forked, not restored
//! yet) are still in the tree under runc [`STUCK_FOR`] later, it SIGKILLs every live task of
//! that tree, so runc fails. When the restore fails for any
//! reason, [`RestoreWatch::failed`] ends every task seen under it and unmounts what CRIU left
//! under the work dir: nothing of a failed restore survives it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

/// How often the tree under `runc restore` is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// How often runc's children are looked at until CRIU is known.
const FIRST_LOOKS: Duration = Duration::from_millis(5);
/// How long runc must have waited on unrestored forks with no CRIU before the tree is ended. A
/// restore that succeeds has every task renamed before CRIU exits, so this never waits on one.
const STUCK_FOR: Duration = Duration::from_millis(500);
/// At most this many tasks are followed.
const MAX_SEEN: usize = 4096;

/// A task, by pid and start time (a pid reused meanwhile is another task).
type Seen = HashMap<i32, u64>;

/// Watches one `runc restore` of container `id` while it runs.
pub(crate) struct RestoreWatch {
    done: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Seen>>,
    work_dir: PathBuf,
}

impl RestoreWatch {
    /// Starts watching the `runc restore` of `id` (by the runc of state dir `root`) that is
    /// about to run with `work_dir`.
    pub fn arm(id: &str, root: &Path, work_dir: &Path) -> Self {
        let (done, rx) = mpsc::channel::<()>();
        let id = id.to_string();
        let root = root.to_path_buf();
        let thread = std::thread::Builder::new()
            .name("belayer-restore-watch".into())
            .spawn(move || watch(&id, &root, &rx))
            .map_err(|e| tracing::error!(error = %e, "cannot start the restore watch"))
            .ok();
        Self {
            done: Some(done),
            thread,
            work_dir: work_dir.to_path_buf(),
        }
    }

    /// The restore succeeded: stop watching.
    pub fn disarm(mut self) {
        self.finish();
    }

    /// The restore failed: SIGKILL every task seen under it that still runs, and unmount what
    /// CRIU left mounted under the work dir.
    pub fn failed(mut self) {
        let seen = self.finish();
        let left: Vec<i32> = seen
            .iter()
            .filter(|(pid, start)| start_time(**pid) == Some(**start))
            .map(|(pid, _)| *pid)
            .collect();
        if !left.is_empty() {
            tracing::warn!(tasks = ?left, "a failed restore left tasks running; ending them");
            left.iter().for_each(|&p| kill(p));
        }
        // containerd's bundle `work` is a link; mountinfo names the dir it leads to.
        let dir = std::fs::canonicalize(&self.work_dir).unwrap_or_else(|_| self.work_dir.clone());
        for target in mounts_under(&dir) {
            match crate::sys::umount(&target, true) {
                Ok(()) => {
                    tracing::info!(mount = %target.display(), "unmounted what a failed restore left")
                }
                Err(e) => {
                    tracing::warn!(mount = %target.display(), error = %e, "cannot unmount what a failed restore left")
                }
            }
        }
    }

    fn finish(&mut self) -> Seen {
        drop(self.done.take());
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for RestoreWatch {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Follows the tree under `runc restore … id` until `done` closes; returns every task seen in
/// it. Ends the tree once runc has waited on CRIU's unrestored forks with no CRIU for
/// [`STUCK_FOR`].
fn watch(id: &str, root: &Path, done: &mpsc::Receiver<()>) -> Seen {
    let mut seen = Seen::new();
    let mut runc: Option<(i32, u64)> = None;
    let mut criu: Option<(i32, u64)> = None;
    let mut stuck_since: Option<Instant> = None;
    loop {
        // Quick looks until CRIU is known: the first `criu` under runc is CRIU itself when it
        // is seen before it forks.
        let every = if criu.is_some() {
            LOOK_EVERY
        } else {
            FIRST_LOOKS
        };
        match done.recv_timeout(every) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return seen,
        }
        let (pid, start) = match runc {
            Some(r) => r,
            None => match crate::watch::runcs("restore", id, root)
                .first()
                .and_then(|&p| Some((p, start_time(p)?)))
            {
                Some(r) => {
                    runc = Some(r);
                    r
                }
                None => continue,
            },
        };
        if start_time(pid) != Some(start) {
            continue;
        }
        let tree = crate::watch::descendants(pid);
        for &task in &tree {
            if seen.len() >= MAX_SEEN {
                break;
            }
            if let Some(s) = start_time(task) {
                seen.entry(task).or_insert(s);
            }
        }
        let Some((criu_pid, criu_start)) = criu else {
            criu = children(pid)
                .into_iter()
                .filter(|&c| comm(c) == "criu" && !crate::blocked::is_dead(c))
                .filter_map(|c| Some((c, start_time(c)?)))
                .min_by_key(|(_, s)| *s);
            continue;
        };
        let alive = start_time(criu_pid) == Some(criu_start) && !crate::blocked::is_dead(criu_pid);
        // Tasks CRIU forked and had not restored yet keep its name; they may be runc's children
        // (the root task and CRIU's helpers) or below the root task.
        let live: Vec<i32> = tree
            .iter()
            .copied()
            .filter(|&t| t != criu_pid && !crate::blocked::is_dead(t))
            .collect();
        let unrestored = live.iter().any(|&t| comm(t) == "criu");
        if alive || !unrestored {
            stuck_since = None;
            continue;
        }
        let since = *stuck_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= STUCK_FOR {
            // Without CRIU no task of this restore can finish it: end them all, the half-
            // restored root task with them, so that runc sees CRIU's socket close and fails.
            tracing::warn!(container = id, runc = pid, criu = criu_pid, tasks = ?live, "CRIU died during the restore; ending the tasks it had forked");
            live.iter().for_each(|&p| kill(p));
            stuck_since = None;
        }
    }
}

/// The direct children of `pid`, over all its threads.
fn children(pid: i32) -> Vec<i32> {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    threads
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

fn kill(pid: i32) {
    // SAFETY: kill has no memory effects; a pid that has gone meanwhile gets ESRCH.
    unsafe { libc::kill(pid, libc::SIGKILL) };
}

/// The fields of `/proc/<pid>/stat` after the command (which may hold spaces and parentheses).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A task's start time (field 22 of `/proc/<pid>/stat`), in clock ticks after boot.
fn start_time(pid: i32) -> Option<u64> {
    // Fields after the command start at field 3 (state): 22 is index 19.
    stat_fields(pid)?.get(19)?.parse().ok()
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The mount points under `dir` (CRIU's `.criu.cgyard.*` and the like), deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_known_by_its_start_time() {
        let me = std::process::id() as i32;
        assert!(start_time(me).is_some());
        assert_eq!(start_time(i32::MAX), None);
    }

    #[test]
    fn the_children_of_a_task_are_those_of_all_its_threads() {
        let me = std::process::id() as i32;
        let mut child = std::thread::spawn(|| {
            std::process::Command::new("sleep")
                .arg("5")
                .spawn()
                .unwrap()
        })
        .join()
        .unwrap();
        assert!(children(me).contains(&(child.id() as i32)));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_watch_with_no_runc_sees_nothing_and_ends_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let w = RestoreWatch::arm("no-such-container-belayer", dir.path(), dir.path());
        std::thread::sleep(Duration::from_millis(120));
        assert!(mounts_under(dir.path()).is_empty());
        w.failed();
    }
}
