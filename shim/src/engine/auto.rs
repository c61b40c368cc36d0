//! Automatic checkpoints: the shim feeds the node's checkpoint scheduler with action boundaries
//! and hints, and checkpoints when it says the idle gap covers the cost (then [`retention`]
//! runs); a checkpoint refused or abandoned backs off.
//!
//! [`retention`]: super::retention

use std::sync::Arc;
use std::time::{Duration, Instant};

use criu_bridge::CheckpointError;
use log::{debug, info, warn};
use scheduler::{CheckpointCost, Decision, DeferReason, Footprint, Hint};

use super::Engine;
use crate::container::Container;
use crate::error::{Error, Result};

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

impl Engine {
    pub(super) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(super) fn sched(&self) -> std::sync::MutexGuard<'_, scheduler::NodeScheduler> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A container appeared.
    pub(super) fn track(self: &Arc<Self>, c: &Container) {
        if c.policy.auto {
            self.sched().on_container_start(&c.id, self.now());
            if c.policy.activity {
                self.watch_activity(&c.id);
            }
        }
    }

    pub(super) fn untrack(&self, id: &str) {
        self.sched().remove_container(id);
        self.skips
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// An exec of `c` starts: journal it, tell the scheduler.
    pub(super) fn exec_started(&self, c: &mut Container, exec_id: &str, spec: &[u8]) {
        let newest =
            c.fs.as_ref()
                .and_then(|f| f.parent.as_ref())
                .map(|p| p.manifest.seq);
        c.journal.start(exec_id, spec, newest);
        if c.policy.auto && !c.policy.activity {
            self.sched().on_exec_start(&c.id, self.now());
        }
    }

    /// An exec of `c` exited: journal it, tell the scheduler, maybe checkpoint.
    pub(super) fn exec_exited(self: &Arc<Self>, c: &mut Container, exec_id: &str, code: u32) {
        c.journal.finish(exec_id, code);
        if c.policy.auto && !c.policy.activity {
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
    pub(super) fn consider(self: &Arc<Self>, id: &str) {
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
    pub(super) fn backing_off(&self, id: &str) -> bool {
        self.skips
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .and_then(|s| s.backoff_until)
            .is_some_and(|until| Instant::now() < until)
    }

    /// An automatic checkpoint of `id` was refused (`Unsupported`) or abandoned (`Stalled`):
    /// the next waits, longer each time in a row.
    pub(super) fn back_off(&self, id: &str, first: Duration, why: &str) {
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

    pub(super) async fn auto_checkpoint(self: &Arc<Self>, id: &str, decision: Decision) {
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
                    warn!("container {id}: retention: {}", e.message());
                }
                if let Ok(seq) = info.id.parse() {
                    self.replicate_soon(id, seq);
                }
            }
            Err(
                e @ Error::Checkpoint(
                    CheckpointError::Unsupported { .. } | CheckpointError::RemovedHardLink { .. },
                ),
            ) => {
                self.back_off(id, UNSUPPORTED_BACKOFF, &e.message());
            }
            Err(e @ Error::Checkpoint(CheckpointError::Stalled { .. })) => {
                self.back_off(id, STALLED_BACKOFF, &e.message());
            }
            Err(
                e @ (Error::Checkpoint(
                    CheckpointError::Blocked { .. } | CheckpointError::StoppedBesideExec { .. },
                )
                | Error::LazyFill {
                    automatic: true, ..
                }),
            ) => {
                let why = e.message();
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
                warn!(
                    "container {id}: automatic checkpoint failed: {}",
                    e.message()
                );
                let _ = self.sched().on_checkpoint_failed(id);
            }
        }
        // A permit came back: containers that were waiting for one.
        let waiting = self.sched().idle_candidates(self.now());
        for other in waiting {
            self.consider(&other);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn backoff_doubles_in_a_row_up_to_its_cap() {
        assert_eq!(backoff(STALLED_BACKOFF, 1), Duration::from_secs(30));
        assert_eq!(backoff(STALLED_BACKOFF, 2), Duration::from_secs(60));
        assert_eq!(backoff(STALLED_BACKOFF, 3), Duration::from_secs(120));
        assert_eq!(backoff(STALLED_BACKOFF, 9), BACKOFF_MAX);
        assert_eq!(backoff(UNSUPPORTED_BACKOFF, 0), UNSUPPORTED_BACKOFF);
        assert_eq!(backoff(UNSUPPORTED_BACKOFF, u32::MAX), BACKOFF_MAX);
    }
}
