//! Whether a checkpoint or restore of a container is under way ([`BusySlot`]), read without the
//! container's lock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};

/// Whether a checkpoint or restore of a container is under way, and whether it is the shim's
/// own (an automatic checkpoint, a recovery), which a request waits for rather than fail on.
/// Read without the container's lock, which a restore holds for as long as it runs.
#[derive(Clone, Default)]
pub struct BusySlot {
    held: Arc<tokio::sync::Mutex<()>>,
    /// Set by each taker once it holds `held`: who holds it now.
    automatic: Arc<AtomicBool>,
}

/// Marks a container busy with a checkpoint or restore for as long as it lives.
pub struct Busy {
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl BusySlot {
    /// For a request (the control API's checkpoint or restore of container `id`): another
    /// request's checkpoint or restore under way is an error; the shim's own is waited for.
    pub async fn request(&self, id: &str) -> Result<Busy> {
        match self.try_take(false) {
            Some(busy) => Ok(busy),
            None if self.automatic.load(Ordering::Acquire) => Ok(self.take(false).await),
            None => Err(Error::InProgress(id.to_string())),
        }
    }

    /// For the shim's own checkpoint of container `id`: now, or an error.
    pub fn automatic(&self, id: &str) -> Result<Busy> {
        self.try_take(true)
            .ok_or_else(|| Error::InProgress(id.to_string()))
    }

    /// For the shim's own work that must not be skipped — the automatic recovery, where an
    /// error would lose the container, and retention's deletes and compactions: once whatever
    /// is under way has ended.
    pub async fn when_free(&self) -> Busy {
        self.take(true).await
    }

    /// Whether a checkpoint or restore holds the container now.
    pub fn is_held(&self) -> bool {
        self.held.try_lock().is_err()
    }

    fn try_take(&self, automatic: bool) -> Option<Busy> {
        let _held = self.held.clone().try_lock_owned().ok()?;
        self.automatic.store(automatic, Ordering::Release);
        Some(Busy { _held })
    }

    async fn take(&self, automatic: bool) -> Busy {
        let _held = self.held.clone().lock_owned().await;
        self.automatic.store(automatic, Ordering::Release);
        Busy { _held }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_fails_on_another_request_and_waits_for_the_shim_s_own() {
        let slot = BusySlot::default();
        let held = slot.request("c").await.unwrap();
        assert!(matches!(slot.request("c").await, Err(Error::InProgress(_))));
        assert!(matches!(slot.automatic("c"), Err(Error::InProgress(_))));
        drop(held);

        // The shim's own: a request waits until it ends.
        let own = slot.automatic("c").unwrap();
        let waiter = {
            let slot = slot.clone();
            tokio::spawn(async move { slot.request("c").await.map(drop) })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(own);
        waiter.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn when_free_waits_for_whatever_is_under_way() {
        let slot = BusySlot::default();
        let held = slot.request("c").await.unwrap();
        let waiter = {
            let slot = slot.clone();
            tokio::spawn(async move { drop(slot.when_free().await) })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(held);
        waiter.await.unwrap();
        // Free again: every kind of taker gets it at once.
        drop(slot.automatic("c").unwrap());
        drop(slot.request("c").await.unwrap());
    }
}
