//! A minimal client of a Belayer shim's control socket (HTTP/1.1 + JSON over a Unix socket),
//! for the one figure the CLI does not print: where a restore's time goes (verify, mount,
//! CRIU restore) as the shim measured it.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use belayer_api::socket_path as socket;
use serde_json::{Value, json};

/// `POST /v1/containers/{id}/restore {"checkpoint": seq}`; the shim's answer (`verify_ms`,
/// `mount_ms`, `restore_ms`, `total_ms`, …) or its error.
pub fn restore(ns: &str, id: &str, seq: u64) -> Result<Value, String> {
    let body = json!({ "checkpoint": seq }).to_string();
    let path = socket(ns, id);
    let mut s =
        UnixStream::connect(&path).map_err(|e| format!("connect {}: {e}", path.display()))?;
    let head = format!(
        "POST /v1/containers/{id}/restore HTTP/1.1\r\nHost: belayer\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body.as_bytes()))
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("read {}: {e}", path.display()))?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("malformed HTTP answer")?;
    let status = String::from_utf8_lossy(&raw[..split])
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let payload = String::from_utf8_lossy(&raw[split + 4..]).into_owned();
    if status != "200" {
        return Err(format!("HTTP {status}: {payload}"));
    }
    serde_json::from_str(&payload).map_err(|e| format!("unreadable answer {payload:?}: {e}"))
}
