//! Automatic checkpoints and recovery: the shim feeds the node's checkpoint scheduler with
//! action boundaries and hints, checkpoints when it says the idle gap covers the cost, keeps the
//! newest K checkpoints, and restores a container whose init died on its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criu_bridge::store::{CompactCheckpointError, StoreError};
use log::{debug, info, warn};
use scheduler::{CheckpointCost, Decision, DeferReason, Footprint, Hint};
use serde::{Deserialize, Serialize};

use crate::api::RestoreInfo;
use crate::container::Container;
use crate::error::Result;
use crate::task::{EXEC_NOT_STARTED, Inner, SIGKILLED};

pub const CHECKPOINT_ANNOTATION: &str = "io.belayer.checkpoint";
pub const RECOVER_ANNOTATION: &str = "io.belayer.recover";
pub const POLICY_ANNOTATION: &str = "io.belayer.policy";
pub const KEEP_ANNOTATION: &str = "io.belayer.keep";
/// How soon an automatic checkpoint skipped for a task that could not be stopped is considered
/// again.
const BLOCKED_RETRY: Duration = Duration::from_millis(100);
/// How long automatic checkpoints of a container wait after one refused for a task CRIU cannot
/// take (nothing was frozen), and after one abandoned at the frozen bound (the container was
/// frozen that long: another attempt at the next action would freeze it again). Each one more
/// in a row doubles the wait, up to [`BACKOFF_MAX`].
const UNSUPPORTED_BACKOFF: Duration = Duration::from_secs(2);
const STALLED_BACKOFF: Duration = Duration::from_secs(30);
const BACKOFF_MAX: Duration = Duration::from_secs(600);
/// Recoveries in a row from one checkpoint, the first of them under [`CRASH_LOOP_WINDOW_MS`]
/// ago, after which a death of the init is left alone: the checkpoint itself leads to the crash,
/// and restoring it again would only repeat it.
const CRASH_LOOP_RECOVERIES: usize = 3;
/// A replayed action may take this many times as long as it took at first, and at least
/// [`REPLAY_MIN`], before it is killed: the container is held while actions replay.
const REPLAY_SLACK: u32 = 4;
const REPLAY_MIN: Duration = Duration::from_secs(30);
const CRASH_LOOP_WINDOW_MS: u64 = 60_000;
/// Topic of the event published when a container was recovered (a `TaskStart` with the new pid).
pub const RECOVERED_TOPIC: &str = "/tasks/belayer/recovered";

/// What Belayer does for one container, from its annotations and the node's settings.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ContainerPolicy {
    /// Checkpoint automatically at action boundaries.
    pub auto: bool,
    /// Restore the newest checkpoint when init dies without a kill from containerd.
    pub recover: bool,
    /// After a restore, re-run the journalled actions the checkpoint does not reflect.
    pub replay: bool,
    /// Checkpoints kept by automatic checkpointing.
    pub keep: usize,
}

impl ContainerPolicy {
    pub fn from_spec(spec: &crate::spec::Spec, settings: &crate::settings::Settings) -> Self {
        let get = |key: &str, default: &str| spec.annotation(key).unwrap_or(default).to_string();
        Self {
            auto: get(CHECKPOINT_ANNOTATION, &settings.checkpoint) == "auto",
            recover: get(RECOVER_ANNOTATION, &settings.recover) == "auto",
            replay: get(POLICY_ANNOTATION, &settings.policy) == "replay",
            keep: get(KEEP_ANNOTATION, "")
                .parse()
                .unwrap_or(settings.keep)
                .max(1),
        }
    }
}

/// Which journalled actions the environment reflects after a restore.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Position {
    pub checkpoint: String,
    /// Actions 1..=k are reflected; later ones were undone.
    pub action: u64,
    pub reflects: String,
    pub policy: String,
    /// For `replay`: the actions re-run, and those whose exit code differed.
    pub replayed: u64,
    pub mismatches: Vec<String>,
}

/// Automatic checkpoints of one container skipped in a row (a task could not be stopped).
#[derive(Debug, Default)]
pub struct Skips {
    /// How many.
    pub count: u32,
    /// A look again is scheduled.
    pub retry_pending: bool,
    /// No automatic checkpoint before this (see [`STALLED_BACKOFF`]).
    pub backoff_until: Option<Instant>,
}

/// The wait after the `count`-th refused or abandoned checkpoint in a row, from `first`.
fn backoff(first: Duration, count: u32) -> Duration {
    first
        .saturating_mul(1 << count.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}

/// One automatic recovery.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recovery {
    pub at_unix_ms: u64,
    pub exit_status: u32,
    pub restore: RestoreInfo,
    pub position: Option<Position>,
}

/// Resident memory of `pid`'s cgroup, the best cheap proxy for what CRIU must write (this kernel
/// has no dirty-page tracking).
fn footprint(pid: u32) -> Footprint {
    let rss = crate::cgroup::memory_usage(pid);
    Footprint {
        dirty_bytes: rss,
        resident_bytes: rss,
        fs_changed_bytes: 0,
    }
}

impl Inner {
    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    fn sched(&self) -> std::sync::MutexGuard<'_, scheduler::NodeScheduler> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A container appeared.
    pub fn track(&self, c: &Container) {
        if c.policy.auto {
            self.sched().on_container_start(&c.id, self.now());
        }
    }

    pub fn untrack(&self, id: &str) {
        self.sched().remove_container(id);
        self.skips
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// An exec of `c` starts: journal it, tell the scheduler.
    pub fn exec_started(&self, c: &mut Container, exec_id: &str, spec: &[u8]) {
        let newest =
            c.fs.as_ref()
                .and_then(|f| f.parent.as_ref())
                .map(|p| p.manifest.seq);
        c.journal.start(exec_id, spec, newest);
        if c.policy.auto {
            self.sched().on_exec_start(&c.id, self.now());
        }
    }

    /// An exec of `c` exited: journal it, tell the scheduler, maybe checkpoint.
    pub fn exec_exited(self: &Arc<Self>, c: &mut Container, exec_id: &str, code: u32) {
        c.journal.finish(exec_id, code);
        if c.policy.auto {
            self.sched().on_exec_exit(&c.id, self.now());
            if !c
                .execs
                .values()
                .any(|p| p.is_running() && p.exec_id != exec_id)
            {
                self.consider(&c.id);
            }
        }
    }

    /// A hint from the agent loop.
    pub fn hint(self: &Arc<Self>, id: &str, hint: Hint) -> Result<()> {
        self.get(id)?;
        self.sched().on_hint(id, hint, self.now());
        self.consider(id);
        Ok(())
    }

    /// Asks the scheduler whether to checkpoint `id` now, and acts on the answer.
    pub fn consider(self: &Arc<Self>, id: &str) {
        let decision = self.sched().decide(id, self.now());
        match decision {
            Decision::CheckpointNow | Decision::Force if self.backing_off(id) => {
                debug!("container {id}: automatic checkpoint backing off");
            }
            Decision::CheckpointNow | Decision::Force => {
                let (inner, id) = (self.clone(), id.to_string());
                tokio::spawn(async move { inner.auto_checkpoint(&id, decision).await });
            }
            Decision::Defer {
                reason:
                    DeferReason::GapTooShort {
                        recheck_at: Some(at),
                        ..
                    },
            } => {
                let (inner, id) = (self.clone(), id.to_string());
                let wait = at.saturating_sub(self.now());
                tokio::spawn(async move {
                    tokio::time::sleep(wait).await;
                    inner.consider(&id);
                });
            }
            Decision::Defer { .. } => {}
        }
    }

    /// Automatic checkpoints of `id` wait after a refused or abandoned one.
    fn backing_off(&self, id: &str) -> bool {
        self.skips
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .and_then(|s| s.backoff_until)
            .is_some_and(|until| Instant::now() < until)
    }

    /// An automatic checkpoint of `id` was refused (`Unsupported`) or abandoned (`Stalled`):
    /// the next waits, longer each time in a row.
    fn back_off(&self, id: &str, first: Duration, why: &str) {
        let _ = self.sched().on_checkpoint_failed(id);
        let mut skips = self.skips.lock().unwrap_or_else(|e| e.into_inner());
        // A container deleted meanwhile was untracked: an entry made now would outlive it.
        if self.get(id).is_err() {
            return;
        }
        let s = skips.entry(id.to_string()).or_default();
        s.count += 1;
        let wait = backoff(first, s.count);
        s.backoff_until = Some(Instant::now() + wait);
        warn!("container {id}: automatic checkpoint skipped, none tried for {wait:?}: {why}");
    }

    async fn auto_checkpoint(self: &Arc<Self>, id: &str, decision: Decision) {
        let pid = match self.get(id) {
            Ok(c) => c.lock().await.init.pid,
            Err(_) => return,
        };
        let fp = footprint(pid);
        let started = Instant::now();
        match self.checkpoint_when_free(id).await {
            Ok(info) => {
                let skipped = self
                    .skips
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(id)
                    .map_or(0, |s| s.count);
                if skipped > 1 {
                    info!("container {id}: automatic checkpoint taken after {skipped} skips");
                }
                // What the agent can wait for is the frozen window; the write that follows runs
                // beside its actions.
                let frozen = info.timings["frozen_us"].as_f64().map(|us| us / 1e6);
                let seconds = frozen.unwrap_or_else(|| started.elapsed().as_secs_f64());
                info!(
                    "container {id}: automatic checkpoint {} ({decision:?}) in {seconds:.2}s",
                    info.id
                );
                let _ = self.sched().on_checkpoint_done(
                    id,
                    CheckpointCost {
                        footprint: fp,
                        seconds,
                    },
                );
                if let Err(e) = self.retain(id).await {
                    warn!("container {id}: retention: {e}");
                }
            }
            Err(crate::error::Error::Unsupported(why)) => {
                self.back_off(id, UNSUPPORTED_BACKOFF, &why);
            }
            Err(crate::error::Error::Stalled(why)) => {
                self.back_off(id, STALLED_BACKOFF, &why);
            }
            Err(crate::error::Error::Blocked(why)) => {
                // Nothing was kept frozen. Such a wait is short (an exec after a vfork) or ends
                // with the disk's backlog; the scheduler may try again within the same gap.
                let _ = self.sched().on_checkpoint_failed(id);
                let retry = {
                    let mut skips = self.skips.lock().unwrap_or_else(|e| e.into_inner());
                    // A container deleted meanwhile was untracked (after it left the map): an
                    // entry made now would outlive it.
                    if self.get(id).is_err() {
                        return;
                    }
                    let s = skips.entry(id.to_string()).or_default();
                    s.count += 1;
                    if s.count == 1 {
                        info!("container {id}: automatic checkpoint skipped for now: {why}");
                    } else {
                        debug!("container {id}: automatic checkpoint skipped again: {why}");
                    }
                    !std::mem::replace(&mut s.retry_pending, true)
                };
                if retry {
                    let (inner, id) = (self.clone(), id.to_string());
                    tokio::spawn(async move {
                        tokio::time::sleep(BLOCKED_RETRY).await;
                        if let Some(s) = inner
                            .skips
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_mut(&id)
                        {
                            s.retry_pending = false;
                        }
                        inner.consider(&id);
                    });
                }
            }
            Err(e) => {
                warn!("container {id}: automatic checkpoint failed: {e}");
                let _ = self.sched().on_checkpoint_failed(id);
            }
        }
        // A permit came back: containers that were waiting for one.
        let waiting = self.sched().idle_candidates(self.now());
        for other in waiting {
            self.consider(&other);
        }
    }

    /// Keeps the newest K checkpoints, plus those the running rootfs stacks on (their layers are
    /// mounted). A checkpoint goes only when no pinned one needs its layer; a kept one whose chain
    /// reaches a deleted one is compacted first.
    async fn retain(&self, id: &str) -> Result<()> {
        let shared = self.get(id)?;
        // Deletes and compactions hold the store's container lock, which a checkpoint needs:
        // marked busy meanwhile, a checkpoint request waits for them instead of failing.
        let _busy = self.busy(id)?.when_free().await;
        let (keep, pinned) = {
            let c = shared.lock().await;
            (c.policy.keep, c.mount_chain.clone())
        };
        let store = self.store();
        let (ns, cid) = (self.namespace.clone(), id.to_string());
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut chains = std::collections::BTreeMap::new();
            let mut refs = Vec::new();
            for seq in store.list(&ns, &cid)? {
                let m = store.load(&ns, &cid, seq)?.manifest;
                refs.push(scheduler::CheckpointRef {
                    id: seq,
                    seq,
                    parent: m.parent,
                });
                chains.insert(seq, m.fs_chain);
            }
            let plan = scheduler::plan_retention(&refs, keep);
            let needed_by_pinned = |d: u64| {
                pinned
                    .iter()
                    .any(|p| chains.get(p).is_some_and(|c| c.contains(&d)))
            };
            let mut delete: Vec<u64> = plan
                .delete
                .into_iter()
                .filter(|d| !pinned.contains(d) && !needed_by_pinned(*d))
                .collect();
            if delete.is_empty() {
                return Ok(());
            }
            // Another container (a fork, a restored copy) may stack on a checkpoint: that one
            // stays whole, and so do the members of its chain. Newest first: a checkpoint is
            // compacted only once nothing stacks on its layer any more (the store refuses
            // otherwise), so every later one of the chain goes before it.
            let in_use = |e: &StoreError| {
                matches!(
                    e,
                    StoreError::InUse { .. }
                        | StoreError::InChain { .. }
                        | StoreError::UsedAsLower { .. }
                )
            };
            for (seq, chain) in chains.iter().rev() {
                if !delete.contains(seq)
                    && !pinned.contains(seq)
                    && chain.iter().any(|l| delete.contains(l))
                {
                    match store.compact(&ns, &cid, *seq) {
                        Ok(_) => {}
                        Err(CompactCheckpointError::Store(e)) if in_use(&e) => {
                            info!("container {cid}: retention keeps checkpoint {seq}'s chain: {e}");
                            delete.retain(|d| !chain.contains(d));
                        }
                        Err(e) => {
                            return Err(crate::error::Error::Checkpoint(crate::checkpoint::chain(
                                &e,
                            )));
                        }
                    }
                }
            }
            // Newest first too: the store refuses to delete a checkpoint while a later one (also
            // dropped) still stacks on its layer, so oldest first removed only the newest each
            // pass and the store grew past `keep` (found by the chaos soak).
            delete.sort_unstable_by(|a, b| b.cmp(a));
            for seq in delete {
                match store.delete(&ns, &cid, seq) {
                    Err(e) if in_use(&e) => {
                        info!("container {cid}: retention keeps checkpoint {seq}: {e}")
                    }
                    r => r?,
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| crate::error::Error::Checkpoint(e.to_string()))?
    }

    /// After a restore of `c` to checkpoint `seq`: where the journal stands, and for `replay`
    /// the re-run of the undone actions.
    pub async fn reposition(&self, c: &mut Container, seq: u64) -> Option<Position> {
        let k = *c.journal.positions.get(&seq)?;
        let undone = c.journal.after(k);
        let mut position = Position {
            checkpoint: seq.to_string(),
            action: k,
            reflects: format!("checkpoint {seq}, taken after action {k}"),
            policy: if c.policy.replay { "replay" } else { "rewind" }.into(),
            replayed: 0,
            mismatches: Vec::new(),
        };
        c.journal.truncate(k);
        if c.policy.replay {
            for e in undone {
                let (Some(ended), Some(_)) = (e.ended_unix_ms, e.exit_code) else {
                    // It was still running when the container died (or was restored): it got
                    // its exit then, and running it again would run it twice.
                    position.mismatches.push(format!(
                        "action {} ({}) was still running at the restore; not replayed",
                        e.index,
                        e.args.join(" ")
                    ));
                    continue;
                };
                let exec_id = format!("belayer-replay-{}", e.index);
                let mut spec = e.spec.clone();
                // Replayed without stdio: no terminal to give it.
                spec["terminal"] = serde_json::Value::Bool(false);
                let spec = serde_json::to_vec(&spec).unwrap_or_default();
                c.journal.start(&exec_id, &spec, Some(seq));
                let took = Duration::from_millis(ended.saturating_sub(e.started_unix_ms));
                let limit = (took * REPLAY_SLACK).max(REPLAY_MIN);
                let code = match self.run_quiet(c, &exec_id, &spec, limit).await {
                    Some(code) => code,
                    None => {
                        position.mismatches.push(format!(
                            "action {} ({}) was killed after {:.1} s in replay ({:.1} s at first)",
                            e.index,
                            e.args.join(" "),
                            limit.as_secs_f64(),
                            took.as_secs_f64()
                        ));
                        SIGKILLED
                    }
                };
                c.journal.finish(&exec_id, code);
                position.replayed += 1;
                if Some(code) != e.exit_code {
                    position.mismatches.push(format!(
                        "action {} ({}) exited {code}, journal says {:?}",
                        e.index,
                        e.args.join(" "),
                        e.exit_code
                    ));
                }
            }
            position.action = c.journal.completed();
        }
        c.position = Some(position.clone());
        Some(position)
    }

    /// Runs a process spec in `c` with no stdio and returns its exit code; `None` when it ran
    /// past `limit` and was killed (the container is held meanwhile).
    async fn run_quiet(
        &self,
        c: &Container,
        exec_id: &str,
        spec: &[u8],
        limit: Duration,
    ) -> Option<u32> {
        let path = c.exec_spec_path(exec_id);
        if std::fs::write(&path, spec).is_err() {
            return Some(EXEC_NOT_STARTED);
        }
        let paths = crate::stdio::StdioPaths::default();
        let started =
            crate::container::spawn_process(&self.runc, &c.id, &c.bundle, &paths, Some(&path))
                .await;
        let _ = std::fs::remove_file(&path);
        let Ok((pid, _io)) = started else {
            return Some(EXEC_NOT_STARTED);
        };
        let mut exited = std::pin::pin!(crate::reaper::watch(pid as i32));
        if let Ok(code) = tokio::time::timeout(limit, &mut exited).await {
            return Some(code.unwrap_or(255) as u32);
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = exited.await;
        None
    }

    /// Restores `id` after its init died on its own; `None` when recovery is off or impossible.
    /// An init that exited 0 finished rather than crashed and is not restored, nor is one caught
    /// in a crash loop ([`CRASH_LOOP_RECOVERIES`]). A checkpoint or restore under way is waited
    /// for (one taken as the init died fails, or is the newest to recover from).
    pub async fn recover(self: &Arc<Self>, id: &str, exit_status: u32) -> Option<Recovery> {
        let shared = self.get(id).ok()?;
        if !shared.lock().await.recovers_from(exit_status) {
            return None;
        }
        if exit_status == 0 {
            info!("container {id}: init exited 0; a finished container is not recovered");
            return None;
        }
        let busy = self.busy(id).ok()?.when_free().await;
        // containerd may have killed it meanwhile.
        let newest = self.store().list(&self.namespace, id).ok()?.last().copied();
        let c = shared.lock().await;
        let newest = newest.filter(|_| c.recovers_from(exit_status))?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if let Some(first) = crash_loop(&c.recoveries, newest, now_ms) {
            warn!(
                "container {id}: init died (exit status {exit_status}) after {CRASH_LOOP_RECOVERIES} \
                 recoveries from checkpoint {newest} in {:.1} s; not recovered again (a crash \
                 loop): the task stops",
                (now_ms - first) as f64 / 1000.0
            );
            return None;
        }
        drop(c);
        match self.restore_busy(&shared, busy, id, None).await {
            Ok(restore) => {
                let mut c = shared.lock().await;
                let rec = Recovery {
                    at_unix_ms: now_ms,
                    exit_status,
                    position: c.position.clone(),
                    restore,
                };
                c.recoveries.push(rec.clone());
                self.sched().on_restored(id, self.now());
                Some(rec)
            }
            Err(e) => {
                warn!("container {id}: automatic recovery failed: {e}");
                None
            }
        }
    }
}

impl Inner {
    pub async fn status(&self, id: &str) -> Result<crate::api::Status> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let checkpoints = self
            .store()
            .list(&self.namespace, id)?
            .iter()
            .map(u64::to_string)
            .collect();
        Ok(crate::api::Status {
            container: id.to_string(),
            namespace: self.namespace.clone(),
            pid: c.init.pid,
            policy: c.policy.clone(),
            checkpoints,
            actions: c.journal.completed(),
            position: c.position.clone(),
            recoveries: c.recoveries.clone(),
            fill_failure: c.fill_failure.clone(),
            // The control socket, which takes the hints, fills these in.
            hints: Default::default(),
        })
    }

    pub async fn journal(&self, id: &str) -> Result<Vec<crate::journal::Entry>> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        Ok(c.journal.entries.clone())
    }
}

/// When the newest [`CRASH_LOOP_RECOVERIES`] recoveries all restored `checkpoint`, the first of
/// them under [`CRASH_LOOP_WINDOW_MS`] before `now_ms`: that one's time.
fn crash_loop(recoveries: &[Recovery], checkpoint: u64, now_ms: u64) -> Option<u64> {
    let last = recoveries.get(recoveries.len().checked_sub(CRASH_LOOP_RECOVERIES)?..)?;
    let first = last.first()?.at_unix_ms;
    (last
        .iter()
        .all(|r| r.restore.checkpoint == checkpoint.to_string())
        && now_ms.saturating_sub(first) < CRASH_LOOP_WINDOW_MS)
        .then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_in_a_row_up_to_its_cap() {
        assert_eq!(backoff(STALLED_BACKOFF, 1), Duration::from_secs(30));
        assert_eq!(backoff(STALLED_BACKOFF, 2), Duration::from_secs(60));
        assert_eq!(backoff(STALLED_BACKOFF, 3), Duration::from_secs(120));
        assert_eq!(backoff(STALLED_BACKOFF, 9), BACKOFF_MAX);
        assert_eq!(backoff(UNSUPPORTED_BACKOFF, 0), UNSUPPORTED_BACKOFF);
        assert_eq!(backoff(UNSUPPORTED_BACKOFF, u32::MAX), BACKOFF_MAX);
    }

    fn recovery(checkpoint: u64, at_unix_ms: u64) -> Recovery {
        Recovery {
            at_unix_ms,
            exit_status: 137,
            restore: RestoreInfo {
                container: "c".into(),
                checkpoint: checkpoint.to_string(),
                pid: 1,
                verify_ms: 0,
                mount_ms: 0,
                restore_ms: 0,
                total_ms: 0,
                lazy_pages: false,
                position: None,
            },
            position: None,
        }
    }

    #[test]
    fn a_crash_loop_is_three_quick_recoveries_from_one_checkpoint() {
        let quick = [recovery(4, 1_000), recovery(4, 2_000), recovery(4, 3_000)];
        assert_eq!(crash_loop(&quick, 4, 4_000), Some(1_000));
        // A newer checkpoint since: the crash may not be the checkpoint's.
        assert_eq!(crash_loop(&quick, 5, 4_000), None);
        // Two are not a loop yet.
        assert_eq!(crash_loop(&quick[1..], 4, 4_000), None);
        assert_eq!(crash_loop(&[], 4, 4_000), None);
        // Spread over more than the window: crashes of their own.
        assert_eq!(crash_loop(&quick, 4, 1_000 + CRASH_LOOP_WINDOW_MS), None);
        // Only the newest ones count.
        let mixed = [
            recovery(3, 1_000),
            recovery(4, 2_000),
            recovery(4, 3_000),
            recovery(4, 3_500),
        ];
        assert_eq!(crash_loop(&mixed, 4, 4_000), Some(2_000));
        assert_eq!(crash_loop(&mixed[..3], 4, 4_000), None);
    }
}
