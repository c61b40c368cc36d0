//! `containerd-shim-belayer-v1`: containerd starts this binary for runtime
//! `io.containerd.belayer.v1`.

fn main() {
    // runc runs this binary as the spec's loopback hook (belayer_shim::netns).
    if std::env::args().nth(1).as_deref() == Some(belayer_shim::netns::HOOK_ARG) {
        if let Err(e) = belayer_shim::netns::run_hook(std::io::stdin()) {
            eprintln!("{}", belayer_shim::error::chain(&e));
            std::process::exit(1);
        }
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the tokio runtime")
        .block_on(containerd_shim::asynchronous::run::<
            belayer_shim::service::Service,
        >(belayer_shim::service::RUNTIME_ID, None));
}
