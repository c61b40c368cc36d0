//! What the control API reports of a container: its status and its action journal.

use super::Engine;
use crate::error::Result;

impl Engine {
    pub async fn status(&self, id: &str) -> Result<belayer_api::Status> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        let checkpoints = self
            .store()
            .list(&self.namespace, id)?
            .iter()
            .map(u64::to_string)
            .collect();
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
        })
    }

    pub async fn journal(&self, id: &str) -> Result<Vec<crate::journal::Entry>> {
        let shared = self.get(id)?;
        let c = shared.lock().await;
        Ok(c.journal.entries.clone())
    }
}
