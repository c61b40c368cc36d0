//! Checkpoints of a running container, as the control API, containerd's `Checkpoint` RPC and
//! the scheduler ask for them: processes (CRIU through runc) and filesystem layer at one instant
//! ([`criu_bridge::checkpoint_container`]); and the store's list, inspect and delete.

use std::sync::Arc;
use std::time::Instant;

use criu_bridge::runc::CriuOptions;
use log::info;

use super::Engine;
use crate::container::Container;
use crate::error::{Error, Result, chain, task};
use belayer_api::CheckpointInfo;

/// A checkpoint whose filesystem chain grows past this many layers is compacted into one.
pub const COMPACT_CHAIN_AT: usize = 16;

/// How long a checkpoint waits for the memory fill of a lazy restore to finish.
const LAZY_FILL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Engine {
    /// Checkpoints container `id` (processes and filesystem at one instant). A checkpoint or
    /// restore that another request runs is an error, not a wait ([`BusySlot::request`]).
    pub async fn checkpoint(self: &Arc<Self>, id: &str, exit: bool) -> Result<CheckpointInfo> {
        let shared = self.get(id)?;
        let _busy = self.busy(id)?.request(id).await?;
        // The busy flag keeps restores out, so no new fill can start meanwhile.
        self.settle_lazy_fill(&shared, id).await?;
        let c = shared.lock().await;
        let auto = c.policy.auto;
        let info = self.checkpoint_locked(&shared, c, id, exit, false).await?;
        // In automatic mode `keep` bounds the store after a requested checkpoint too, not only
        // after the next automatic one (the chaos soak, seed 605, found stores one over it).
        if auto && !exit {
            self.retain_soon(id);
        }
        Ok(info)
    }

    /// Checkpoints container `id` once its lock is free (an exit being recorded, an exec
    /// starting): the automatic path. It yields ([`Error::Blocked`]) rather than keep the
    /// container frozen for a task that cannot be stopped now, or wait for the memory fill of a
    /// lazy restore.
    pub(super) async fn checkpoint_when_free(self: &Arc<Self>, id: &str) -> Result<CheckpointInfo> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let _busy = c.busy.automatic(id)?;
        self.checkpoint_locked(&shared, c, id, false, true).await
    }

    /// Waits, without holding the container, for the memory fill of its last lazy restore to
    /// finish: pages not yet filled would look absent to a dump. Up to [`LAZY_FILL_WAIT`].
    pub(super) async fn settle_lazy_fill(
        &self,
        shared: &tokio::sync::Mutex<Container>,
        id: &str,
    ) -> Result<()> {
        let Some(fill) = shared.lock().await.lazy_fill.clone() else {
            return Ok(());
        };
        let waiting = fill.clone();
        let done = tokio::task::spawn_blocking(move || waiting.wait(LAZY_FILL_WAIT))
            .await
            .map_err(task("wait for the lazy-pages daemon"))?;
        if !done {
            return Err(Error::LazyFillTimeout {
                id: id.to_string(),
                pid: fill.pid(),
                waited: LAZY_FILL_WAIT,
            });
        }
        let mut c = shared.lock().await;
        if c.lazy_fill.as_ref().is_some_and(|f| Arc::ptr_eq(f, &fill)) {
            c.lazy_fill = None;
        }
        Ok(())
    }

    pub(super) async fn checkpoint_locked(
        self: &Arc<Self>,
        shared: &tokio::sync::Mutex<Container>,
        c: tokio::sync::MutexGuard<'_, Container>,
        id: &str,
        exit: bool,
        yield_to_blocked: bool,
    ) -> Result<CheckpointInfo> {
        if !c.init.is_running() {
            return Err(Error::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let mut c = c;
        // A requested checkpoint has waited for the fill already; an automatic one does not wait.
        // A finished daemon is forgotten.
        match c.lazy_fill.as_ref().map(|f| (f.is_done(), f.pid())) {
            Some((false, pid)) => {
                return Err(Error::LazyFill {
                    id: id.to_string(),
                    pid,
                    automatic: yield_to_blocked,
                });
            }
            Some((true, _)) => c.lazy_fill = None,
            None => {}
        }
        let mut fs = c.fs_state()?;
        // Retention may have compacted the parent since (its chain is now just itself).
        if let Some(p) = fs
            .parent
            .as_ref()
            .filter(|p| p.manifest.container == id && p.manifest.namespace == self.namespace)
        {
            fs.parent = Some(
                self.settings
                    .store()
                    .load(&self.namespace, id, p.manifest.seq)?,
            );
        }
        let position = c.journal.completed();
        // CRIU dumps init's tree; an exec'd process is the shim's child, outside the container.
        let uncaptured: Vec<criu_bridge::UncapturedExec> = c
            .execs
            .values()
            .filter(|p| p.is_running())
            .map(|p| criu_bridge::UncapturedExec {
                exec_id: p.exec_id.clone(),
                pid: p.pid,
            })
            .collect();
        // Once per set: automatic checkpoints beside a long-running exec would repeat it each turn.
        if !uncaptured.is_empty() && c.uncaptured_warned != uncaptured {
            log::warn!(
                "container {id}: the checkpoint does not hold exec'd processes still running \
                 (a restore will not have them): {uncaptured:?}"
            );
        }
        c.uncaptured_warned = uncaptured.clone();
        let (runc, store, ns, cid, bundle) = (
            self.bridge_runc(),
            self.settings.store(),
            self.namespace.clone(),
            id.to_string(),
            c.bundle.clone(),
        );
        let init_pid = c.init.pid as i32;
        let frozen_limit = self.settings.frozen_limit();
        let started = Instant::now();
        // An exit-mode checkpoint ends the container on purpose: no recovery brings it back.
        let was_killed = c.killed;
        c.killed |= exit;
        let (thawed_tx, thawed_rx) = tokio::sync::oneshot::channel::<()>();
        let dump = tokio::task::spawn_blocking(move || {
            let mut thawed_tx = Some(thawed_tx);
            criu_bridge::checkpoint_container_with(
                &criu_bridge::CheckpointRequest {
                    runc: &runc,
                    store: &store,
                    namespace: &ns,
                    id: &cid,
                    bundle: &bundle,
                    upper_dir: &fs.upper,
                    image_lowers: &fs.image_lowers,
                    rootfs_shared: fs.rootfs_shared,
                    parent: fs.parent.as_ref(),
                    leave_running: !exit,
                    uncaptured_execs: &uncaptured,
                    criu: CriuOptions::default(),
                    yield_to_blocked,
                    frozen_limit,
                },
                &mut || {
                    if let Some(tx) = thawed_tx.take() {
                        let _ = tx.send(());
                    }
                },
            )
            .map_err(Error::from)
        });
        // The container is ours until it runs again; hashing and writing the checkpoint do not
        // need it, so execs go on meanwhile (the busy flag still keeps other checkpoints out).
        let _ = thawed_rx.await;
        let frozen = started.elapsed();
        drop(c);
        let cp = match dump.await.map_err(task("checkpoint"))? {
            Ok(cp) => cp,
            // The container died under the checkpoint (an exit-mode one ends it on purpose):
            // say so, not only what CRIU said of the dead tasks it met.
            Err(e) if !exit && criu_bridge::blocked::is_dead(init_pid) => {
                return Err(Error::DiedDuringCheckpoint {
                    id: id.to_string(),
                    source: Box::new(e),
                });
            }
            Err(e) => {
                if exit && !criu_bridge::blocked::is_dead(init_pid) {
                    shared.lock().await.killed = was_killed;
                }
                return Err(e);
            }
        };
        info!(
            "container {id} checkpoint {} taken in {:?} (container held {frozen:?})",
            cp.manifest.seq,
            started.elapsed()
        );
        let mut c = shared.lock().await;
        if let Some(fs) = c.fs.as_mut() {
            fs.parent = Some(cp.clone());
        }
        c.journal.checkpointed(cp.manifest.seq, position);
        let info = CheckpointInfo::from(&cp);
        // Long chains cost lookups and approach overlay's lower-dir limit: fold this one into a
        // single layer, in the background, unless the mounted rootfs stacks on its layer.
        if cp.manifest.fs_chain.len() > COMPACT_CHAIN_AT
            && !c.mount_chain.contains(&cp.manifest.seq)
            && let Ok(slot) = self.busy(id)
        {
            let (store, ns, cid, seq) = (
                self.store(),
                self.namespace.clone(),
                id.to_string(),
                cp.manifest.seq,
            );
            // Busy while it merges (it holds the store's container lock, which a checkpoint
            // needs): a checkpoint request waits for it instead of failing.
            tokio::spawn(async move {
                let busy = slot.when_free().await;
                let _ = tokio::task::spawn_blocking(move || {
                    let _busy = busy;
                    match store.compact(&ns, &cid, seq) {
                        Ok(_) => {}
                        // A later checkpoint came first and stacks on it: that one is
                        // compacted in turn.
                        Err(criu_bridge::store::CompactCheckpointError::Store(
                            e @ criu_bridge::store::StoreError::InChain { .. },
                        )) => info!("container {cid}: checkpoint {seq} left as it is: {e}"),
                        Err(e) => log::warn!(
                            "container {cid}: compacting checkpoint {seq}: {}",
                            chain(&e)
                        ),
                    }
                })
                .await;
            });
        }
        Ok(info)
    }

    pub fn list_checkpoints(&self, id: &str) -> Result<Vec<CheckpointInfo>> {
        let store = self.settings.store();
        let seqs = store.list(&self.namespace, id)?;
        seqs.into_iter()
            .map(|s| Ok(CheckpointInfo::from(&store.load(&self.namespace, id, s)?)))
            .collect()
    }

    pub fn inspect_checkpoint(&self, id: &str, seq: u64) -> Result<CheckpointInfo> {
        Ok(CheckpointInfo::from(&self.settings.store().load(
            &self.namespace,
            id,
            seq,
        )?))
    }

    pub async fn delete_checkpoint(&self, id: &str, seq: u64) -> Result<()> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        if c.fs
            .as_ref()
            .and_then(|f| f.parent.as_ref())
            .is_some_and(|p| p.manifest.seq == seq)
        {
            // The running rootfs stacks on it: the next checkpoint still needs it.
            return Err(Error::FailedPrecondition(format!(
                "checkpoint {seq} of container {id} is the base of the running container's filesystem"
            )));
        }
        let store = self.settings.store();
        let ns = self.namespace.clone();
        let cid = id.to_string();
        tokio::task::spawn_blocking(move || store.delete(&ns, &cid, seq))
            .await
            .map_err(task("delete the checkpoint"))??;
        Ok(())
    }
}
