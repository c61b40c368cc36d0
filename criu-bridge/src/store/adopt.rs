//! Adopting another store's checkpoints of one container: an exported chain unpacked beside this
//! store's root (containerd's checkpoint path, another node's). Those this store lacks move in
//! by rename, under the container's lock; those it has must be the very same checkpoints (their
//! creation times and every file's size and sha256 match), never quietly swapped for another
//! container's of the same name and number. Every checkpoint moved in stacks only on checkpoints
//! of the same import: never on one of this store's that the archive merely names.

use std::fs;

use super::manifest::MANIFEST_FILE;
use super::{Checkpoint, Store, StoreError};

/// What adopting a container's checkpoints would move in ([`Store::adoption`]).
#[derive(Debug)]
pub struct Adoption {
    /// The container's namespace.
    pub namespace: String,
    /// The container.
    pub container: String,
    /// Its newest checkpoint.
    pub newest: u64,
    /// The checkpoints this store lacks, where they are now (the caller may still complete
    /// them before [`Store::adopt`] moves them).
    pub missing: Vec<Checkpoint>,
}

impl Store {
    /// The checkpoints of `namespace/container` in `from` that this store lacks; `None` when
    /// `from` has none. Every one this store has already is checked first, whole:
    /// [`StoreError::Clash`] when it is another checkpoint of the same number.
    pub fn adoption(
        &self,
        from: &Store,
        namespace: &str,
        container: &str,
    ) -> Result<Option<Adoption>, StoreError> {
        let seqs = from.list(namespace, container)?;
        let Some(&newest) = seqs.last() else {
            return Ok(None);
        };
        let mut missing = Vec::new();
        for &seq in &seqs {
            let theirs = from.load(namespace, container, seq)?;
            if let Some(&member) = theirs.manifest.fs_chain.iter().find(|s| !seqs.contains(s)) {
                return Err(StoreError::ChainOutside { seq, member });
            }
            match self.load(namespace, container, seq) {
                Ok(ours) => same_checkpoint(namespace, container, &ours, &theirs)?,
                Err(StoreError::NotFound { .. }) => missing.push(theirs),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(Adoption {
            namespace: namespace.into(),
            container: container.into(),
            newest,
            missing,
        }))
    }

    /// Moves the missing checkpoints of `adoption` into this store (a rename: `from` must be
    /// on the store's filesystem), under the container's lock, so a checkpoint being written
    /// takes the next number. One that another adoption of the same chain moved in first counts
    /// as moved; one whose number this store took meanwhile (a checkpoint of its own, after
    /// [`Store::adoption`] looked) is [`StoreError::Clash`], and nothing after it moves.
    pub fn adopt(&self, adoption: &Adoption) -> Result<(), StoreError> {
        if adoption.missing.is_empty() {
            // Nothing to move: no need to wait on a checkpoint being written.
            return Ok(());
        }
        let lock = self.lock(&adoption.namespace, &adoption.container)?;
        for cp in &adoption.missing {
            let to = lock.dir.join(cp.manifest.seq.to_string());
            if to.join(MANIFEST_FILE).is_file() {
                let ours = Checkpoint::open(&to)?;
                same_checkpoint(&adoption.namespace, &adoption.container, &ours, cp)?;
                continue;
            }
            fs::rename(&cp.dir, &to).map_err(|e| StoreError::io("move", &cp.dir, e))?;
        }
        Ok(())
    }
}

/// Refuses ([`StoreError::Clash`]) when `ours` and `theirs`, both `namespace/container`'s of
/// one number, are not the same checkpoint: taken at another instant, or with other files (an
/// archive can name any instant; it cannot name our files' sha256 without holding them).
fn same_checkpoint(
    namespace: &str,
    container: &str,
    ours: &Checkpoint,
    theirs: &Checkpoint,
) -> Result<(), StoreError> {
    let (o, t) = (&ours.manifest, &theirs.manifest);
    if o.created_unix_ms == t.created_unix_ms && o.files == t.files {
        return Ok(());
    }
    Err(StoreError::Clash {
        namespace: namespace.into(),
        container: container.into(),
        seq: t.seq,
        theirs_ms: t.created_unix_ms,
        ours_ms: o.created_unix_ms,
    })
}
