//! Calls of containerd's gRPC API that `ctr` has no command for (task update).

use containerd_client::services::v1::UpdateTaskRequest;
use containerd_client::tonic::Request;
use containerd_client::with_namespace;

use crate::Containerd;

/// The type URL containerd registers for an OCI `LinuxResources` (carried as JSON).
const LINUX_RESOURCES: &str = "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources";

impl Containerd {
    /// `Tasks.Update` with an OCI `LinuxResources` JSON document. Returns the gRPC error text.
    pub fn update_task(&self, id: &str, resources: &serde_json::Value) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async {
            let channel = containerd_client::connect(&self.sock)
                .await
                .map_err(|e| e.to_string())?;
            let mut tasks =
                containerd_client::services::v1::tasks_client::TasksClient::new(channel);
            let req = UpdateTaskRequest {
                container_id: id.to_string(),
                resources: Some(prost_types::Any {
                    type_url: LINUX_RESOURCES.to_string(),
                    value: serde_json::to_vec(resources).map_err(|e| e.to_string())?,
                }),
                ..Default::default()
            };
            tasks
                .update(with_namespace!(req, self.ns.as_str()))
                .await
                .map(drop)
                .map_err(|s| s.message().to_string())
        })
    }
}
