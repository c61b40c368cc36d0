//! The gateway's hint sender: counts each container's generations in flight and tells its shim
//! `llm-start` when the first begins and `llm-end` when the last ends, off the request path.
//!
//! Each container has one sender task that delivers its hints in order. A hint that comes while
//! the previous one is still on its way replaces any other waiting: the shim timestamps hints as
//! they arrive, so a stale start/end pair (a bubble shorter than a delivery) says nothing, and a
//! slow or stuck shim can never make hints pile up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::api::HintRequest;
use crate::cli::control::Control;

/// Limit on one hint's round trip to a shim.
const HINT_TIMEOUT: Duration = Duration::from_secs(2);
/// A container's failed hints are logged at most once in this interval.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A container a request is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub namespace: String,
    pub container: String,
}

/// One container's generations in flight and the hint waiting for its sender.
struct Slot {
    in_flight: Mutex<usize>,
    next: watch::Sender<Option<HintRequest>>,
}

impl Slot {
    /// Hands `hint` to the sender without waiting, replacing one not yet taken.
    fn send(&self, hint: HintRequest) {
        self.next.send_replace(Some(hint));
    }
}

/// Every container's slot; hands out [`InFlight`] guards.
#[derive(Default)]
pub struct Hints {
    slots: Mutex<HashMap<Target, Arc<Slot>>>,
}

/// One generation in flight: `llm-end` goes when the last of its container's is dropped.
pub struct InFlight {
    slot: Arc<Slot>,
}

impl Hints {
    /// A generation for `target` begins (`expected_tokens` from the request's `max_tokens`):
    /// `llm-start` unless another is already in flight. Must run inside the tokio runtime.
    pub fn begin(&self, target: Target, expected_tokens: Option<u64>) -> InFlight {
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.clone())
            .or_insert_with(|| spawn_sender(target))
            .clone();
        {
            // Held while handing over, so hints go in the counter's order.
            let mut n = slot.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            if *n == 0 {
                slot.send(HintRequest {
                    hint: "llm-start".into(),
                    expected_ms: None,
                    expected_tokens,
                });
            }
            *n += 1;
        }
        InFlight { slot }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut n = self
            .slot
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.slot.send(HintRequest {
                hint: "llm-end".into(),
                ..Default::default()
            });
        }
    }
}

/// Starts the task that delivers `target`'s hints, one at a time.
fn spawn_sender(target: Target) -> Arc<Slot> {
    let (next, mut rx) = watch::channel::<Option<HintRequest>>(None);
    tokio::spawn(async move {
        let mut warned: Option<Instant> = None;
        let mut failed = 0u64;
        while rx.changed().await.is_ok() {
            let Some(hint) = rx.borrow_and_update().clone() else {
                continue;
            };
            let ctl = Control::new(&target.namespace, &target.container).with_timeout(HINT_TIMEOUT);
            let sent = tokio::task::spawn_blocking(move || {
                ctl.call::<serde_json::Value>("POST", "hint", Some(&hint))
            })
            .await
            .unwrap_or_else(|e| Err(format!("hint task: {e}")));
            let Err(e) = sent else { continue };
            failed += 1;
            if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                eprintln!(
                    "belayer gateway: hints for {}/{} fail ({failed} so far; next report in a minute at most): {e}",
                    target.namespace, target.container
                );
                warned = Some(Instant::now());
            }
        }
    });
    Arc::new(Slot {
        in_flight: Mutex::new(0),
        next,
    })
}
