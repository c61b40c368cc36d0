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

use belayer_api::HintRequest;

use crate::control::Control;
use crate::error::Error;

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

/// A container's hint state is let go after this long with nothing in flight.
pub const IDLE: Duration = Duration::from_secs(600);
/// Idle containers are looked for at most this often (and whenever the table is full).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// One container's generations in flight and the hint waiting for its sender.
struct Slot {
    state: Mutex<State>,
    next: watch::Sender<Option<HintRequest>>,
}

struct State {
    in_flight: usize,
    /// When a generation last began or ended.
    last_used: Instant,
}

impl Slot {
    /// Hands `hint` to the sender without waiting, replacing one not yet taken.
    fn send(&self, hint: HintRequest) {
        self.next.send_replace(Some(hint));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Nothing in flight for `idle` or longer: its state can go.
    fn idle_for(&self, idle: Duration) -> Option<Duration> {
        let s = self.lock();
        let since = s.last_used.elapsed();
        (s.in_flight == 0 && since >= idle).then_some(since)
    }
}

/// The containers' slots, at most `cap` of them. Letting a slot go drops its sender, and its
/// task ends once it has delivered what it holds: no task per distinct name lives forever.
pub struct Hints {
    table: Mutex<Table>,
    cap: usize,
    idle: Duration,
}

struct Table {
    slots: HashMap<Target, Arc<Slot>>,
    swept: Instant,
    /// Generations that got no hints because every slot was busy, and when that was last said.
    refused: u64,
    warned: Option<Instant>,
}

impl Table {
    /// Lets go of the slots idle for `idle`; when still `cap` are held, of the longest idle one.
    fn make_room(&mut self, cap: usize, idle: Duration) {
        self.slots.retain(|_, s| s.idle_for(idle).is_none());
        self.swept = Instant::now();
        if self.slots.len() < cap {
            return;
        }
        let oldest = self
            .slots
            .iter()
            .filter_map(|(t, s)| s.idle_for(Duration::ZERO).map(|d| (d, t)))
            .max_by_key(|(d, _)| *d)
            .map(|(_, t)| t.clone());
        if let Some(t) = oldest {
            self.slots.remove(&t);
        }
    }
}

/// One generation in flight: `llm-end` goes when the last of its container's is dropped.
pub struct InFlight {
    slot: Arc<Slot>,
}

impl Hints {
    /// Hint state for `cap` containers at most; each let go after `idle` with nothing in flight.
    pub fn new(cap: usize, idle: Duration) -> Self {
        Self {
            table: Mutex::new(Table {
                slots: HashMap::new(),
                swept: Instant::now(),
                refused: 0,
                warned: None,
            }),
            cap: cap.max(1),
            idle,
        }
    }

    /// A generation for `target` begins (`expected_tokens` from the request's `max_tokens`):
    /// `llm-start` unless another is already in flight. `None` (no hints for it) when `cap`
    /// containers all have generations in flight. Must run inside the tokio runtime.
    pub fn begin(&self, target: Target, expected_tokens: Option<u64>) -> Option<InFlight> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if !table.slots.contains_key(&target)
            && (table.slots.len() >= self.cap || table.swept.elapsed() >= SWEEP_EVERY)
        {
            table.make_room(self.cap, self.idle);
        }
        if !table.slots.contains_key(&target) && table.slots.len() >= self.cap {
            table.refused += 1;
            if table.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                eprintln!(
                    "belayer gateway: {} containers have generations in flight, the most it keeps \
                     hint state for (--max-containers); {}/{} gets no hints ({} so far)",
                    self.cap, target.namespace, target.container, table.refused
                );
                table.warned = Some(Instant::now());
            }
            return None;
        }
        let slot = table
            .slots
            .entry(target.clone())
            .or_insert_with(|| spawn_sender(target))
            .clone();
        // Counted before the table is let go, so a slot is never dropped with a generation
        // about to begin in it. Held while handing over, so hints go in the counter's order.
        let mut s = slot.lock();
        if s.in_flight == 0 {
            slot.send(HintRequest {
                hint: "llm-start".into(),
                expected_ms: None,
                expected_tokens,
            });
        }
        s.in_flight += 1;
        s.last_used = Instant::now();
        drop(s);
        drop(table);
        Some(InFlight { slot })
    }

    /// Containers with hint state now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .slots
            .len()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.slot.lock();
        s.in_flight = s.in_flight.saturating_sub(1);
        s.last_used = Instant::now();
        if s.in_flight == 0 {
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
            let ctl = Control::new(&target.namespace, &target.container);
            let call = ctl.request::<serde_json::Value>("POST", "hint", Some(&hint));
            let sent = match tokio::time::timeout(HINT_TIMEOUT, call).await {
                Ok(sent) => sent,
                Err(_) => Err(Error::TimedOut(HINT_TIMEOUT)),
            };
            let Err(e) = sent else { continue };
            failed += 1;
            if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                eprintln!(
                    "belayer gateway: hints for {}/{} fail ({failed} so far; next report in a minute at most): {}",
                    target.namespace,
                    target.container,
                    crate::error::one_line(&e)
                );
                warned = Some(Instant::now());
            }
        }
    });
    Arc::new(Slot {
        state: Mutex::new(State {
            in_flight: 0,
            last_used: Instant::now(),
        }),
        next,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(i: usize) -> Target {
        Target {
            namespace: "belayer-gateway-test".into(),
            container: format!("c{i}"),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn many_names_keep_bounded_state_and_tasks() {
        runtime().block_on(async {
            let hints = Hints::new(4, IDLE);
            for i in 0..200 {
                drop(
                    hints
                        .begin(target(i), None)
                        .expect("an idle slot is let go"),
                );
            }
            assert_eq!(hints.len(), 4);
            // The let-go slots' senders end once they delivered what they held (here: failed
            // to, no shim listens).
            let metrics = tokio::runtime::Handle::current().metrics();
            let end = Instant::now() + Duration::from_secs(10);
            while metrics.num_alive_tasks() > 4 {
                assert!(
                    Instant::now() < end,
                    "{} sender tasks alive for 4 slots",
                    metrics.num_alive_tasks()
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }

    #[test]
    fn busy_slots_are_kept_and_idle_ones_let_go() {
        runtime().block_on(async {
            let hints = Hints::new(2, Duration::from_secs(3600));
            let a = hints.begin(target(1), None).unwrap();
            let b = hints.begin(target(2), None).unwrap();
            // Both busy: a third container gets no hints, the first two keep theirs.
            assert!(hints.begin(target(3), None).is_none());
            assert_eq!(hints.len(), 2);
            let a2 = hints.begin(target(1), None).unwrap();
            assert!(Arc::ptr_eq(&a.slot, &a2.slot));
            drop((a, a2));
            // Target 1 idle now: it makes room for target 3; target 2 (busy) stays.
            let c = hints.begin(target(3), None).unwrap();
            assert_eq!(hints.len(), 2);
            let b2 = hints.begin(target(2), None).unwrap();
            assert!(Arc::ptr_eq(&b.slot, &b2.slot));
            drop((b, b2, c));
        });
    }
}
