//! The engine: the shim's table of containers and every operation on them, whatever asks for it
//! (containerd's task API, the control socket, the shim's own exit monitors and scheduler). Its
//! state is private; each operation lives in the file named for it:
//!
//! - [`lifecycle`]: create, start, exec, kill, delete, state and the exit monitors;
//! - [`checkpoint`]: checkpoints and the store's list, inspect and delete;
//! - [`restore`]: restores in place and at task start (forks, containers without a task);
//! - [`auto`]: automatic checkpoints as the node's scheduler decides them;
//! - [`activity`]: action boundaries from a container's cgroup, for sandboxes without execs;
//! - [`retention`]: which automatic checkpoints go;
//! - [`recovery`]: the restore of a container whose init died, and the journal's position;
//! - [`import_export`]: containerd's checkpoint exports and their import;
//! - [`push`]: a checkpoint pushed to an OCI registry;
//! - [`status`]: what the control API reports of a container.
//!
//! It depends on the container and the primitives below it, never on the adapters above
//! (`task`, `control`, `service`): events go out through containerd's publisher it is given.

mod activity;
mod auto;
mod checkpoint;
mod import_export;
mod lifecycle;
mod push;
mod recovery;
mod replicate;
mod restore;
mod retention;
mod status;

use std::collections::HashMap;
use std::sync::Arc;

use containerd_shim::Context;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::protos::api::StateResponse;
use containerd_shim::protos::protobuf::MessageDyn;
use log::warn;
use tokio::sync::Mutex;

use crate::busy::BusySlot;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::runc::Runc;
use belayer_api::settings::Settings;

/// The exit code journalled for an exec runc could not start (the replay of one meets it too).
pub const EXEC_NOT_STARTED: u32 = 255;

/// The exit status of a process killed by SIGKILL.
pub const SIGKILLED: u32 = 128 + libc::SIGKILL as u32;

type Shared = Arc<Mutex<Container>>;

/// A container in the shim's table, and what can be asked of it without its lock.
#[derive(Clone)]
struct Entry {
    container: Shared,
    busy: BusySlot,
}

/// State shared by the RPC handlers, the control socket and the exit monitors.
pub struct Engine {
    namespace: String,
    runc: Runc,
    settings: Settings,
    containers: std::sync::Mutex<HashMap<String, Entry>>,
    /// The last State answered per (container, exec): the answer while a checkpoint or restore
    /// holds the container longer than [`lifecycle::STATE_WAIT`].
    last_states: std::sync::Mutex<HashMap<(String, String), StateResponse>>,
    /// The node's checkpoint scheduler (per shim process).
    sched: std::sync::Mutex<scheduler::NodeScheduler>,
    /// Automatic checkpoints skipped in a row, per container (one retry pending at most).
    skips: std::sync::Mutex<HashMap<String, auto::Skips>>,
    /// Time origin of the scheduler's clock.
    epoch: std::time::Instant,
    publisher: RemotePublisher,
    /// Pushes of automatic replication that may run at once (`[replication] max_in_flight`).
    replicate_slots: Arc<tokio::sync::Semaphore>,
}

impl Engine {
    pub fn new(
        namespace: &str,
        runc: Runc,
        settings: Settings,
        publisher: RemotePublisher,
    ) -> Arc<Self> {
        Arc::new(Self {
            namespace: namespace.to_string(),
            runc,
            sched: std::sync::Mutex::new(
                scheduler::NodeScheduler::new(settings.scheduler.clone()).unwrap_or_else(|_| {
                    scheduler::NodeScheduler::new(Default::default())
                        .expect("default scheduler config is valid")
                }),
            ),
            epoch: std::time::Instant::now(),
            replicate_slots: Arc::new(tokio::sync::Semaphore::new(
                settings.replication.max_in_flight.max(1),
            )),
            settings,
            containers: Default::default(),
            last_states: Default::default(),
            skips: Default::default(),
            publisher,
        })
    }

    /// The containerd namespace this shim serves.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn entry(&self, id: &str) -> Result<Entry> {
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .cloned()
            .ok_or_else(|| Error::ContainerNotFound(id.to_string()))
    }

    fn get(&self, id: &str) -> Result<Shared> {
        self.entry(id).map(|e| e.container)
    }

    /// Whether a checkpoint or restore of container `id` is under way (see [`Container::busy`]).
    fn busy(&self, id: &str) -> Result<BusySlot> {
        self.entry(id).map(|e| e.busy)
    }

    /// Whether the shim holds no container (containerd may shut it down).
    pub fn is_empty(&self) -> bool {
        self.containers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    async fn publish(&self, topic: &str, event: Box<dyn MessageDyn>) {
        if let Err(e) = self
            .publisher
            .publish(Context::default(), topic, &self.namespace, event)
            .await
        {
            warn!("publish {topic}: {e}");
        }
    }

    /// The node's checkpoint store.
    fn store(&self) -> criu_bridge::Store {
        self.settings.store()
    }

    /// criu-bridge's runc client over this shim's runc root, spawning through the reaper.
    fn bridge_runc(&self) -> criu_bridge::runc::Runc {
        let mut r = criu_bridge::runc::Runc::new(crate::runc::runc_root(&self.namespace));
        r.criu = self.settings.criu.clone();
        r.spawner = Arc::new(crate::reaper::ReaperSpawner);
        r
    }
}
