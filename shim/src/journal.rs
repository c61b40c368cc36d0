//! The action journal: every exec of a container (args, cwd, env digest, start, end, exit code)
//! in order, and which journal position each checkpoint captured. After a restore the agent loop
//! learns which actions the environment reflects ("checkpoint X, taken after action k").
//!
//! Kept under the store, root-only: `journal/<namespace>/<container>.jsonl` (one entry a line,
//! rewritten when a restore rewinds it) and `journal/<namespace>/<container>.checkpoints.json`
//! (checkpoint id → actions completed at its instant).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::Digest;

pub use belayer_api::journal::Entry;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Suffix of a container's journal file of entries, one a line.
const ENTRIES: &str = ".jsonl";
/// Suffix of a container's journal file of checkpoint positions.
const POSITIONS: &str = belayer_api::journal::POSITIONS_SUFFIX;

/// A container's journal, in memory and on disk.
pub struct Journal {
    dir: PathBuf,
    id: String,
    pub entries: Vec<Entry>,
    /// Checkpoint id → number of actions completed at its instant.
    pub positions: BTreeMap<u64, u64>,
}

impl Journal {
    /// Opens (or starts) the journal of container `id` under `dir`.
    pub fn open(dir: PathBuf, id: &str) -> Self {
        let mut j = Self {
            dir,
            id: id.to_string(),
            entries: Vec::new(),
            positions: BTreeMap::new(),
        };
        j.entries = std::fs::read_to_string(j.file(ENTRIES))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        j.positions = std::fs::read(j.file(POSITIONS))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        j
    }

    /// Records the start of an exec; returns its index.
    pub fn start(&mut self, exec_id: &str, spec: &[u8], after_checkpoint: Option<u64>) -> u64 {
        let spec: serde_json::Value = serde_json::from_slice(spec).unwrap_or_default();
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let env = strings(&spec["env"]).join("\n");
        let index = self.entries.len() as u64 + 1;
        self.entries.push(Entry {
            index,
            exec_id: exec_id.to_string(),
            args: strings(&spec["args"]),
            cwd: spec["cwd"].as_str().unwrap_or("/").to_string(),
            env_sha256: format!("{:x}", sha2::Sha256::digest(env.as_bytes())),
            started_unix_ms: now_ms(),
            ended_unix_ms: None,
            exit_code: None,
            after_checkpoint,
            spec,
        });
        index
    }

    /// Records an exec's exit.
    pub fn finish(&mut self, exec_id: &str, exit_code: u32) {
        if let Some(e) = self
            .entries
            .iter_mut()
            .rev()
            .find(|e| e.exec_id == exec_id && e.exit_code.is_none())
        {
            e.ended_unix_ms = Some(now_ms());
            e.exit_code = Some(exit_code);
            let line = serde_json::to_string(e).unwrap_or_default();
            self.persist(ENTRIES, |path| {
                let mut f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                writeln!(f, "{line}")
            });
        }
    }

    /// Exec `exec_id` is journalled as started and not yet ended.
    pub fn running(&self, exec_id: &str) -> bool {
        self.entries
            .iter()
            .any(|e| e.exec_id == exec_id && e.exit_code.is_none())
    }

    /// Actions completed so far (the journal position a checkpoint now would capture).
    pub fn completed(&self) -> u64 {
        self.entries
            .iter()
            .take_while(|e| e.exit_code.is_some())
            .count() as u64
    }

    /// Records that checkpoint `seq` captured the environment after `position` actions.
    pub fn checkpointed(&mut self, seq: u64, position: u64) {
        self.positions.insert(seq, position);
        let bytes = serde_json::to_vec(&self.positions).unwrap_or_default();
        self.persist(POSITIONS, |path| std::fs::write(path, bytes));
    }

    /// The actions after position `k`, which a restore to `k` undid.
    pub fn after(&self, k: u64) -> Vec<Entry> {
        self.entries
            .iter()
            .filter(|e| e.index > k)
            .cloned()
            .collect()
    }

    /// Forgets the actions after position `k` (a rewind) and rewrites the journal file.
    pub fn truncate(&mut self, k: u64) {
        self.entries.retain(|e| e.index <= k);
        let _ = std::fs::create_dir_all(&self.dir);
        let text: String = self
            .entries
            .iter()
            .filter_map(|e| serde_json::to_string(e).ok())
            .map(|l| l + "\n")
            .collect();
        self.persist(ENTRIES, |path| std::fs::write(path, text));
    }

    /// Path of this container's journal file `suffix` ([`ENTRIES`] or [`POSITIONS`]).
    fn file(&self, suffix: &str) -> PathBuf {
        self.dir.join(format!("{}{suffix}", self.id))
    }

    /// Writes journal file `suffix` with `write`. The journal in memory is the one the shim
    /// answers from; its files matter once the shim is gone. A write that failed (a full store
    /// disk) leaves the file behind the journal, so it is logged, naming the file, rather than
    /// failing the exec or checkpoint it records.
    fn persist(&self, suffix: &str, write: impl FnOnce(&Path) -> std::io::Result<()>) {
        let path = self.file(suffix);
        // Root-only (it holds every exec's environment), whatever the umask.
        let private = |p: &Path| {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)?;
            write(p)?;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600))
        };
        if let Err(e) = private(&path) {
            log::warn!(
                "journal file {} not updated ({e}); it lags the journal in memory",
                path.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(args: &[&str]) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"args": args, "cwd": "/w", "env": ["A=1"]})).unwrap()
    }

    #[test]
    fn positions_rewind_and_persistence() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::open(dir.path().to_path_buf(), "c");
        for i in 0..4 {
            j.start(
                &format!("e{i}"),
                &spec(&["sh", "-c", &format!("echo {i}")]),
                None,
            );
            if i == 1 {
                j.checkpointed(7, j.completed());
            }
            j.finish(&format!("e{i}"), i);
        }
        assert_eq!(j.completed(), 4);
        assert_eq!(j.positions[&7], 1, "checkpoint 7 was taken after action 1");
        assert_eq!(j.entries[0].args, ["sh", "-c", "echo 0"]);
        assert_eq!(j.entries[0].cwd, "/w");
        let undone: Vec<u64> = j.after(1).iter().map(|e| e.index).collect();
        assert_eq!(undone, [2, 3, 4]);
        j.truncate(1);
        let reopened = Journal::open(dir.path().to_path_buf(), "c");
        assert_eq!(reopened.entries.len(), 1);
        assert_eq!(reopened.positions[&7], 1);
        assert_eq!(reopened.entries[0].exit_code, Some(0));
    }
}
