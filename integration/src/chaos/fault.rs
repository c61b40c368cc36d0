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
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::InitKillGap,
        Kind::InitKillAction,
        Kind::InitKillCheckpoint,
        Kind::CriuKillDump,
        Kind::RaceCheckpoint,
        Kind::RaceRestore,
        Kind::RaceFork,
        Kind::RaceRm,
        Kind::Corrupt,
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
        }
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
                "the checkpoint fails; the sandbox runs on, same init, memory intact, nothing partial"
            }
            Kind::RaceCheckpoint => "succeeds or waits; the action is unaffected",
            Kind::RaceRestore => "restored; the environment is at the restored journal position",
            Kind::RaceFork => "the fork runs the checkpoint's state; the source is unaffected",
            Kind::RaceRm => "removed, or refused as in use; nothing listed fails verification",
            Kind::Corrupt => "a restore of it is refused naming the file; the sandbox is untouched",
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
