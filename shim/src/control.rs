//! The control API server (see [`belayer_api`]): one root-only Unix socket per container,
//! HTTP/1.1 (hyper) with JSON bodies, one request per connection.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use log::warn;
use tokio::net::UnixListener;

use belayer_api::{self as api, ErrorBody};

use crate::engine::Engine;
use crate::error::{Error, Result, io};

/// Largest request body accepted.
const MAX_REQUEST: usize = 64 * 1024;

/// Starts serving container `id`'s control socket.
pub async fn serve(engine: Arc<Engine>, id: &str) -> Result<()> {
    let path = api::socket_path(engine.namespace(), id);
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
            let root = stream.peer_cred().map(|c| c.uid() == 0).unwrap_or(false);
            let (engine, id, hints) = (engine.clone(), id.clone(), hints.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let (engine, id, hints) = (engine.clone(), id.clone(), hints.clone());
                    async move { Ok::<_, Infallible>(answer(engine, &id, hints, root, req).await) }
                });
                // One request per connection; a liveness probe (connect, then close) ends
                // without one, which is no error.
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                    && !e.is_incomplete_message()
                {
                    warn!("control socket: {e}");
                }
            });
            if socket_gone(&path) {
                break;
            }
        }
    });
    Ok(())
}

fn socket_gone(path: &Path) -> bool {
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

/// A request as the router sees it.
struct Request {
    method: String,
    path: String,
    body: Bytes,
}

/// Hint statistics of one container's socket, for `status`.
type Hints = Mutex<api::HintStats>;

/// The answer to one request: 403 to anyone but root, 400 for a body over [`MAX_REQUEST`], else
/// what [`route`] makes of it (a panic while serving becomes a 500 that says so).
async fn answer(
    engine: Arc<Engine>,
    id: &str,
    hints: Arc<Hints>,
    root: bool,
    req: hyper::Request<Incoming>,
) -> Response<Full<Bytes>> {
    if !root {
        return error(403, "the Belayer control API is root-only".into());
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_REQUEST).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(400, format!("reading the request: {e}")),
    };
    let req = Request {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        body,
    };
    // On a task of its own: a panic while serving becomes a 500 that says so, not a
    // connection closed without an answer.
    let what = format!("{} {}", req.method, req.path);
    let cid = id.to_string();
    match tokio::spawn(async move { route(&engine, &cid, &hints, &req).await }).await {
        Ok(Ok(v)) => json(200, &v),
        Ok(Err(e)) => error(e.http_status(), e.message()),
        Err(e) => {
            warn!("control socket of {id}: {what} panicked: {e}");
            error(
                500,
                format!("internal error in the shim while serving {what}: {e}"),
            )
        }
    }
}

fn json(status: u16, body: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from(bytes)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: u16, error: String) -> Response<Full<Bytes>> {
    json(status, &ErrorBody { error })
}

fn body<T: serde::de::DeserializeOwned + Default>(req: &Request) -> Result<T> {
    if req.body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(&req.body).map_err(Error::Body)
}

/// A request of the control API, parsed from its method and path.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Checkpoint,
    ListCheckpoints,
    InspectCheckpoint(u64),
    DeleteCheckpoint(u64),
    Restore,
    Hint,
    Status,
    Journal,
    Push,
}

/// What `method path` asks of container `id`'s socket: a route, or the error it answers (404
/// for another container, 400 for anything else).
fn parse_route(method: &str, path: &str, id: &str) -> Result<Route> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let route = match (method, parts.as_slice()) {
        (_, ["v1", "containers", c, ..]) if *c != id => {
            return Err(Error::ContainerNotFound(c.to_string()));
        }
        ("POST", ["v1", "containers", _, "checkpoint"]) => Route::Checkpoint,
        ("GET", ["v1", "containers", _, "checkpoints"]) => Route::ListCheckpoints,
        ("GET", ["v1", "containers", _, "checkpoints", cp]) => {
            Route::InspectCheckpoint(api::parse_checkpoint_id(cp)?)
        }
        ("DELETE", ["v1", "containers", _, "checkpoints", cp]) => {
            Route::DeleteCheckpoint(api::parse_checkpoint_id(cp)?)
        }
        ("POST", ["v1", "containers", _, "restore"]) => Route::Restore,
        ("POST", ["v1", "containers", _, "hint"]) => Route::Hint,
        ("GET", ["v1", "containers", _, "status"]) => Route::Status,
        ("GET", ["v1", "containers", _, "journal"]) => Route::Journal,
        ("POST", ["v1", "containers", _, "push"]) => Route::Push,
        _ => {
            return Err(Error::InvalidArgument(format!(
                "no such request: {method} {path}"
            )));
        }
    };
    Ok(route)
}

async fn route(
    engine: &Arc<Engine>,
    id: &str,
    hints: &Hints,
    req: &Request,
) -> Result<serde_json::Value> {
    let json = |v: &dyn erased::Ser| v.value();
    match parse_route(&req.method, &req.path, id)? {
        Route::Checkpoint => {
            let r: api::CheckpointRequest = body(req)?;
            Ok(json(&engine.checkpoint(id, r.exit).await?))
        }
        Route::ListCheckpoints => Ok(json(&engine.list_checkpoints(id)?)),
        Route::InspectCheckpoint(seq) => Ok(json(&engine.inspect_checkpoint(id, seq)?)),
        Route::DeleteCheckpoint(seq) => {
            engine.delete_checkpoint(id, seq).await?;
            Ok(serde_json::json!({}))
        }
        Route::Restore => {
            let r: api::RestoreRequest = body(req)?;
            Ok(json(&engine.restore(id, r.checkpoint).await?))
        }
        Route::Hint => {
            let r: api::HintRequest = body(req)?;
            engine.hint(id, r.to_hint()?)?;
            hints.lock().unwrap_or_else(|e| e.into_inner()).record(&r);
            Ok(serde_json::json!({}))
        }
        Route::Status => {
            let mut status = engine.status(id).await?;
            status.hints = hints.lock().unwrap_or_else(|e| e.into_inner()).clone();
            Ok(json(&status))
        }
        Route::Journal => Ok(json(&engine.journal(id).await?)),
        Route::Push => {
            let r: api::PushRequest = body(req)?;
            Ok(json(&engine.push(id, r).await?))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_route_by_method_and_path() {
        let r = |m: &str, p: &str| parse_route(m, p, "c1");
        assert_eq!(
            r("POST", "/v1/containers/c1/checkpoint").unwrap(),
            Route::Checkpoint
        );
        assert_eq!(
            r("GET", "/v1/containers/c1/checkpoints").unwrap(),
            Route::ListCheckpoints
        );
        assert_eq!(
            r("GET", "/v1/containers/c1/checkpoints/7").unwrap(),
            Route::InspectCheckpoint(7)
        );
        assert_eq!(
            r("DELETE", "/v1/containers/c1/checkpoints/7/").unwrap(),
            Route::DeleteCheckpoint(7)
        );
        assert_eq!(
            r("POST", "/v1/containers/c1/restore").unwrap(),
            Route::Restore
        );
        assert_eq!(r("POST", "/v1/containers/c1/hint").unwrap(), Route::Hint);
        assert_eq!(r("GET", "/v1/containers/c1/status").unwrap(), Route::Status);
        assert_eq!(
            r("GET", "/v1/containers/c1/journal").unwrap(),
            Route::Journal
        );
        assert_eq!(r("POST", "/v1/containers/c1/push").unwrap(), Route::Push);
    }

    #[test]
    fn other_containers_are_not_found_and_other_requests_invalid() {
        let e = parse_route("GET", "/v1/containers/c2/status", "c1").unwrap_err();
        assert!(
            matches!(e, Error::ContainerNotFound(ref c) if c == "c2"),
            "{e}"
        );
        assert_eq!(e.http_status(), 404);
        for (m, p) in [
            ("GET", "/v1/containers/c1/checkpoint"),
            ("PUT", "/v1/containers/c1/status"),
            ("GET", "/v2/containers/c1/status"),
            ("GET", "/"),
        ] {
            let e = parse_route(m, p, "c1").unwrap_err();
            assert_eq!(e.http_status(), 400, "{m} {p}: {e}");
        }
        let bad_id = parse_route("GET", "/v1/containers/c1/checkpoints/x", "c1").unwrap_err();
        assert_eq!(bad_id.http_status(), 400);
    }
}
