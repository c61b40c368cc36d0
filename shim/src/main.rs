//! `containerd-shim-belayer-v1`: containerd starts this binary for runtime
//! `io.containerd.belayer.v1`.

#[tokio::main]
async fn main() {
    containerd_shim::asynchronous::run::<belayer_shim::service::Service>(
        belayer_shim::service::RUNTIME_ID,
        None,
    )
    .await;
}
