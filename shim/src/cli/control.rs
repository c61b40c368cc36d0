//! Client of a shim's control socket (HTTP/1.1 + JSON over a Unix socket).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::api;

pub struct Control {
    container: String,
    socket: PathBuf,
    /// Limit on each read and write of a call; none by default (a checkpoint takes its time).
    timeout: Option<Duration>,
}

impl Control {
    pub fn new(namespace: &str, container: &str) -> Self {
        Self {
            container: container.to_string(),
            socket: api::socket_path(namespace, container),
            timeout: None,
        }
    }

    /// Gives up on a call whose socket stays silent for `timeout` (per read or write).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Whether a shim serves this container (a socket left by a dead shim refuses connections).
    pub fn exists(&self) -> bool {
        UnixStream::connect(&self.socket).is_ok()
    }

    /// This control socket, or a clear error saying why there is none.
    pub fn require(self, containerd: &super::containerd::Containerd) -> Result<Self, String> {
        if self.exists() {
            return Ok(self);
        }
        containerd.container(&self.container)?;
        Err(format!(
            "container {} has no running Belayer task (not started, or not run with runtime io.containerd.belayer.v1)",
            self.container
        ))
    }

    /// `METHOD /v1/containers/{container}/{path}`, returning the decoded answer or the API's error.
    pub fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, String> {
        let body = body
            .map(|b| serde_json::to_vec(b).unwrap_or_default())
            .unwrap_or_default();
        let mut s = UnixStream::connect(&self.socket).map_err(|e| {
            format!(
                "cannot reach the shim of {} at {}: {e}",
                self.container,
                self.socket.display()
            )
        })?;
        s.set_read_timeout(self.timeout)
            .and_then(|_| s.set_write_timeout(self.timeout))
            .map_err(|e| format!("control socket: {e}"))?;
        let head = format!(
            "{method} /v1/containers/{}/{path} HTTP/1.1\r\nHost: belayer\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.container,
            body.len()
        );
        s.write_all(head.as_bytes())
            .and_then(|_| s.write_all(&body))
            .map_err(|e| format!("control socket: {e}"))?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .map_err(|e| format!("control socket: {e}"))?;
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or("control socket: malformed answer")?;
        let status: u16 = String::from_utf8_lossy(&raw[..split])
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or("control socket: malformed status line")?;
        let payload = &raw[split + 4..];
        if status != 200 {
            let err: api::ErrorBody = serde_json::from_slice(payload).unwrap_or(api::ErrorBody {
                error: format!("HTTP {status}"),
            });
            return Err(err.error);
        }
        serde_json::from_slice(payload)
            .map_err(|e| format!("control socket: unreadable answer: {e}"))
    }
}
