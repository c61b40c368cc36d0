//! Recovery: the restore of a container whose init died on its own (not in a crash loop), and
//! after any restore, where the action journal stands ([`Position`]) and, for `replay`, the
//! re-run of the actions the checkpoint does not reflect.

use std::sync::Arc;
use std::time::Duration;

use log::{info, warn};

use super::{EXEC_NOT_STARTED, Engine, SIGKILLED};
use crate::container::Container;
use belayer_api::{Position, Recovery};

/// Recoveries in a row from one checkpoint, the first of them under [`CRASH_LOOP_WINDOW_MS`]
/// ago, after which a death of the init is left alone: the checkpoint itself leads to the crash,
/// and restoring it again would only repeat it.
const CRASH_LOOP_RECOVERIES: usize = 3;
const CRASH_LOOP_WINDOW_MS: u64 = 60_000;
/// A replayed action may take this many times as long as it took at first, and at least
/// [`REPLAY_MIN`], before it is killed: the container is held while actions replay.
const REPLAY_SLACK: u32 = 4;
const REPLAY_MIN: Duration = Duration::from_secs(30);

impl Engine {
    /// After a restore of `c` to checkpoint `seq`: where the journal stands, and for `replay`
    /// the re-run of the undone actions.
    pub(super) async fn reposition(&self, c: &mut Container, seq: u64) -> Option<Position> {
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
    pub(super) async fn run_quiet(
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
    pub(super) async fn recover(self: &Arc<Self>, id: &str, exit_status: u32) -> Option<Recovery> {
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
                warn!("container {id}: automatic recovery failed: {}", e.message());
                None
            }
        }
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
    use belayer_api::RestoreInfo;

    pub(super) fn recovery(checkpoint: u64, at_unix_ms: u64) -> Recovery {
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
    pub(super) fn a_crash_loop_is_three_quick_recoveries_from_one_checkpoint() {
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
