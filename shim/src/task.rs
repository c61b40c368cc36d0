//! containerd's task API (v2) served over ttrpc: each RPC is a call into the
//! [`Engine`]; errors become ttrpc statuses ([`crate::error`]). A created container's control
//! socket ([`crate::control`]) is served from here, and removed with it.

use std::sync::Arc;

use async_trait::async_trait;
use containerd_shim::asynchronous::ExitSignal;
use containerd_shim::protos::api::{
    CheckpointTaskRequest, CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest,
    CreateTaskResponse, DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest,
    PauseRequest, PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest,
    StartRequest, StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse,
    UpdateTaskRequest, WaitRequest, WaitResponse,
};
use containerd_shim::{TtrpcContext, TtrpcResult};
use log::warn;

use crate::engine::Engine;

/// The task service containerd talks to.
#[derive(Clone)]
pub struct TaskService {
    engine: Arc<Engine>,
    /// Signalled when containerd shuts the shim down with no container left.
    exit: Arc<ExitSignal>,
}

impl TaskService {
    pub fn new(engine: Arc<Engine>, exit: Arc<ExitSignal>) -> Self {
        Self { engine, exit }
    }
}

#[async_trait]
impl containerd_shim::Task for TaskService {
    async fn create(
        &self,
        _ctx: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> TtrpcResult<CreateTaskResponse> {
        let id = req.id.clone();
        let created = self.engine.create(req).await?;
        if let Err(e) = crate::control::serve(self.engine.clone(), &id).await {
            warn!("container {id}: no control socket: {}", e.message());
        }
        Ok(created)
    }

    async fn start(&self, _ctx: &TtrpcContext, req: StartRequest) -> TtrpcResult<StartResponse> {
        Ok(self.engine.start(req).await?)
    }

    async fn exec(&self, _ctx: &TtrpcContext, req: ExecProcessRequest) -> TtrpcResult<Empty> {
        self.engine.exec(req).await?;
        Ok(Empty::new())
    }

    async fn kill(&self, _ctx: &TtrpcContext, req: KillRequest) -> TtrpcResult<Empty> {
        self.engine
            .kill(&req.id, &req.exec_id, req.signal, req.all)
            .await?;
        Ok(Empty::new())
    }

    async fn delete(&self, _ctx: &TtrpcContext, req: DeleteRequest) -> TtrpcResult<DeleteResponse> {
        let container = req.exec_id.is_empty().then(|| req.id.clone());
        let deleted = self.engine.delete(req).await?;
        if let Some(id) = container {
            crate::control::remove(self.engine.namespace(), &id);
        }
        Ok(deleted)
    }

    async fn wait(&self, _ctx: &TtrpcContext, req: WaitRequest) -> TtrpcResult<WaitResponse> {
        Ok(self.engine.wait(&req.id, &req.exec_id).await?)
    }

    async fn state(&self, _ctx: &TtrpcContext, req: StateRequest) -> TtrpcResult<StateResponse> {
        Ok(self.engine.state(req).await?)
    }

    async fn pids(&self, _ctx: &TtrpcContext, req: PidsRequest) -> TtrpcResult<PidsResponse> {
        Ok(self.engine.pids(&req.id).await?)
    }

    async fn pause(&self, _ctx: &TtrpcContext, req: PauseRequest) -> TtrpcResult<Empty> {
        self.engine.pause_resume(&req.id, true).await?;
        Ok(Empty::new())
    }

    async fn resume(&self, _ctx: &TtrpcContext, req: ResumeRequest) -> TtrpcResult<Empty> {
        self.engine.pause_resume(&req.id, false).await?;
        Ok(Empty::new())
    }

    async fn stats(&self, _ctx: &TtrpcContext, req: StatsRequest) -> TtrpcResult<StatsResponse> {
        Ok(self.engine.stats(&req.id).await?)
    }

    async fn checkpoint(
        &self,
        _ctx: &TtrpcContext,
        req: CheckpointTaskRequest,
    ) -> TtrpcResult<Empty> {
        let options = req.options.as_ref().map(|o| o.value.as_slice());
        self.engine
            .checkpoint_for_containerd(&req.id, &req.path, options)
            .await?;
        Ok(Empty::new())
    }

    async fn update(&self, _ctx: &TtrpcContext, req: UpdateTaskRequest) -> TtrpcResult<Empty> {
        self.engine.update(req).await?;
        Ok(Empty::new())
    }

    async fn close_io(&self, _ctx: &TtrpcContext, req: CloseIORequest) -> TtrpcResult<Empty> {
        self.engine.close_io(&req.id, &req.exec_id).await?;
        Ok(Empty::new())
    }

    async fn resize_pty(&self, _ctx: &TtrpcContext, req: ResizePtyRequest) -> TtrpcResult<Empty> {
        self.engine
            .resize_pty(&req.id, &req.exec_id, req.width, req.height)
            .await?;
        Ok(Empty::new())
    }

    async fn connect(
        &self,
        _ctx: &TtrpcContext,
        req: ConnectRequest,
    ) -> TtrpcResult<ConnectResponse> {
        Ok(ConnectResponse {
            shim_pid: std::process::id(),
            task_pid: self.engine.task_pid(&req.id).await,
            version: env!("CARGO_PKG_VERSION").to_string(),
            ..Default::default()
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: ShutdownRequest) -> TtrpcResult<Empty> {
        if self.engine.is_empty() {
            self.exit.signal();
        }
        Ok(Empty::new())
    }
}
