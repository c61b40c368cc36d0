//! What one gateway serves at most: request body bytes, requests in flight, time to read a
//! request's headers, containers it keeps hint state for. Every bound has a default that an
//! agent fleet on one node does not reach, and a flag.

use std::time::Duration;

/// The gateway's bounds (`belayer gateway --help`).
#[derive(Clone, Debug, clap::Args)]
pub struct Limits {
    /// Largest request body in bytes; a larger one is answered 413 (by its Content-Length before
    /// anything is read, else when the stream passes the bound).
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 20)]
    pub max_body: u64,
    /// Requests served at once; more are answered 503 with Retry-After.
    #[arg(long, value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_concurrent: u32,
    /// Time a client has to send a request's headers before its connection is closed; also how
    /// long an idle keep-alive connection stays open.
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,
    /// Containers the gateway keeps hint state (a sender task) for; the longest idle is let go
    /// to make room, and any idle for 10 minutes.
    #[arg(long, value_name = "N", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_containers: u32,
    /// Listen on a non-loopback address (the gateway has no authentication: whoever reaches it
    /// can send any container's shim hints).
    #[arg(long)]
    pub allow_remote: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body: 32 << 20,
            max_concurrent: 256,
            header_timeout_ms: 30_000,
            max_containers: 1024,
            allow_remote: false,
        }
    }
}

impl Limits {
    /// The header read timeout.
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }

    /// Connections held open at once: room for every request in flight plus idle keep-alive
    /// connections, bounded so the gateway cannot run out of fds.
    pub fn max_connections(&self) -> usize {
        (self.max_concurrent as usize).saturating_mul(4).max(64)
    }
}
