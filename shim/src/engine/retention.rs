//! Retention: after an automatic checkpoint, the newest K of a container's checkpoints stay, plus
//! those its running rootfs stacks on; a kept one whose chain reaches a deleted one is compacted
//! first.

use std::collections::BTreeMap;

use criu_bridge::store::{CompactCheckpointError, StoreError};
use log::info;

use super::Engine;
use crate::error::{Result, task};

impl Engine {
    /// Keeps the newest K checkpoints, plus those the running rootfs stacks on (their layers are
    /// mounted). A checkpoint goes only when no pinned one needs its layer; a kept one whose chain
    /// reaches a deleted one is compacted first.
    pub(super) async fn retain(&self, id: &str) -> Result<()> {
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
        tokio::task::spawn_blocking(move || retain_in(&store, &ns, &cid, keep, &pinned))
            .await
            .map_err(task("retention"))?
    }

    /// Runs retention for `id` in the background, once the restore that calls it has let the
    /// container go: the rootfs it unmounted stacked on checkpoints retention had to keep,
    /// which may go now rather than after the next automatic checkpoint (the chaos soak saw a
    /// chain of 11 outlive a restore until then) — also when this shim never knew that chain
    /// (it started after the one that mounted it died, and `belayer restore` created the task
    /// anew: shim-kill in the soak).
    pub(super) fn retain_soon(self: &std::sync::Arc<Self>, id: &str) {
        let (engine, id) = (std::sync::Arc::clone(self), id.to_string());
        tokio::spawn(async move {
            if let Err(e) = engine.retain(&id).await {
                log::warn!("container {id}: retention after a restore: {}", e.message());
            }
        });
    }
}

/// One retention pass over container `ns`/`cid`'s checkpoints in `store`: the newest `keep`
/// stay, and those `pinned` (the mounted rootfs stacks on them) with their chains; a kept one
/// whose chain reaches a dropped one is compacted first. A compaction that fails keeps its chain
/// and the pass goes on with the rest of the plan.
fn retain_in(
    store: &criu_bridge::Store,
    ns: &str,
    cid: &str,
    keep: usize,
    pinned: &[u64],
) -> Result<()> {
    let mut chains = std::collections::BTreeMap::new();
    let mut refs = Vec::new();
    for seq in store.list(ns, cid)? {
        let m = store.load(ns, cid, seq)?.manifest;
        refs.push(scheduler::CheckpointRef {
            id: seq,
            seq,
            parent: m.parent,
        });
        chains.insert(seq, m.fs_chain);
    }
    let newest = chains.keys().next_back().copied();
    let mut delete = to_delete(&refs, &chains, keep, pinned);
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
            StoreError::InUse { .. } | StoreError::InChain { .. } | StoreError::UsedAsLower { .. }
        )
    };
    for (seq, chain) in chains.iter().rev() {
        if needs_compaction(*seq, chain, &delete, pinned) {
            match store.compact(ns, cid, *seq) {
                Ok(_) => {}
                Err(CompactCheckpointError::Store(e)) if in_use(&e) => {
                    info!("container {cid}: retention keeps checkpoint {seq}'s chain: {e}");
                    delete.retain(|d| !chain.contains(d));
                }
                // Damaged on disk: it cannot be restored (its restore is refused), so
                // it does not hold the chain it stacks on; it goes with it (the 30-minute
                // soak saw a damaged one keep 16 checkpoints). Not the newest, which the
                // next checkpoint stacks on; the store refuses any another one needs.
                Err(e @ CompactCheckpointError::Corrupt { .. }) if Some(*seq) != newest => {
                    log::warn!(
                        "container {cid}: retention drops checkpoint {seq}, which cannot \
                         be restored: {}",
                        crate::error::chain(&e)
                    );
                    delete.push(*seq);
                }
                // The merge failed (a full disk), or the newest is damaged: its chain
                // stays, and the rest of the plan goes on, so that a store short of
                // space still frees what needs no merge.
                Err(e) => {
                    log::warn!(
                        "container {cid}: retention keeps checkpoint {seq}'s chain: {}",
                        crate::error::chain(&e)
                    );
                    delete.retain(|d| !chain.contains(d));
                }
            }
        }
    }
    // Newest first too: the store refuses to delete a checkpoint while a later one (also
    // dropped) still stacks on its layer, so oldest first removed only the newest each
    // pass and the store grew past `keep` (found by the chaos soak).
    delete.sort_unstable_by(|a, b| b.cmp(a));
    for seq in delete {
        let mut adopted = 0;
        loop {
            match store.delete(ns, cid, seq) {
                // A fork's checkpoint stacks on this layer. Made standalone (its own
                // copy of the layers it borrows), it no longer needs it; refused while a
                // running rootfs stacks on that checkpoint (the fork runs).
                Err(StoreError::UsedAsLower { by, .. }) if adopted < MAX_ADOPTIONS => {
                    match adopt_layers(store, &by) {
                        Ok(()) => adopted += 1,
                        Err(e) => {
                            info!(
                                "container {cid}: retention keeps checkpoint {seq}: {} \
                                 stacks on it and cannot be compacted: {e}",
                                by.display()
                            );
                            break;
                        }
                    }
                }
                Err(e) if in_use(&e) => {
                    info!("container {cid}: retention keeps checkpoint {seq}: {e}");
                    break;
                }
                r => {
                    r?;
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Another container's checkpoints (forks' own) that retention makes standalone in one pass
/// over one checkpoint it drops.
const MAX_ADOPTIONS: usize = 64;

/// Compacts the checkpoint at `dir` (of another container: a fork's, whose layers stack on the
/// checkpoint it was forked from) into a standalone one that borrows no layer; a later
/// checkpoint of that container stacking on it goes first (it takes the layers).
fn adopt_layers(store: &criu_bridge::Store, dir: &std::path::Path) -> Result<()> {
    let m = criu_bridge::Checkpoint::open(dir)?.manifest;
    let mut seq = m.seq;
    for _ in 0..MAX_ADOPTIONS {
        match store.compact(&m.namespace, &m.container, seq) {
            Err(CompactCheckpointError::Store(StoreError::InChain { needed_by, .. })) => {
                seq = needed_by
            }
            r => {
                r?;
                info!(
                    "checkpoint {seq} of {}/{} compacted: it no longer borrows another \
                     container's layers",
                    m.namespace, m.container
                );
                return Ok(());
            }
        }
    }
    Err(crate::error::Error::FailedPrecondition(format!(
        "the chain of {}/{} stacking on checkpoint {} is longer than {MAX_ADOPTIONS}",
        m.namespace, m.container, m.seq
    )))
}

/// The checkpoints `refs` (with their filesystem chains) that retention deletes to keep `keep`:
/// those the scheduler's plan drops, but neither a `pinned` one (the mounted rootfs stacks on
/// it) nor one whose layer a pinned one's chain needs.
fn to_delete(
    refs: &[scheduler::CheckpointRef<u64>],
    chains: &BTreeMap<u64, Vec<u64>>,
    keep: usize,
    pinned: &[u64],
) -> Vec<u64> {
    let needed_by_pinned = |d: u64| {
        pinned
            .iter()
            .any(|p| chains.get(p).is_some_and(|c| c.contains(&d)))
    };
    scheduler::plan_retention(refs, keep)
        .delete
        .into_iter()
        .filter(|d| !pinned.contains(d) && !needed_by_pinned(*d))
        .collect()
}

/// Whether kept checkpoint `seq` (filesystem chain `chain`) must be compacted before `delete`
/// goes: its chain reaches one of them.
fn needs_compaction(seq: u64, chain: &[u64], delete: &[u64], pinned: &[u64]) -> bool {
    !delete.contains(&seq) && !pinned.contains(&seq) && chain.iter().any(|l| delete.contains(l))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checkpoints 1..=n, each a child of the one before, each chain all of its ancestors.
    pub(super) fn linear(n: u64) -> (Vec<scheduler::CheckpointRef<u64>>, BTreeMap<u64, Vec<u64>>) {
        let refs = (1..=n)
            .map(|seq| scheduler::CheckpointRef {
                id: seq,
                seq,
                parent: (seq > 1).then(|| seq - 1),
            })
            .collect();
        let chains = (1..=n)
            .map(|seq| (seq, (1..=seq).rev().collect()))
            .collect();
        (refs, chains)
    }

    #[test]
    pub(super) fn the_oldest_go_beyond_keep() {
        let (refs, chains) = linear(5);
        let mut delete = to_delete(&refs, &chains, 3, &[]);
        delete.sort_unstable();
        assert_eq!(delete, vec![1, 2]);
        assert!(to_delete(&refs, &chains, 5, &[]).is_empty());
    }

    #[test]
    pub(super) fn pinned_checkpoints_and_their_layers_stay() {
        let (refs, chains) = linear(5);
        // The mounted rootfs stacks on 2: 2 and the 1 its chain reaches stay.
        assert!(to_delete(&refs, &chains, 3, &[2]).is_empty());
        // Pinned 1 alone: 2 may go.
        assert_eq!(to_delete(&refs, &chains, 3, &[1]), vec![2]);
    }

    #[test]
    pub(super) fn a_kept_checkpoint_reaching_a_deleted_layer_is_compacted() {
        let (_, chains) = linear(5);
        let delete = [1, 2];
        let compact: Vec<u64> = chains
            .iter()
            .filter(|(seq, chain)| needs_compaction(**seq, chain, &delete, &[]))
            .map(|(seq, _)| *seq)
            .collect();
        assert_eq!(compact, vec![3, 4, 5]);
        // Neither a deleted nor a pinned one.
        assert!(!needs_compaction(2, &chains[&2], &delete, &[]));
        assert!(!needs_compaction(3, &chains[&3], &delete, &[3]));
    }

    use criu_bridge::store::{Manifest, VerifyLevel, verify_checkpoint};
    use criu_bridge::{Checkpoint, Store};
    use std::path::Path;

    /// A checkpoint of container c1 without processes (a stand-in CRIU image) whose layer is a
    /// real capture of `upper`, stacked on `parent`.
    fn checkpoint_of(
        store: &Store,
        upper: &Path,
        lower: &Path,
        parent: Option<&Checkpoint>,
    ) -> Checkpoint {
        let lock = store.lock("default", "c1").unwrap();
        let pending = store.begin(&lock).unwrap();
        std::fs::write(pending.criu_dir().join("core-1.img"), b"core").unwrap();
        let parent_index = parent.map(|p| p.read_index().unwrap());
        let (index, capture) =
            criu_bridge::layer::capture_layer(upper, parent_index.as_ref(), &pending.fs_dir())
                .unwrap();
        pending.write_index(&index).unwrap();
        let seq = pending.seq();
        let mut fs_chain = vec![seq];
        fs_chain.extend(parent.map_or(&[][..], |p| &p.manifest.fs_chain[..]));
        pending
            .commit(Manifest {
                capture,
                ..Manifest::bare("default", "c1", seq, fs_chain, vec![lower.to_path_buf()])
            })
            .unwrap()
    }

    /// Unmounts its tmpfs when dropped.
    struct Tmpfs(std::path::PathBuf);

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }

    /// The 30-minute soak (seed 601) saw a retention pass end at a compaction that failed on the
    /// full disk, so checkpoints that needed no merge stayed too and the store grew past `keep`
    /// just when space was short. Now the failed compaction's chain stays whole (and restorable)
    /// and the rest of the plan goes on. Two chains, keep 2: 1 ← 2, then 3 ← 4 ← 5 (a restore
    /// starts a new chain), 3's layer 1 MB, the store on a 4 MB tmpfs. With the disk nearly
    /// full, compacting 5 (its chain reaches 3, dropped) fails, so 3, 4 and 5 stay — and 1 and
    /// 2 go all the same. With space back, the next pass compacts 5 and 4 and drops 3.
    #[test]
    fn a_compaction_failing_on_a_full_disk_keeps_its_chain_and_the_pass_goes_on() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test mounts a tmpfs: run it as root"
        );
        let tmp = tempfile::tempdir().unwrap();
        let small = tmp.path().join("small");
        std::fs::create_dir_all(&small).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &small,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=4m"),
        )
        .expect("mount a 4 MB tmpfs");
        let _mount = Tmpfs(small.clone());
        let store = Store::new(small.join("store"));
        let (upper, lower) = (tmp.path().join("upper"), tmp.path().join("lower"));
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&lower).unwrap();

        std::fs::write(upper.join("a"), "1").unwrap();
        let c1 = checkpoint_of(&store, &upper, &lower, None);
        std::fs::write(upper.join("a"), "2").unwrap();
        checkpoint_of(&store, &upper, &lower, Some(&c1));
        std::fs::write(upper.join("big"), vec![7u8; 1_000_000]).unwrap();
        let c3 = checkpoint_of(&store, &upper, &lower, None);
        std::fs::write(upper.join("a"), "4").unwrap();
        let c4 = checkpoint_of(&store, &upper, &lower, Some(&c3));
        std::fs::write(upper.join("a"), "5").unwrap();
        let c5 = checkpoint_of(&store, &upper, &lower, Some(&c4));
        assert_eq!(c5.manifest.fs_chain, [5, 4, 3]);

        // Fill the disk, then free less than the merged layer needs.
        let fill_path = small.join("fill");
        let mut fill = std::fs::File::create(&fill_path).unwrap();
        let chunk = vec![1u8; 64 * 1024];
        while std::io::Write::write_all(&mut fill, &chunk).is_ok() {}
        let len = fill.metadata().unwrap().len();
        fill.set_len(len.saturating_sub(512 * 1024)).unwrap();
        drop(fill);

        retain_in(&store, "default", "c1", 2, &[]).expect("a retention pass on a full disk");
        assert_eq!(
            store.list("default", "c1").unwrap(),
            [3, 4, 5],
            "1 and 2 need no merge and go; 5's chain stays whole"
        );
        let c5 = store.load("default", "c1", 5).unwrap();
        verify_checkpoint(&store, &c5, VerifyLevel::Full).expect("checkpoint 5 after the pass");
        let left: Vec<_> = std::fs::read_dir(store.container_dir("default", "c1").unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "the failed compaction left {left:?}");

        // Space back: the next pass compacts and keeps the newest two.
        std::fs::remove_file(&fill_path).unwrap();
        retain_in(&store, "default", "c1", 2, &[]).expect("a retention pass with space");
        assert_eq!(store.list("default", "c1").unwrap(), [4, 5]);
        for seq in [4, 5] {
            let cp = store.load("default", "c1", seq).unwrap();
            verify_checkpoint(&store, &cp, VerifyLevel::Full)
                .unwrap_or_else(|e| panic!("checkpoint {seq} after compaction: {e}"));
        }
    }
}
