//! The kinds of fault the soak injects, how each is drawn, and the host-side probes an injection
//! needs (the CRIU dumping a container, a checkpoint being written).

use std::path::{Path, PathBuf};

use crate::Containerd;

/// One kind of fault. Each names what Belayer claims for it in [`Kind::claim`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// The sandbox's init SIGKILLed between actions (the model is thinking).
    InitKillGap,
    /// The init SIGKILLed while an action's exec runs.
    InitKillAction,
    /// The init SIGKILLed while a checkpoint of it is being written.
    InitKillCheckpoint,
    /// The CRIU dumping the sandbox SIGKILLed once its memory image is begun.
    CriuKillDump,
    /// An explicit `belayer checkpoint` racing an action and the automatic checkpoints.
    RaceCheckpoint,
    /// An explicit `belayer restore` of the newest checkpoint, racing the automatic ones.
    RaceRestore,
    /// An explicit `belayer fork` of the newest checkpoint; the fork is checked and removed.
    RaceFork,
    /// An explicit `belayer rm` of the oldest checkpoint, racing retention.
    RaceRm,
    /// One byte of the newest checkpoint's largest CRIU image flipped on disk.
    Corrupt,
    /// The sandbox's shim SIGKILLed; the framework then runs `belayer restore`.
    ShimKill,
    /// The CRIU restoring the sandbox SIGKILLed, during an explicit `belayer restore` or an
    /// automatic recovery.
    CriuKillRestore,
    /// The freshly restored init SIGKILLed right after a restore (an explicit `belayer
    /// restore`, or the automatic recovery after an init kill).
    InitKillRestore,
    /// The lazy-pages daemon filling a lazily restored sandbox's memory SIGKILLed mid-fill.
    LazyPagesKill,
    /// The soak's containerd SIGKILLed (or stopped) and started again, every trajectory held
    /// between turns meanwhile.
    ContainerdRestart,
    /// The store's (private, size-limited) filesystem filled, a checkpoint asked for, then freed.
    DiskFull,
    /// The reference rollout worker (the primary `belayer-worker` serving through the GPU
    /// broker, beside the sandboxes) SIGKILLed mid-generation.
    WorkerKill,
}

impl Kind {
    pub const ALL: [Kind; 16] = [
        Kind::InitKillGap,
        Kind::InitKillAction,
        Kind::InitKillCheckpoint,
        Kind::CriuKillDump,
        Kind::RaceCheckpoint,
        Kind::RaceRestore,
        Kind::RaceFork,
        Kind::RaceRm,
        Kind::Corrupt,
        Kind::ShimKill,
        Kind::CriuKillRestore,
        Kind::InitKillRestore,
        Kind::LazyPagesKill,
        Kind::ContainerdRestart,
        Kind::DiskFull,
        Kind::WorkerKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::InitKillGap => "init-kill-gap",
            Kind::InitKillAction => "init-kill-action",
            Kind::InitKillCheckpoint => "init-kill-checkpoint",
            Kind::CriuKillDump => "criu-kill-dump",
            Kind::RaceCheckpoint => "race-checkpoint",
            Kind::RaceRestore => "race-restore",
            Kind::RaceFork => "race-fork",
            Kind::RaceRm => "race-rm",
            Kind::Corrupt => "corrupt-newest",
            Kind::ShimKill => "shim-kill",
            Kind::CriuKillRestore => "criu-kill-restore",
            Kind::InitKillRestore => "init-kill-restore",
            Kind::LazyPagesKill => "lazy-pages-kill",
            Kind::ContainerdRestart => "containerd-restart",
            Kind::DiskFull => "disk-full",
            Kind::WorkerKill => "worker-kill",
        }
    }

    /// Whether the fault touches every sandbox at once (it runs with every trajectory held
    /// between turns).
    pub fn global(self) -> bool {
        matches!(self, Kind::ContainerdRestart | Kind::DiskFull)
    }

    /// Whether the claim is containerd's alone, so that a sandbox whose client is docker does
    /// not draw it. Both end with the framework's `belayer restore` after the container's task
    /// has exited (a shim's death ends it; a recovery whose CRIU was killed gives up), and
    /// dockerd, on a task's exit, records the container as exited and deletes its containerd
    /// container (seen: "container … not found" for that restore): docker's way back is its
    /// own `docker start`, a fresh task.
    pub fn containerd_only(self) -> bool {
        matches!(self, Kind::ShimKill | Kind::CriuKillRestore)
    }

    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What Belayer guarantees after this fault, which the soak checks.
    pub fn claim(self) -> &'static str {
        match self {
            Kind::InitKillGap | Kind::InitKillAction => {
                "recovered from the newest checkpoint; the environment is at the journal position"
            }
            Kind::InitKillCheckpoint => {
                "the checkpoint fails or becomes the newest; recovered from the newest"
            }
            Kind::CriuKillDump => {
                "the checkpoint fails, nothing partial; the sandbox runs on, same init, memory \
                 intact — or, when CRIU died with a task stopped at its parasite's trap (that task \
                 then takes the SIGTRAP, exit 133), it is recovered from the newest checkpoint"
            }
            Kind::RaceCheckpoint => "succeeds or waits; the action is unaffected",
            Kind::RaceRestore => "restored; the environment is at the restored journal position",
            Kind::RaceFork => "the fork runs the checkpoint's state; the source is unaffected",
            Kind::RaceRm => "removed, or refused as in use; nothing listed fails verification",
            Kind::Corrupt => "a restore of it is refused naming the file; the sandbox is untouched",
            Kind::ShimKill => {
                "containerd removes the task (its processes die with the shim); belayer restore \
                 brings back the newest checkpoint; the environment is at its journal position"
            }
            Kind::CriuKillRestore => {
                "the restore fails with a clear error (or completes); the sandbox is recovered, or \
                 restored again by the framework, never left half-restored; the checkpoint verifies"
            }
            Kind::InitKillRestore => {
                "recovered again, from the newest checkpoint; the environment is at its journal \
                 position"
            }
            Kind::LazyPagesKill => {
                "the shim ends the container rather than let it run on holes, and says why; \
                 recovered from the newest checkpoint, at its journal position"
            }
            Kind::ContainerdRestart => {
                "every sandbox runs on (same pid, same status in containerd's list); a checkpoint \
                 and a recovery work after it"
            }
            Kind::DiskFull => {
                "a checkpoint on the full disk fails naming it; the sandbox runs on; nothing \
                 partial is listed or left; once freed, the next checkpoint works"
            }
            Kind::WorkerKill => {
                "the pre-started shadow takes over within 60 s, rebuilds the KV from the broker's \
                 token log and the request completes with exactly an unkilled run's tokens; a new \
                 shadow is up for the next kill"
            }
        }
    }
}

/// The faults to draw from and how often, per turn of a trajectory.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Kinds drawn, uniformly.
    pub kinds: Vec<Kind>,
    /// Probability that a turn carries a fault.
    pub rate: f64,
    /// Turns after a fault before the next can be drawn (so an automatic checkpoint lands
    /// between crashes: three recoveries from one checkpoint in 60 s end recovery by design).
    pub spacing: u64,
}

impl Schedule {
    pub fn draw(&self, rng: &mut super::rng::Rng) -> Option<Kind> {
        if self.kinds.is_empty() || !rng.chance(self.rate) {
            return None;
        }
        let i = rng.range(0, self.kinds.len() as u64) as usize;
        Some(self.kinds[i])
    }
}

/// The pending (being written) checkpoint directory of `id`, if a checkpoint is under way.
pub fn pending_checkpoint(c: &Containerd, id: &str) -> Option<PathBuf> {
    std::fs::read_dir(c.checkpoints_dir(id))
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .map(|e| e.path())
}

/// The pid of the CRIU dumping container `id` (init `init`) once its memory image is begun, as
/// in `tests/checkpoint_errors.rs`: CRIU retitles runc's `criu swrk 3` as
/// `criu: dump --rpc -t <init>`.
pub fn dumping_criu(c: &Containerd, id: &str, init: &str) -> Option<i64> {
    let pending = pending_checkpoint(c, id)?.join("criu");
    let writing = std::fs::read_dir(&pending).ok()?.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("pages-") && e.metadata().is_ok_and(|m| m.len() > 0)
    });
    if !writing {
        return None;
    }
    let title = format!("dump --rpc -t {init}");
    crate::leaks::pids_mentioning(&title)
        .into_iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                String::from_utf8_lossy(&raw)
                    .trim_end_matches(['\0', ' '])
                    .ends_with(&title)
            })
        })
        .map(i64::from)
}

/// The largest regular file directly under `dir`.
pub fn largest_file(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            m.is_file().then(|| (m.len(), e.path()))
        })
        .max()
        .map(|(_, p)| p)
}

/// Flips the byte in the middle of `file`; returns the file's name.
pub fn flip_byte(file: &Path) -> std::io::Result<String> {
    let mut bytes = std::fs::read(file)?;
    if bytes.is_empty() {
        return Err(std::io::Error::other("empty file"));
    }
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(file, bytes)?;
    Ok(file
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// The CRIU restoring container `id`: a `criu` process below the container's shim (`runc
/// restore` runs `criu swrk`), not the lazy-pages daemon, the top one of its tree (the restored
/// tasks are CRIU's forks until they become the container's processes).
pub fn restoring_criu(id: &str) -> Option<i64> {
    let shims = crate::leaks::pids_with_args(&["-id", id]);
    let [shim] = shims[..] else {
        return None;
    };
    let procs = processes();
    let mut below = vec![shim];
    let mut found = None;
    while let Some(parent) = below.pop() {
        for p in procs.iter().filter(|p| p.ppid == parent) {
            // runc's `criu swrk` under a `runc restore`: not the lazy-pages daemon, not a dump's
            // (under `runc checkpoint`), and not the `criu --version` the shim runs before each
            // restore, which the 30-minute soak killed and then took the shim for runc.
            let under_restore = procs
                .iter()
                .find(|q| q.pid == p.ppid)
                .is_some_and(|q| q.comm == "runc" && q.cmdline.contains(" restore "));
            let criu = p.comm == "criu" && p.cmdline.contains("swrk") && under_restore;
            if criu {
                found = Some(i64::from(p.pid));
                break;
            }
            below.push(p.pid);
        }
        if found.is_some() {
            break;
        }
    }
    found
}

/// One process of the machine, as `/proc` shows it.
#[derive(Clone, Debug)]
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// The state letter of `/proc/PID/stat` (`R`, `S`, `D`, `Z`, …).
    pub state: String,
    pub cmdline: String,
}

/// Every process of the machine (those that vanish meanwhile are left out).
pub fn processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
            let open = stat.find('(')?;
            let close = stat.rfind(')')?;
            let comm = stat[open + 1..close].to_string();
            let mut rest = stat[close + 1..].split_whitespace();
            let state = rest.next()?.to_string();
            let ppid = rest.next()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
                .unwrap_or_default();
            Some(Proc {
                pid,
                ppid,
                comm,
                state,
                cmdline,
            })
        })
        .collect()
}

/// `pid` and every task below it, each as `pid comm state wchan` (the wchans of all its threads,
/// deduplicated): what a hung process waits on, for a report.
pub fn describe_tree(pid: u32) -> String {
    let procs = processes();
    let mut out = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let mut wchans: Vec<String> = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("wchan")).ok())
            .collect();
        wchans.sort();
        wchans.dedup();
        let (comm, state) = procs
            .iter()
            .find(|x| x.pid == p)
            .map_or(("?", "gone"), |x| (x.comm.as_str(), x.state.as_str()));
        out.push(format!("{p} {comm} {state} [{}]", wchans.join(",")));
        next.extend(procs.iter().filter(|x| x.ppid == p).map(|x| x.pid));
    }
    out.join("; ")
}

/// The parent of `pid` (0 when it is gone).
pub fn parent_of(pid: i64) -> u32 {
    processes()
        .into_iter()
        .find(|p| i64::from(p.pid) == pid)
        .map_or(0, |p| p.ppid)
}

/// Whether `pid` is gone (or a zombie nobody has reaped yet).
pub fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rfind(')')
            .and_then(|close| stat[close + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

/// The processes in the container cgroup of `init` (the `pids` controller's on a cgroup v1
/// host, else the v2 one under `cgroup_root`) that descend neither from `init` nor from the
/// container's shim `shim` (whose children are the execs): what a restore that failed half-way
/// left running beside the container's own processes.
pub fn strays(init: i64, shim: u32, cgroup_root: &Path) -> Vec<Proc> {
    let Ok(cgroups) = std::fs::read_to_string(format!("/proc/{init}/cgroup")) else {
        return Vec::new();
    };
    let procs_file = cgroups
        .lines()
        .find_map(|l| {
            let path = l.split_once(":pids:")?.1;
            Some(Path::new("/sys/fs/cgroup/pids").join(path.trim_start_matches('/')))
        })
        .or_else(|| {
            let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
            Some(cgroup_root.join(path.trim_start_matches('/')))
        })
        .map(|dir| dir.join("cgroup.procs"));
    let Some(members) = procs_file.and_then(|f| std::fs::read_to_string(f).ok()) else {
        return Vec::new();
    };
    let procs = processes();
    let parent = |pid: u32| procs.iter().find(|p| p.pid == pid).map_or(0, |p| p.ppid);
    members
        .lines()
        .filter_map(|l| l.trim().parse::<u32>().ok())
        .filter(|&pid| {
            let mut p = pid;
            for _ in 0..64 {
                if i64::from(p) == init || p == shim {
                    return false;
                }
                if p <= 1 {
                    return true;
                }
                p = parent(p);
            }
            true
        })
        .filter_map(|pid| procs.iter().find(|p| p.pid == pid))
        .cloned()
        .collect()
}

/// Whether `dir` is the mount point of a tmpfs the soak mounted itself (under
/// `/tmp/belayer-chaos-`): the only filesystem `disk-full` may fill.
pub fn private_tmpfs(dir: &Path) -> bool {
    let Some(path) = dir.to_str() else {
        return false;
    };
    path.starts_with("/tmp/belayer-chaos-")
        && std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let mut f = l.split_whitespace();
                f.nth(4) == Some(path) && l.contains(" - tmpfs ")
            })
}

/// Writes zeros to `file` until its filesystem is full (ENOSPC); returns the bytes written.
pub fn fill(file: &Path) -> std::io::Result<u64> {
    use std::io::Write;
    let mut f = std::fs::File::create(file)?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => return Ok(written),
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Ok(written),
            Err(e) => return Err(e),
        }
    }
}
