//! The control API server (see [`api`](crate::api)): one root-only Unix socket per container,
//! HTTP/1.1 with JSON bodies, one request per connection.

use std::path::Path;
use std::sync::{Arc, Mutex};

use log::warn;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use crate::api::{self, ErrorBody};
use crate::error::{Error, Result, io};
use crate::task::Inner;

/// Largest request accepted (headers + body).
const MAX_REQUEST: usize = 64 * 1024;

/// Starts serving container `id`'s control socket.
pub async fn serve(inner: Arc<Inner>, id: &str) -> Result<()> {
    let path = api::socket_path(&inner.namespace, id);
    let dir = path.parent().expect("socket has a parent");
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    set_mode(Path::new("/run/belayer/ctl"), 0o700)?;
    set_mode(dir, 0o700)?;
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(io(format!("bind {}", path.display())))?;
    set_mode(&path, 0o600)?;
    let id = id.to_string();
    let hints = Arc::new(Mutex::new(api::HintStats::default()));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                break;
            };
            let (inner, id, hints) = (inner.clone(), id.clone(), hints.clone());
            tokio::spawn(async move {
                if let Err(e) = handle(inner, &id, hints, stream).await {
                    warn!("control socket of {id}: {e}");
                }
            });
            if inner_gone(&path) {
                break;
            }
        }
    });
    Ok(())
}

fn inner_gone(path: &Path) -> bool {
    !path.exists()
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", path.display())))
}

/// Removes container `id`'s socket; its server stops at the next connection.
pub fn remove(namespace: &str, id: &str) {
    let _ = std::fs::remove_file(api::socket_path(namespace, id));
}

struct Request {
    method: String,
    path: String,
    body: Vec<u8>,
}

async fn read_request(stream: &mut UnixStream) -> std::io::Result<Request> {
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 && buf.is_empty() {
            // A liveness probe (connect, then close): nothing to answer.
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        if n == 0 || buf.len() > MAX_REQUEST {
            return Err(bad("incomplete request"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).into_owned();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or_default().split_whitespace();
    let (method, path) = (
        first.next().unwrap_or_default().to_string(),
        first.next().unwrap_or_default().to_string(),
    );
    let length = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    if length > MAX_REQUEST {
        return Err(bad("request body too large"));
    }
    let mut body = buf[header_end..].to_vec();
    while body.len() < length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(bad("truncated body"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok(Request { method, path, body })
}

/// Hint statistics of one container's socket, for `status`.
type Hints = Mutex<api::HintStats>;

async fn handle(
    inner: Arc<Inner>,
    id: &str,
    hints: Arc<Hints>,
    mut stream: UnixStream,
) -> std::io::Result<()> {
    let root = stream.peer_cred().map(|c| c.uid() == 0).unwrap_or(false);
    let (status, body) = if !root {
        (
            403,
            serde_json::to_vec(&ErrorBody {
                error: "the Belayer control API is root-only".into(),
            })?,
        )
    } else {
        match read_request(&mut stream).await {
            Ok(req) => {
                // On a task of its own: a panic while serving becomes a 500 that says so, not a
                // connection closed without an answer.
                let what = format!("{} {}", req.method, req.path);
                let cid = id.to_string();
                let routed =
                    tokio::spawn(async move { route(&inner, &cid, &hints, &req).await }).await;
                match routed {
                    Ok(Ok(v)) => (200, serde_json::to_vec(&v)?),
                    Ok(Err(e)) => (
                        e.http_status(),
                        serde_json::to_vec(&ErrorBody {
                            error: e.to_string(),
                        })?,
                    ),
                    Err(e) => {
                        warn!("control socket of {id}: {what} panicked: {e}");
                        (
                            500,
                            serde_json::to_vec(&ErrorBody {
                                error: format!(
                                    "internal error in the shim while serving {what}: {e}"
                                ),
                            })?,
                        )
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => (
                400,
                serde_json::to_vec(&ErrorBody {
                    error: e.to_string(),
                })?,
            ),
        }
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        reason(status),
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    // The client may have read its answer and gone already.
    let _ = stream.shutdown().await;
    Ok(())
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        422 => "Unprocessable Entity",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "Internal Server Error",
    }
}

fn body<T: serde::de::DeserializeOwned + Default>(req: &Request) -> Result<T> {
    if req.body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(&req.body)
        .map_err(|e| Error::InvalidArgument(format!("invalid request body: {e}")))
}

async fn route(
    inner: &Arc<Inner>,
    id: &str,
    hints: &Hints,
    req: &Request,
) -> Result<serde_json::Value> {
    let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let json = |v: &dyn erased::Ser| v.value();
    match (req.method.as_str(), parts.as_slice()) {
        ("POST", ["v1", "containers", c, "checkpoint"]) if *c == id => {
            let r: api::CheckpointRequest = body(req)?;
            Ok(json(&inner.checkpoint(id, r.exit).await?))
        }
        ("GET", ["v1", "containers", c, "checkpoints"]) if *c == id => {
            Ok(json(&inner.list_checkpoints(id)?))
        }
        ("GET", ["v1", "containers", c, "checkpoints", cp]) if *c == id => {
            let seq = api::parse_checkpoint_id(cp).map_err(Error::InvalidArgument)?;
            Ok(json(&inner.inspect_checkpoint(id, seq)?))
        }
        ("DELETE", ["v1", "containers", c, "checkpoints", cp]) if *c == id => {
            let seq = api::parse_checkpoint_id(cp).map_err(Error::InvalidArgument)?;
            inner.delete_checkpoint(id, seq).await?;
            Ok(serde_json::json!({}))
        }
        ("POST", ["v1", "containers", c, "restore"]) if *c == id => {
            let r: api::RestoreRequest = body(req)?;
            Ok(json(&inner.restore(id, r.checkpoint).await?))
        }
        ("POST", ["v1", "containers", c, "hint"]) if *c == id => {
            let r: api::HintRequest = body(req)?;
            inner.hint(id, r.to_hint()?)?;
            hints.lock().unwrap_or_else(|e| e.into_inner()).record(&r);
            Ok(serde_json::json!({}))
        }
        ("GET", ["v1", "containers", c, "status"]) if *c == id => {
            let mut status = inner.status(id).await?;
            status.hints = hints.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Ok(json(&status))
        }
        ("GET", ["v1", "containers", c, "journal"]) if *c == id => {
            Ok(json(&inner.journal(id).await?))
        }
        (_, ["v1", "containers", c, ..]) if *c != id => {
            Err(Error::ContainerNotFound(c.to_string()))
        }
        _ => Err(Error::InvalidArgument(format!(
            "no such request: {} {}",
            req.method, req.path
        ))),
    }
}

/// Serializes any response type into a JSON value.
mod erased {
    pub trait Ser {
        fn value(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Ser for T {
        fn value(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or_default()
        }
    }
}
