//! Which checkpoints to delete when keeping the newest K, and which kept ones to compact first.

use std::collections::HashSet;
use std::hash::Hash;

/// A checkpoint as retention sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRef<Id> {
    /// Its identifier.
    pub id: Id,
    /// Its position in the container's sequence; higher is newer.
    pub seq: u64,
    /// The checkpoint it is incremental on, if any.
    pub parent: Option<Id>,
}

/// What to do to keep the newest K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPlan<Id> {
    /// Kept checkpoints whose parent is about to be deleted: compact each into a self-contained
    /// image (merge its ancestors' pages into it) BEFORE deleting anything.
    pub compact: Vec<Id>,
    /// Checkpoints to delete, oldest first.
    pub delete: Vec<Id>,
}

/// Plans keeping the newest `keep` (at least one) of `checkpoints`.
pub fn plan_retention<Id: Clone + Eq + Hash>(
    checkpoints: &[CheckpointRef<Id>],
    keep: usize,
) -> RetentionPlan<Id> {
    let mut order: Vec<&CheckpointRef<Id>> = checkpoints.iter().collect();
    order.sort_by_key(|c| std::cmp::Reverse(c.seq));
    let split = keep.max(1).min(order.len());
    let (kept, dropped) = order.split_at(split);
    let deleted: HashSet<&Id> = dropped.iter().map(|c| &c.id).collect();
    let mut compact: Vec<&CheckpointRef<Id>> = kept
        .iter()
        .copied()
        .filter(|c| c.parent.as_ref().is_some_and(|p| deleted.contains(p)))
        .collect();
    compact.sort_by_key(|c| c.seq);
    RetentionPlan {
        compact: compact.into_iter().map(|c| c.id.clone()).collect(),
        delete: dropped.iter().rev().map(|c| c.id.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chain(n: u64) -> Vec<CheckpointRef<u64>> {
        (0..n)
            .map(|i| CheckpointRef {
                id: i,
                seq: i,
                parent: i.checked_sub(1),
            })
            .collect()
    }

    #[test]
    fn keeps_newest_and_compacts_the_oldest_kept() {
        let plan = plan_retention(&chain(6), 3);
        assert_eq!(plan.delete, vec![0, 1, 2]);
        assert_eq!(plan.compact, vec![3]);
    }

    #[test]
    fn nothing_to_do_under_k() {
        let plan = plan_retention(&chain(2), 3);
        assert!(plan.delete.is_empty() && plan.compact.is_empty());
    }

    #[test]
    fn full_images_need_no_compaction() {
        let full: Vec<_> = (0..5u64)
            .map(|i| CheckpointRef {
                id: i,
                seq: i,
                parent: None,
            })
            .collect();
        let plan = plan_retention(&full, 2);
        assert_eq!(plan.delete, vec![0, 1, 2]);
        assert!(plan.compact.is_empty());
    }

    proptest! {
        #[test]
        fn keeps_exactly_the_newest(n in 0u64..30, keep in 0usize..10, parents in prop::collection::vec(prop::option::of(0u64..30), 30)) {
            let cps: Vec<_> = (0..n).map(|i| CheckpointRef { id: i, seq: i, parent: parents[i as usize].filter(|&p| p < i) }).collect();
            let plan = plan_retention(&cps, keep);
            let k = keep.max(1).min(n as usize);
            prop_assert_eq!(plan.delete.len(), n as usize - k);
            prop_assert!(plan.delete.iter().all(|&d| d < n - k as u64));
            prop_assert!(plan.compact.iter().all(|&c| c >= n - k as u64));
            // Every kept checkpoint is either compacted or has a kept (or no) parent.
            for c in &cps[(n as usize - k)..] {
                let parent_deleted = c.parent.is_some_and(|p| plan.delete.contains(&p));
                prop_assert_eq!(parent_deleted, plan.compact.contains(&c.id));
            }
        }
    }
}
