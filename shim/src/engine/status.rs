//! What the control API reports of a container: its status and its action journal.

use super::Engine;
use crate::error::Result;

impl Engine {
    pub async fn status(&self, id: &str) -> Result<belayer_api::Status> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let store = self.store();
        let seqs = store.list(&self.namespace, id)?;
        let checkpoints = seqs.iter().map(u64::to_string).collect();
        let replication = c.policy.replicate.as_ref().map(|repository| {
            let r = &c.replication;
            let behind: Vec<u64> = seqs
                .iter()
                .copied()
                .filter(|s| r.newest.is_none_or(|n| *s > n))
                .collect();
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let behind_ms = behind
                .first()
                .and_then(|s| store.load(&self.namespace, id, *s).ok())
                .map_or(0, |cp| now_ms.saturating_sub(cp.manifest.created_unix_ms));
            belayer_api::ReplicationStatus {
                repository: repository.clone(),
                behind: behind.iter().map(u64::to_string).collect(),
                behind_ms,
                ..r.report.clone()
            }
        });
        Ok(belayer_api::Status {
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
            replication,
        })
    }

    pub async fn journal(&self, id: &str) -> Result<Vec<crate::journal::Entry>> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        Ok(c.journal.entries.clone())
    }
}
