//! The shim process's lifecycle as containerd drives it: `start` spawns the long-lived shim server
//! (one per container, or per Kubernetes pod sandbox), `delete` cleans up after a dead shim, and
//! the server hands containerd the [`TaskService`].

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::publisher::RemotePublisher;
use containerd_shim::asynchronous::{ExitSignal, Shim, spawn};
use containerd_shim::protos::api::DeleteResponse;
use containerd_shim::protos::protobuf::MessageField;
use containerd_shim::{Config, Flags, StartOpts};

use crate::runc::{Runc, runc_root};
use crate::task::TaskService;

/// The runtime type containerd and docker know this shim by.
pub use belayer_api::RUNTIME_ID;

pub struct Service {
    namespace: String,
    id: String,
    bundle: String,
    exit: Arc<ExitSignal>,
}

/// Containers of one Kubernetes pod share the sandbox's shim; so do the forks one
/// `belayer fork` made ([`SHIM_GROUP_ANNOTATION`](belayer_api::SHIM_GROUP_ANNOTATION)).
fn grouping(id: &str) -> String {
    let spec = std::fs::read("config.json").unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(&spec)
        .ok()
        .and_then(|v| {
            let a = &v["annotations"];
            a["io.kubernetes.cri.sandbox-id"]
                .as_str()
                .or(a[belayer_api::SHIM_GROUP_ANNOTATION].as_str())
                .map(str::to_string)
        })
        .unwrap_or_else(|| id.to_string())
}

#[async_trait]
impl Shim for Service {
    type T = TaskService;

    async fn new(_runtime_id: &str, args: &Flags, _config: &mut Config) -> Self {
        Self {
            namespace: args.namespace.clone(),
            id: args.id.clone(),
            bundle: args.bundle.clone(),
            exit: Arc::new(ExitSignal::default()),
        }
    }

    async fn start_shim(&mut self, opts: StartOpts) -> containerd_shim::Result<String> {
        let group = grouping(&opts.id);
        let address = spawn(opts, &group, Vec::new()).await?;
        containerd_shim::util::write_str_to_file("address", &address).await?;
        Ok(address)
    }

    async fn delete_shim(&mut self) -> containerd_shim::Result<DeleteResponse> {
        crate::reaper::start().await?;
        let runc = Runc::new(runc_root(&self.namespace), false);
        let _ = runc.delete(&self.id, true).await;
        let bundle = if self.bundle.is_empty() {
            std::env::current_dir().unwrap_or_default()
        } else {
            PathBuf::from(&self.bundle)
        };
        crate::rootfs::unmount(&bundle.join("rootfs"));
        crate::control::remove(&self.namespace, &self.id);
        Ok(DeleteResponse {
            exit_status: crate::engine::SIGKILLED,
            exited_at: MessageField::some(crate::process::now()),
            ..Default::default()
        })
    }

    async fn wait(&mut self) {
        self.exit.wait().await;
    }

    async fn create_task_service(&self, publisher: RemotePublisher) -> Self::T {
        if let Err(e) = crate::reaper::start().await {
            log::error!("start reaper: {e}");
        }
        let runc = Runc::new(runc_root(&self.namespace), false);
        let settings = belayer_api::settings::Settings::load().unwrap_or_else(|e| {
            log::error!("{}; using default settings", belayer_api::report::chain(&e));
            Default::default()
        });
        // Root-only at rest, whatever the umask or a deployment made of the store root.
        if let Err(e) = settings.store().secure() {
            log::error!("the checkpoint store is not private: {e}");
        }
        let engine = crate::engine::Engine::new(&self.namespace, runc, settings, publisher);
        TaskService::new(engine, self.exit.clone())
    }
}
