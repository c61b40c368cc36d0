//! A container's cgroup v1 freezer, read directly: which tasks it holds and whether it is
//! FROZEN. Used around a dump that seizes tasks one by one (see [`crate::runc::Seize`]), where
//! CRIU thaws the cgroup and freezes it again itself.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The v1 freezer cgroup of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Freezer {
    dir: PathBuf,
}

impl Freezer {
    /// The freezer cgroup task `pid` is in, under the host's freezer mount; `None` where there
    /// is no v1 freezer or `pid` is gone.
    pub(crate) fn of(pid: i32) -> Option<Self> {
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let dir = freezer_dir(&mountinfo, &cgroup)?;
        dir.join("freezer.state").exists().then_some(Self { dir })
    }

    /// The cgroup's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// `freezer.state`: THAWED, FREEZING or FROZEN.
    pub(crate) fn state(&self) -> std::io::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join("freezer.state"))?
            .trim()
            .to_string())
    }

    /// Every task (thread id) of the cgroup and of its descendants.
    pub(crate) fn tasks(&self) -> Vec<i32> {
        let mut found = Vec::new();
        let mut pending = vec![self.dir.clone()];
        while let Some(dir) = pending.pop() {
            let tasks = std::fs::read_to_string(dir.join("tasks")).unwrap_or_default();
            found.extend(
                tasks
                    .split_whitespace()
                    .filter_map(|t| t.parse::<i32>().ok()),
            );
            if let Ok(entries) = std::fs::read_dir(&dir) {
                pending.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        found
    }

    /// Waits up to `limit` for the cgroup to read FROZEN (a write of FROZEN returns while the
    /// kernel still freezes, FREEZING); the state it reads last when it does not.
    pub(crate) fn wait_frozen(&self, limit: Duration) -> Result<(), String> {
        let start = Instant::now();
        loop {
            let state = self.state().unwrap_or_else(|e| format!("unreadable ({e})"));
            if state == "FROZEN" {
                return Ok(());
            }
            // THAWED: nothing is freezing it; its tasks already run.
            if state != "FREEZING" || start.elapsed() >= limit {
                return Err(state);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// The freezer cgroup directory of a task whose `/proc/<pid>/cgroup` is `cgroup`, under the
/// freezer hierarchy's mount point in `mountinfo` (`/proc/self/mountinfo`, whose root is `/`).
fn freezer_dir(mountinfo: &str, cgroup: &str) -> Option<PathBuf> {
    let path = cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "freezer")
            .then_some(path)
    })?;
    let mount = mountinfo.lines().find_map(|l| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL…] - FSTYPE SOURCE SUPER-OPTIONS
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split_whitespace();
        let (fstype, _source, options) = (r.next()?, r.next()?, r.next()?);
        let mut f = left.split_whitespace();
        let root = f.nth(3)?;
        let point = f.next()?;
        (fstype == "cgroup" && root == "/" && options.split(',').any(|o| o == "freezer"))
            .then_some(point)
    })?;
    Some(Path::new(mount).join(path.trim_start_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
38 30 0:34 / /sys/fs/cgroup/freezer rw,relatime shared:12 - cgroup cgroup rw,freezer
40 30 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_freezer_dir_joins_the_mount_and_the_tasks_path() {
        let cgroup = "12:pids:/default/c1\n6:freezer:/default/c1\n0::/\n";
        assert_eq!(
            freezer_dir(MOUNTINFO, cgroup),
            Some(PathBuf::from("/sys/fs/cgroup/freezer/default/c1"))
        );
        // Co-mounted controllers, and a path with a colon in it.
        let comounted = MOUNTINFO.replace("rw,freezer", "rw,freezer,devices");
        assert_eq!(
            freezer_dir(&comounted, "4:devices,freezer:/a:b\n"),
            Some(PathBuf::from("/sys/fs/cgroup/freezer/a:b"))
        );
        // cgroup v2 only: no freezer hierarchy.
        assert_eq!(freezer_dir(MOUNTINFO, "0::/system.slice/c1\n"), None);
        let v2 = MOUNTINFO.replace("rw,freezer", "rw,blkio");
        assert_eq!(freezer_dir(&v2, "6:freezer:/c1\n"), None);
    }

    #[test]
    fn tasks_are_read_from_the_cgroup_and_its_children() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tasks"), "1\n7\n").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/tasks"), "9\n").unwrap();
        std::fs::write(dir.path().join("freezer.state"), "FREEZING\n").unwrap();
        let f = Freezer {
            dir: dir.path().to_path_buf(),
        };
        let mut tasks = f.tasks();
        tasks.sort_unstable();
        assert_eq!(tasks, vec![1, 7, 9]);
        assert_eq!(
            f.wait_frozen(Duration::from_millis(20)),
            Err("FREEZING".into())
        );
        std::fs::write(dir.path().join("freezer.state"), "THAWED\n").unwrap();
        let start = Instant::now();
        assert_eq!(f.wait_frozen(Duration::from_secs(5)), Err("THAWED".into()));
        assert!(start.elapsed() < Duration::from_secs(1), "THAWED is final");
        std::fs::write(dir.path().join("freezer.state"), "FROZEN\n").unwrap();
        assert_eq!(f.wait_frozen(Duration::ZERO), Ok(()));
    }
}
