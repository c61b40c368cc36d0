//! The gateway's hint sender: counts each container's generations in flight and tells its shim
//! `llm-start` when the first begins and `llm-end` when the last ends, off the request path.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::api::HintRequest;
use crate::cli::control::Control;

/// Limit on one hint's round trip to a shim.
const HINT_TIMEOUT: Duration = Duration::from_secs(2);
/// Hints queued for one container before new ones are dropped (a stuck shim).
const QUEUE: usize = 256;
/// A container's failed hints are logged at most once in this interval.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A container a request is for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub namespace: String,
    pub container: String,
}

/// One container's generations in flight and the queue to its hint sender.
struct Slot {
    in_flight: Mutex<usize>,
    tx: mpsc::Sender<HintRequest>,
}

impl Slot {
    /// Queues `hint` without waiting; a full queue drops it (and says so).
    fn send(&self, target: &Target, hint: HintRequest) {
        if self.tx.try_send(hint).is_err() {
            eprintln!(
                "belayer gateway: hint queue of {}/{} full, hint dropped",
                target.namespace, target.container
            );
        }
    }
}

/// Every container's slot; hands out [`InFlight`] guards.
#[derive(Default)]
pub struct Hints {
    slots: Mutex<HashMap<Target, Arc<Slot>>>,
}

/// One generation in flight: `llm-end` goes when the last of its container's is dropped.
pub struct InFlight {
    target: Target,
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
            .or_insert_with(|| spawn_sender(target.clone()))
            .clone();
        {
            // Held while queueing, so the queue's order is the counter's.
            let mut n = slot.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            if *n == 0 {
                slot.send(
                    &target,
                    HintRequest {
                        hint: "llm-start".into(),
                        expected_ms: None,
                        expected_tokens,
                    },
                );
            }
            *n += 1;
        }
        InFlight { target, slot }
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
            self.slot.send(
                &self.target,
                HintRequest {
                    hint: "llm-end".into(),
                    ..Default::default()
                },
            );
        }
    }
}

/// Starts the task that delivers `target`'s hints in order, one at a time.
fn spawn_sender(target: Target) -> Arc<Slot> {
    let (tx, mut rx) = mpsc::channel::<HintRequest>(QUEUE);
    tokio::spawn(async move {
        let mut warned: Option<Instant> = None;
        let mut failed = 0u64;
        while let Some(hint) = rx.recv().await {
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
        tx,
    })
}
