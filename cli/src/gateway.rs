//! `belayer gateway`: an HTTP pass-through in front of an OpenAI-compatible LLM server that tells
//! each request's sandbox when its generation starts and ends (`llm-start`/`llm-end` hints), so
//! the checkpoint scheduler sees the exact LLM bubbles with no change to the agent but its base
//! URL.
//!
//! A request is for container C when it carries `X-Belayer-Container: C` (namespace:
//! `X-Belayer-Namespace`, else the CLI's), else when a `--map KEY=C` has KEY equal to the bearer
//! token of its `Authorization` header, else to the `user` field of its JSON body. Every POST for
//! a container is a generation: `llm-start` (with `expected_tokens` from `max_completion_tokens`,
//! `max_tokens` or `max_output_tokens`) as it arrives, `llm-end` once its response has been sent
//! or it failed, counting concurrent ones per container. `X-Belayer-*` headers never go upstream.
//!
//! Every client is a tenant: names from headers are checked as containerd names before they reach
//! a socket path (400 otherwise), and bodies, requests in flight, header read time, connections
//! and per-container state are bounded ([`Limits`]); it listens on loopback unless told otherwise.

mod hints;
mod limits;
mod names;

pub use limits::Limits;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use hints::{Hints, InFlight, Target};

/// How long an idle upstream connection stays pooled.
const POOL_IDLE: Duration = Duration::from_secs(90);

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// What `belayer gateway` was asked to do.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: SocketAddr,
    /// `http://HOST[:PORT][/PREFIX]`: request paths are appended to PREFIX.
    pub upstream: String,
    /// `KEY=CONTAINER` pairs (see the module docs).
    pub maps: Vec<(String, String)>,
    /// Namespace of mapped containers unless `X-Belayer-Namespace` says otherwise.
    pub namespace: String,
    /// What it serves at most.
    pub limits: Limits,
}

/// Why the gateway cannot start (or a `--map` is not one).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0:?} is not KEY=CONTAINER")]
    NotAMap(String),
    #[error(transparent)]
    Name(#[from] names::InvalidName),
    #[error("upstream {url:?} is not a URL")]
    NotAUrl {
        url: String,
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    #[error(
        "upstream {0}: https is not supported; point --upstream at an http:// address (a local TLS proxy such as stunnel can bridge to an https server)"
    )]
    Https(String),
    #[error("upstream {0:?}: use an http://HOST:PORT URL")]
    NotHttp(String),
    #[error("upstream {0:?} has no host")]
    NoHost(String),
    #[error(
        "listen on {0}: not a loopback address; the gateway has no authentication, so pass --allow-remote to listen there"
    )]
    NotLoopback(SocketAddr),
    #[error("tokio runtime")]
    Runtime(#[source] std::io::Error),
    #[error("listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the connection limit closed")]
    Closed,
}

impl GatewayError {
    /// An argument is wrong (rather than the machine).
    pub fn is_invalid_argument(&self) -> bool {
        !matches!(
            self,
            GatewayError::Runtime(_) | GatewayError::Listen { .. } | GatewayError::Closed
        )
    }
}

/// Parses `--map KEY=CONTAINER` (split at the last `=`: container ids have none, keys may).
pub fn parse_map(s: &str) -> Result<(String, String), GatewayError> {
    match s.rsplit_once('=') {
        Some((k, c)) if !k.is_empty() && !c.is_empty() => {
            names::check("container", c)?;
            Ok((k.to_string(), c.to_string()))
        }
        _ => Err(GatewayError::NotAMap(s.to_string())),
    }
}

/// The upstream's parts a forwarded request's URI is built from.
struct Upstream {
    url: String,
    authority: hyper::http::uri::Authority,
    prefix: String,
}

impl Upstream {
    fn parse(url: &str) -> Result<Self, GatewayError> {
        let uri: Uri = url.parse().map_err(|source| GatewayError::NotAUrl {
            url: url.to_string(),
            source,
        })?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(GatewayError::Https(url.to_string())),
            _ => return Err(GatewayError::NotHttp(url.to_string())),
        }
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| GatewayError::NoHost(url.to_string()))?;
        Ok(Self {
            url: url.to_string(),
            authority,
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }

    fn uri(&self, original: &Uri) -> Result<Uri, hyper::http::Error> {
        let pq = original.path_and_query().map_or("/", |p| p.as_str());
        Uri::builder()
            .scheme("http")
            .authority(self.authority.clone())
            .path_and_query(format!("{}{pq}", self.prefix))
            .build()
    }
}

struct Gateway {
    upstream: Upstream,
    maps: HashMap<String, String>,
    namespace: String,
    client: Client<HttpConnector, Body>,
    hints: Hints,
    max_body: u64,
    /// One permit per request in flight (its response streamed to the end).
    requests: Arc<Semaphore>,
    max_concurrent: u32,
}

/// Serves until killed; the error is why it could not start.
pub fn run(cfg: Config) -> Result<(), GatewayError> {
    let upstream = Upstream::parse(&cfg.upstream)?;
    names::check("namespace", &cfg.namespace)?;
    let limits = cfg.limits.clone();
    if !cfg.listen.ip().is_loopback() && !limits.allow_remote {
        return Err(GatewayError::NotLoopback(cfg.listen));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(GatewayError::Runtime)?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| GatewayError::Listen {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| GatewayError::Listen {
                addr: cfg.listen,
                source,
            })?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let gw = Arc::new(Gateway {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE)
                .build(connector),
            upstream,
            maps: cfg.maps.into_iter().collect(),
            namespace: cfg.namespace,
            hints: Hints::new(limits.max_containers as usize, hints::IDLE),
            max_body: limits.max_body,
            requests: Arc::new(Semaphore::new(limits.max_concurrent as usize)),
            max_concurrent: limits.max_concurrent,
        });
        let connections = Arc::new(Semaphore::new(limits.max_connections()));
        // The bound address (useful with port 0), first thing on stdout.
        println!(
            "listening on http://{addr}, forwarding to {}",
            gw.upstream.url
        );
        loop {
            // Waits (the kernel queues new connections) while as many are open as allowed.
            let Ok(open) = connections.clone().acquire_owned().await else {
                return Err(GatewayError::Closed);
            };
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("belayer gateway: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let gw = gw.clone();
            let header_timeout = limits.header_timeout();
            tokio::spawn(async move {
                let _open = open;
                let svc = hyper::service::service_fn(move |req| {
                    let gw = gw.clone();
                    async move { Ok::<_, Infallible>(gw.forward(req).await) }
                });
                // A client that goes away mid-request is no gateway error.
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    })
}

impl Gateway {
    async fn forward(&self, req: Request<Incoming>) -> Response<Body> {
        let Ok(permit) = self.requests.clone().try_acquire_owned() else {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_requests",
                format!(
                    "{} requests are in flight, the most this gateway serves at once",
                    self.max_concurrent
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        };
        let (mut parts, body) = req.into_parts();
        if let Some(n) = content_length(&parts.headers)
            && n > self.max_body
        {
            return self.too_large();
        }
        let mut target = match self.header_target(&parts.headers) {
            Ok(t) => t,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "invalid_container_name",
                    e.to_string(),
                );
            }
        };
        strip_belayer(&mut parts.headers);
        if target.is_none() {
            target = bearer(&parts.headers).and_then(|t| self.mapped(t));
        }
        let hinted = parts.method == Method::POST && (target.is_some() || !self.maps.is_empty());
        let (body, expected_tokens) = if hinted && is_json(&parts.headers) {
            let limit = usize::try_from(self.max_body).unwrap_or(usize::MAX);
            let bytes = match Limited::new(body, limit).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) if e.is::<http_body_util::LengthLimitError>() => return self.too_large(),
                Err(e) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "request_unreadable",
                        format!("reading the request body: {e}"),
                    );
                }
            };
            let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
            if target.is_none() {
                target = json["user"].as_str().and_then(|u| self.mapped(u));
            }
            let tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
                .iter()
                .find_map(|k| json[*k].as_u64());
            let full = Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync();
            (full, tokens)
        } else {
            // Streamed through: the bound ends the stream (and the request) where it is passed.
            let limit = usize::try_from(self.max_body).unwrap_or(usize::MAX);
            (Limited::new(body, limit).boxed_unsync(), None)
        };
        let guard = match (&target, parts.method == Method::POST) {
            (Some(t), true) => self.hints.begin(t.clone(), expected_tokens),
            _ => None,
        };
        parts.uri = match self.upstream.uri(&parts.uri) {
            Ok(u) => u,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "bad_path",
                    format!("cannot forward {}: {e}", parts.uri),
                );
            }
        };
        strip_hop_by_hop(&mut parts.headers);
        parts.version = hyper::Version::HTTP_11;
        // The client sets Host from the upstream's URI.
        parts.headers.remove(header::HOST);
        match self.client.request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                // Framed by this server for its client, whatever the upstream spoke.
                parts.version = hyper::Version::HTTP_11;
                let body = Tracked {
                    inner: body,
                    guard,
                    _permit: permit,
                }
                .boxed_unsync();
                Response::from_parts(parts, body)
            }
            Err(e) if caused_by::<http_body_util::LengthLimitError>(&e) => self.too_large(),
            Err(e) => error(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                format!(
                    "upstream {} failed: {}",
                    self.upstream.url,
                    crate::error::one_line(&e)
                ),
            ),
        }
    }

    /// The container the `X-Belayer-*` headers name, if any; an error when a name is not one.
    fn header_target(&self, h: &HeaderMap) -> Result<Option<Target>, names::InvalidName> {
        let get = |n: &str| {
            h.get(n)
                .map(|v| v.to_str().map(str::trim).unwrap_or("\u{fffd}"))
                .filter(|v| !v.is_empty())
        };
        let namespace = get("x-belayer-namespace");
        if let Some(ns) = namespace {
            names::check("namespace", ns)?;
        }
        let Some(container) = get("x-belayer-container") else {
            return Ok(None);
        };
        names::check("container", container)?;
        Ok(Some(Target {
            namespace: namespace.unwrap_or(&self.namespace).to_string(),
            container: container.to_string(),
        }))
    }

    fn too_large(&self) -> Response<Body> {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("request body over {} bytes", self.max_body),
        )
    }

    fn mapped(&self, key: &str) -> Option<Target> {
        self.maps.get(key).map(|c| Target {
            namespace: self.namespace.clone(),
            container: c.clone(),
        })
    }
}

/// Removes `X-Belayer-*` headers.
fn strip_belayer(h: &mut HeaderMap) {
    let ours: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with("x-belayer-"))
        .cloned()
        .collect();
    for k in ours {
        h.remove(k);
    }
}

/// The bearer token of `Authorization`.
fn bearer(h: &HeaderMap) -> Option<&str> {
    let v = h.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then_some(token.trim())
}

/// The request's `Content-Length`, if it has a valid one.
fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether an `E` is somewhere in `e`'s source chain.
fn caused_by<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.is::<E>() {
            return true;
        }
        cur = c.source();
    }
    false
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("json"))
}

/// Removes the headers that describe one connection, not the message (RFC 9110 §7.6.1).
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        h.remove(n);
    }
}

/// An OpenAI-style error answer from the gateway itself.
fn error(status: StatusCode, code: &str, message: String) -> Response<Body> {
    let body = serde_json::json!({
        "error": {
            "message": format!("belayer gateway: {message}"),
            "type": "belayer_gateway_error",
            "code": code,
        }
    });
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A response body that ends its generation (drops its [`InFlight`]) at its last frame, or when
/// the client goes away and the server drops it; it holds its request's place among those in
/// flight until the server drops it.
struct Tracked {
    inner: Incoming,
    guard: Option<InFlight>,
    _permit: OwnedSemaphorePermit,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard.take();
        }
        polled.map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_split_at_the_last_equals() {
        assert_eq!(
            parse_map("sk-abc==box1").unwrap(),
            ("sk-abc=".to_string(), "box1".to_string())
        );
        assert!(parse_map("nobox").is_err());
        assert!(parse_map("key=").is_err());
    }

    #[test]
    fn https_upstreams_are_refused_by_name() {
        let e = Upstream::parse("https://api.example.com/v1")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("https://api.example.com/v1"), "{e}");
        let u = Upstream::parse("http://127.0.0.1:8000/openai/").unwrap();
        let uri = u.uri(&"/v1/models?x=1".parse().unwrap()).unwrap();
        assert_eq!(
            uri.to_string(),
            "http://127.0.0.1:8000/openai/v1/models?x=1"
        );
    }

    #[test]
    fn bearer_tokens_and_belayer_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer sk-1 ".parse().unwrap());
        h.insert("x-belayer-container", "box".parse().unwrap());
        h.insert("x-other", "keep".parse().unwrap());
        assert_eq!(bearer(&h), Some("sk-1"));
        strip_belayer(&mut h);
        assert!(h.get("x-belayer-container").is_none());
        assert!(h.get("x-other").is_some());
    }
}
