//! The distribution-spec client: blobs (HEAD, GET, monolithic or chunked upload, cross-repo
//! mount) and manifests (PUT, GET), with Basic and Bearer authentication. Plain HTTP only.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::auth::{Challenge, Credentials, credentials_for, docker_config_path, parse_challenge};
use crate::digest::Digest;
use crate::error::{Error, io};
use crate::oci::Descriptor;

/// Which registries may be spoken to in plain HTTP (the only transport so far).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PlainHttp {
    /// Loopback hosts only (`localhost`, `127.0.0.0/8`, `::1`): others are refused.
    #[default]
    Loopback,
    /// Any host (an insecure registry on a private network).
    Any,
}

/// How a [`Client`] talks to its registry.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Hosts allowed in plain HTTP.
    pub plain_http: PlainHttp,
    /// Credentials; `None`: those of the docker config ([`credentials_for`]), if any.
    pub credentials: Option<Credentials>,
    /// Blobs up to this size go up in one `PUT`; larger ones in `PATCH` chunks of this size.
    pub chunk_size: u64,
    /// The longest wait for a response's headers or for one piece of its body.
    pub timeout: Duration,
    /// The most blob bytes a second this client uploads, on average since its first upload
    /// (it waits between pieces, of at most a quarter second's worth each); 0: no bound.
    pub max_bytes_per_s: u64,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            plain_http: PlainHttp::Loopback,
            credentials: None,
            chunk_size: 32 << 20,
            timeout: Duration::from_secs(120),
            max_bytes_per_s: 0,
        }
    }
}

/// What a client sent: the test and the push report count uploads with it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Blobs uploaded, in order.
    pub uploaded: Vec<Digest>,
    /// Blobs mounted from another repository.
    pub mounted: Vec<Digest>,
    /// Blob bytes uploaded.
    pub bytes: u64,
}

#[derive(Default)]
struct AuthState {
    /// A Basic challenge was seen: send the credentials with every request.
    basic: bool,
    /// Bearer tokens by scope.
    tokens: HashMap<String, String>,
}

/// A client of one registry.
pub struct Client {
    http: HyperClient<HttpConnector, Full<Bytes>>,
    registry: String,
    base: String,
    options: ClientOptions,
    credentials: Option<Credentials>,
    auth: Mutex<AuthState>,
    sent: Mutex<Sent>,
    /// When the first upload began and the bytes uploaded since ([`ClientOptions::max_bytes_per_s`]).
    paced: Mutex<(Option<Instant>, u64)>,
}

/// What a request asks of a repository: the scope of a Bearer token.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    Pull,
    Push,
}

fn scope(repository: &str, access: Access) -> String {
    match access {
        Access::Pull => format!("repository:{repository}:pull"),
        Access::Push => format!("repository:{repository}:pull,push"),
    }
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The first bytes of an error body, for a message.
async fn error_body(resp: Response<Incoming>) -> String {
    let mut out = Vec::new();
    let mut body = resp.into_body();
    while out.len() < 512 {
        match tokio::time::timeout(Duration::from_secs(5), body.frame()).await {
            Ok(Some(Ok(f))) => {
                if let Ok(d) = f.into_data() {
                    out.extend_from_slice(&d);
                }
            }
            _ => break,
        }
    }
    out.truncate(512);
    String::from_utf8_lossy(&out).trim().to_string()
}

impl Client {
    /// A client of `registry` (`host[:port]`). An https registry is not supported yet: only
    /// plain HTTP, to loopback unless [`PlainHttp::Any`].
    pub fn new(registry: &str, options: ClientOptions) -> Result<Self, Error> {
        let host = crate::reference::host_of(registry);
        if options.plain_http == PlainHttp::Loopback && !is_loopback(host) {
            return Err(Error::Refused {
                registry: registry.into(),
                why: "only plain HTTP is supported so far, and only to a loopback registry \
                      unless allowed (PlainHttp::Any); https is not implemented"
                    .into(),
            });
        }
        let credentials = match &options.credentials {
            Some(c) => Some(c.clone()),
            None => credentials_for(registry)?,
        };
        let http = HyperClient::builder(TokioExecutor::new()).build_http();
        Ok(Self {
            http,
            registry: registry.into(),
            base: format!("http://{registry}"),
            options,
            credentials,
            auth: Mutex::new(AuthState::default()),
            sent: Mutex::new(Sent::default()),
            paced: Mutex::new((None, 0)),
        })
    }

    /// The registry.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// What this client has uploaded so far.
    pub fn sent(&self) -> Sent {
        self.sent.lock().expect("sent").clone()
    }

    fn auth_header(&self, scope: &str) -> Option<String> {
        let state = self.auth.lock().expect("auth");
        // A token that may push may pull too.
        let wider = scope
            .strip_suffix(":pull")
            .map(|s| format!("{s}:pull,push"));
        if let Some(t) = state
            .tokens
            .get(scope)
            .or_else(|| wider.and_then(|w| state.tokens.get(&w)))
        {
            return Some(format!("Bearer {t}"));
        }
        if state.basic {
            return self.credentials.as_ref().map(Credentials::basic_header);
        }
        None
    }

    fn whose_credentials(&self) -> String {
        match (&self.options.credentials, &self.credentials) {
            (Some(c), _) => format!("the credentials given for user {:?}", c.username),
            (None, Some(c)) => format!(
                "user {:?} from {}",
                c.username,
                docker_config_path().unwrap_or_default().display()
            ),
            (None, None) => format!(
                "no credentials: none given and none for {} in {}",
                self.registry,
                docker_config_path().unwrap_or_default().display()
            ),
        }
    }

    fn unauthorized(&self, step: &str, status: StatusCode) -> Error {
        Error::Unauthorized {
            step: step.into(),
            registry: self.registry.clone(),
            status: status.as_u16(),
            why: self.whose_credentials(),
        }
    }

    fn transport(&self, step: &str, url: &str, why: impl ToString) -> Error {
        Error::Transport {
            step: step.into(),
            url: url.into(),
            why: why.to_string(),
        }
    }

    /// Sends a request (authenticated: a 401 is answered once, by Basic credentials or a Bearer
    /// token for `scope`); a 401 or 403 after that is [`Error::Unauthorized`].
    async fn send(
        &self,
        step: &str,
        scope: &str,
        method: Method,
        url: &str,
        headers: &[(header::HeaderName, String)],
        body: Bytes,
    ) -> Result<Response<Incoming>, Error> {
        for attempt in 0..2 {
            let mut req = Request::builder().method(method.clone()).uri(url);
            for (k, v) in headers {
                req = req.header(k, v);
            }
            if let Some(h) = self.auth_header(scope) {
                req = req.header(header::AUTHORIZATION, h);
            }
            if !body.is_empty() || method == Method::PUT || method == Method::PATCH {
                req = req.header(header::CONTENT_LENGTH, body.len());
            }
            let req = req
                .body(Full::new(body.clone()))
                .map_err(|e| self.transport(step, url, e))?;
            let resp = tokio::time::timeout(self.options.timeout, self.http.request(req))
                .await
                .map_err(|_| {
                    self.transport(
                        step,
                        url,
                        format!("no response in {:?}", self.options.timeout),
                    )
                })?
                .map_err(|e| self.transport(step, url, format!("{e:?}")))?;
            let status = resp.status();
            if status == StatusCode::UNAUTHORIZED && attempt == 0 {
                let challenge = resp
                    .headers()
                    .get_all(header::WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(parse_challenge);
                match challenge {
                    Some(Challenge::Basic) if self.credentials.is_some() => {
                        self.auth.lock().expect("auth").basic = true;
                    }
                    Some(Challenge::Bearer { realm, service, .. }) => {
                        let token = self.token(&realm, service.as_deref(), scope).await?;
                        self.auth
                            .lock()
                            .expect("auth")
                            .tokens
                            .insert(scope.into(), token);
                    }
                    _ => return Err(self.unauthorized(step, status)),
                }
                continue;
            }
            if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
                return Err(self.unauthorized(step, status));
            }
            return Ok(resp);
        }
        unreachable!("the loop returns")
    }

    /// A Bearer token for `scope` from `realm` (the distribution token flow: `GET
    /// realm?service=…&scope=…`, with Basic credentials if there are any).
    async fn token(
        &self,
        realm: &str,
        service: Option<&str>,
        scope: &str,
    ) -> Result<String, Error> {
        let bad = |why: String| Error::Token {
            realm: realm.into(),
            scope: scope.into(),
            why,
        };
        if !realm.starts_with("http://") {
            return Err(bad(
                "only a plain-HTTP token endpoint is supported so far (no https)".into(),
            ));
        }
        // One `scope` parameter per scope (a mount asks for two repositories).
        let scopes: Vec<String> = scope
            .split(' ')
            .map(|s| format!("scope={}", encode(s)))
            .collect();
        let mut url = format!(
            "{realm}{}{}",
            if realm.contains('?') { '&' } else { '?' },
            scopes.join("&")
        );
        if let Some(s) = service {
            url.push_str(&format!("&service={}", encode(s)));
        }
        let mut req = Request::get(&url);
        if let Some(c) = &self.credentials {
            req = req.header(header::AUTHORIZATION, c.basic_header());
        }
        let req = req
            .body(Full::new(Bytes::new()))
            .map_err(|e| bad(e.to_string()))?;
        let resp = tokio::time::timeout(self.options.timeout, self.http.request(req))
            .await
            .map_err(|_| bad("no response".into()))?
            .map_err(|e| bad(format!("{e:?}")))?;
        let status = resp.status();
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.unauthorized(&format!("token for {scope}"), status));
        }
        if !status.is_success() {
            return Err(bad(format!("the endpoint answered {status}")));
        }
        let body = self.read_limited(resp, 1 << 20, "token", &url).await?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let t: Token = serde_json::from_slice(&body).map_err(|e| bad(format!("{e}")))?;
        t.token
            .or(t.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| bad("the answer holds no token".into()))
    }

    /// Reads a whole body of at most `limit` bytes.
    async fn read_limited(
        &self,
        resp: Response<Incoming>,
        limit: u64,
        step: &str,
        url: &str,
    ) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        let mut body = resp.into_body();
        while let Some(frame) = tokio::time::timeout(self.options.timeout, body.frame())
            .await
            .map_err(|_| self.transport(step, url, "the body stalled"))?
        {
            let frame = frame.map_err(|e| self.transport(step, url, format!("{e:?}")))?;
            if let Ok(d) = frame.into_data() {
                if out.len() as u64 + d.len() as u64 > limit {
                    return Err(Error::OverLimit {
                        what: format!("{step}: the body"),
                        limit,
                        setting: "max_manifest_bytes",
                    });
                }
                out.extend_from_slice(&d);
            }
        }
        Ok(out)
    }

    fn blob_url(&self, repository: &str, digest: &Digest) -> String {
        format!("{}/v2/{repository}/blobs/{digest}", self.base)
    }

    /// The blob's size if the repository has it (`HEAD`).
    pub async fn blob_exists(
        &self,
        repository: &str,
        digest: &Digest,
    ) -> Result<Option<u64>, Error> {
        self.head_blob(repository, digest, Access::Pull).await
    }

    /// [`Client::blob_exists`], authorized for `access` (a push asks for its own scope from
    /// the first request on: one token serves the whole push).
    pub(crate) async fn head_blob(
        &self,
        repository: &str,
        digest: &Digest,
        access: Access,
    ) -> Result<Option<u64>, Error> {
        let url = self.blob_url(repository, digest);
        let step = format!("check blob {digest}");
        let resp = self
            .send(
                &step,
                &scope(repository, access),
                Method::HEAD,
                &url,
                &[],
                Bytes::new(),
            )
            .await?;
        match resp.status() {
            StatusCode::OK => Ok(Some(
                resp.headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            )),
            StatusCode::NOT_FOUND => Ok(None),
            s => Err(Error::HeadBlob {
                digest: digest.clone(),
                status: s.as_u16(),
            }),
        }
    }

    /// An upload URL from a response's `Location` (relative or absolute).
    fn location(&self, resp: &Response<Incoming>) -> Option<String> {
        let loc = resp.headers().get(header::LOCATION)?.to_str().ok()?;
        Some(if loc.starts_with('/') {
            format!("{}{loc}", self.base)
        } else {
            loc.to_string()
        })
    }

    fn push_error(digest: &Digest, step: &'static str, status: StatusCode, body: String) -> Error {
        Error::PushBlob {
            digest: digest.clone(),
            step,
            status: status.as_u16(),
            body,
        }
    }

    /// Mounts `digest` from repository `from` of the same registry; false when the registry
    /// would not (it then opened an upload, which is left to expire).
    pub async fn mount_blob(
        &self,
        repository: &str,
        digest: &Digest,
        from: &str,
    ) -> Result<bool, Error> {
        let url = format!(
            "{}/v2/{repository}/blobs/uploads/?mount={}&from={}",
            self.base,
            encode(digest.as_str()),
            encode(from)
        );
        let resp = self
            .send(
                &format!("mount blob {digest} from {from}"),
                &format!("{} repository:{from}:pull", scope(repository, Access::Push)),
                Method::POST,
                &url,
                &[],
                Bytes::new(),
            )
            .await?;
        let mounted = resp.status() == StatusCode::CREATED;
        if mounted {
            self.sent.lock().expect("sent").mounted.push(digest.clone());
        }
        Ok(mounted)
    }

    /// Uploads `bytes` as blob `digest` (one `PUT`).
    pub async fn push_blob_bytes(
        &self,
        repository: &str,
        digest: &Digest,
        bytes: Bytes,
    ) -> Result<(), Error> {
        let url = self.start_upload(repository, digest).await?;
        self.finish_upload(repository, digest, &url, bytes).await
    }

    /// Uploads the file at `path` as blob `digest` of `size` bytes: one `PUT` up to the chunk
    /// size, `PATCH` chunks then a `PUT` above it. The file must hold exactly those bytes (the
    /// registry checks the digest).
    pub async fn push_blob_file(
        &self,
        repository: &str,
        digest: &Digest,
        size: u64,
        path: &Path,
    ) -> Result<(), Error> {
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(io(format!("open {}", path.display())))?;
        let chunk = match self.options.max_bytes_per_s {
            0 => self.options.chunk_size,
            rate => self.options.chunk_size.min((rate / 4).max(64 << 10)),
        }
        .max(1);
        let mut url = self.start_upload(repository, digest).await?;
        if size <= chunk {
            let mut buf = Vec::with_capacity(size as usize);
            (&mut file)
                .take(size + 1)
                .read_to_end(&mut buf)
                .await
                .map_err(io(format!("read {}", path.display())))?;
            self.finish_upload(repository, digest, &url, Bytes::from(buf))
                .await?;
            self.pace(size).await;
            return Ok(());
        }
        let mut offset = 0u64;
        while offset < size {
            let n = chunk.min(size - offset);
            let mut buf = vec![0u8; n as usize];
            file.read_exact(&mut buf)
                .await
                .map_err(io(format!("read {}", path.display())))?;
            let resp = self
                .send(
                    &format!("push blob {digest}"),
                    &scope(repository, Access::Push),
                    Method::PATCH,
                    &url,
                    &[
                        (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                        (
                            header::CONTENT_RANGE,
                            format!("{offset}-{}", offset + n - 1),
                        ),
                    ],
                    Bytes::from(buf),
                )
                .await?;
            if resp.status() != StatusCode::ACCEPTED {
                let s = resp.status();
                return Err(Self::push_error(
                    digest,
                    "upload chunk",
                    s,
                    error_body(resp).await,
                ));
            }
            url = self.location(&resp).ok_or_else(|| {
                Self::push_error(
                    digest,
                    "upload chunk",
                    StatusCode::ACCEPTED,
                    "no Location".into(),
                )
            })?;
            offset += n;
            self.sent.lock().expect("sent").bytes += n;
            self.pace(n).await;
        }
        self.finish_upload(repository, digest, &url, Bytes::new())
            .await
    }

    /// Counts `n` bytes uploaded and waits until they are due under
    /// [`ClientOptions::max_bytes_per_s`].
    async fn pace(&self, n: u64) {
        let rate = self.options.max_bytes_per_s;
        if rate == 0 {
            return;
        }
        let wait = {
            let mut paced = self.paced.lock().expect("paced");
            let first = *paced.0.get_or_insert_with(Instant::now);
            paced.1 += n;
            Duration::from_secs_f64(paced.1 as f64 / rate as f64).saturating_sub(first.elapsed())
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    async fn start_upload(&self, repository: &str, digest: &Digest) -> Result<String, Error> {
        let url = format!("{}/v2/{repository}/blobs/uploads/", self.base);
        let resp = self
            .send(
                &format!("push blob {digest}"),
                &scope(repository, Access::Push),
                Method::POST,
                &url,
                &[],
                Bytes::new(),
            )
            .await?;
        if resp.status() != StatusCode::ACCEPTED {
            let s = resp.status();
            return Err(Self::push_error(
                digest,
                "start upload",
                s,
                error_body(resp).await,
            ));
        }
        self.location(&resp).ok_or_else(|| {
            Self::push_error(
                digest,
                "start upload",
                StatusCode::ACCEPTED,
                "no Location".into(),
            )
        })
    }

    async fn finish_upload(
        &self,
        repository: &str,
        digest: &Digest,
        url: &str,
        last: Bytes,
    ) -> Result<(), Error> {
        let url = format!(
            "{url}{}digest={}",
            if url.contains('?') { '&' } else { '?' },
            encode(digest.as_str())
        );
        let n = last.len() as u64;
        let resp = self
            .send(
                &format!("push blob {digest}"),
                &scope(repository, Access::Push),
                Method::PUT,
                &url,
                &[(header::CONTENT_TYPE, "application/octet-stream".to_string())],
                last,
            )
            .await?;
        if resp.status() != StatusCode::CREATED {
            let s = resp.status();
            return Err(Self::push_error(
                digest,
                "finish upload",
                s,
                error_body(resp).await,
            ));
        }
        let mut sent = self.sent.lock().expect("sent");
        sent.bytes += n;
        sent.uploaded.push(digest.clone());
        Ok(())
    }

    /// `GET`s blob `desc` into `out`, verified: a body longer than the descriptor's size is
    /// refused before it is read past that size (and one announced longer, before it is read),
    /// and the bytes must hash to its digest. `out` holds unverified bytes until this returns
    /// `Ok`; the caller discards it on an error.
    pub async fn pull_blob<W: tokio::io::AsyncWrite + Unpin>(
        &self,
        repository: &str,
        desc: &Descriptor,
        out: &mut W,
    ) -> Result<(), Error> {
        let digest = &desc.digest;
        let step = format!("pull blob {digest}");
        let mut url = self.blob_url(repository, digest);
        let mut resp = None;
        // Registries may redirect a blob to its storage; followed a few times, in plain HTTP,
        // and without the registry's credentials (the storage URL carries its own grant).
        for hop in 0..4 {
            let r = if hop == 0 {
                self.send(
                    &step,
                    &scope(repository, Access::Pull),
                    Method::GET,
                    &url,
                    &[],
                    Bytes::new(),
                )
                .await?
            } else {
                let req = Request::get(&url)
                    .body(Full::new(Bytes::new()))
                    .map_err(|e| self.transport(&step, &url, e))?;
                tokio::time::timeout(self.options.timeout, self.http.request(req))
                    .await
                    .map_err(|_| self.transport(&step, &url, "no response"))?
                    .map_err(|e| self.transport(&step, &url, format!("{e:?}")))?
            };
            if r.status().is_redirection()
                && let Some(loc) = self.location(&r)
            {
                if !loc.starts_with("http://") {
                    return Err(self.transport(&step, &loc, "a redirect out of plain HTTP"));
                }
                url = loc;
                continue;
            }
            resp = Some(r);
            break;
        }
        let resp = resp.ok_or_else(|| self.transport(&step, &url, "too many redirects"))?;
        if resp.status() != StatusCode::OK {
            return Err(Error::PullBlob {
                digest: digest.clone(),
                status: resp.status().as_u16(),
            });
        }
        let announced = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = announced
            && n != desc.size
        {
            return Err(Error::BlobSize {
                digest: digest.clone(),
                expected: desc.size,
                got: n,
            });
        }
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        let mut body = resp.into_body();
        while let Some(frame) = tokio::time::timeout(self.options.timeout, body.frame())
            .await
            .map_err(|_| self.transport(&step, &url, "the body stalled"))?
        {
            let frame = frame.map_err(|e| self.transport(&step, &url, format!("{e:?}")))?;
            let Ok(d) = frame.into_data() else { continue };
            got += d.len() as u64;
            if got > desc.size {
                return Err(Error::BlobSize {
                    digest: digest.clone(),
                    expected: desc.size,
                    got,
                });
            }
            hasher.update(&d);
            out.write_all(&d)
                .await
                .map_err(io(format!("write {step}")))?;
        }
        if got != desc.size {
            return Err(Error::BlobSize {
                digest: digest.clone(),
                expected: desc.size,
                got,
            });
        }
        let actual = Digest::from_hasher(hasher);
        if &actual != digest {
            return Err(Error::BlobDigest {
                digest: digest.clone(),
                actual,
            });
        }
        out.flush().await.map_err(io(format!("write {step}")))?;
        Ok(())
    }

    /// `GET`s blob `desc` into memory, verified as [`Client::pull_blob`] does.
    pub async fn pull_blob_bytes(
        &self,
        repository: &str,
        desc: &Descriptor,
    ) -> Result<Vec<u8>, Error> {
        let mut out = Vec::new();
        self.pull_blob(repository, desc, &mut out).await?;
        Ok(out)
    }

    /// `PUT`s manifest `bytes` of `media_type` as `reference` (a tag or its digest); returns
    /// its digest.
    pub async fn push_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        bytes: Vec<u8>,
    ) -> Result<Digest, Error> {
        let digest = Digest::of(&bytes);
        let url = format!("{}/v2/{repository}/manifests/{reference}", self.base);
        let resp = self
            .send(
                &format!("push manifest {repository}:{reference}"),
                &scope(repository, Access::Push),
                Method::PUT,
                &url,
                &[(header::CONTENT_TYPE, media_type.to_string())],
                Bytes::from(bytes),
            )
            .await?;
        if resp.status() != StatusCode::CREATED {
            let s = resp.status();
            return Err(Error::PushManifest {
                reference: format!("{}/{repository}:{reference}", self.registry),
                status: s.as_u16(),
                body: error_body(resp).await,
            });
        }
        Ok(digest)
    }

    /// `GET`s manifest `reference` (a tag or a digest) accepting `media_type`; at most `limit`
    /// bytes are read, and a manifest asked for by digest must hash to it. Returns its bytes
    /// and digest.
    pub async fn pull_manifest(
        &self,
        repository: &str,
        reference: &str,
        media_type: &str,
        limit: u64,
    ) -> Result<(Vec<u8>, Digest), Error> {
        let url = format!("{}/v2/{repository}/manifests/{reference}", self.base);
        let step = format!("pull manifest {repository}:{reference}");
        let resp = self
            .send(
                &step,
                &scope(repository, Access::Pull),
                Method::GET,
                &url,
                &[(header::ACCEPT, media_type.to_string())],
                Bytes::new(),
            )
            .await?;
        if resp.status() != StatusCode::OK {
            return Err(Error::PullManifest {
                reference: format!("{}/{repository}:{reference}", self.registry),
                status: resp.status().as_u16(),
            });
        }
        if let Some(n) = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && n > limit
        {
            return Err(Error::OverLimit {
                what: format!("{step}: its announced size, {n} bytes,"),
                limit,
                setting: "max_manifest_bytes",
            });
        }
        let bytes = self.read_limited(resp, limit, &step, &url).await?;
        let digest = Digest::of(&bytes);
        if let Ok(pinned) = Digest::parse(reference)
            && pinned != digest
        {
            return Err(Error::BadManifest {
                reference: format!("{}/{repository}@{reference}", self.registry),
                why: format!("its content hashes to {digest}: refused"),
            });
        }
        Ok((bytes, digest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_registries_are_spoken_to_in_plain_http_unless_allowed() {
        let options = || ClientOptions {
            credentials: Some(Credentials {
                username: "u".into(),
                password: "p".into(),
            }),
            ..Default::default()
        };
        for ok in [
            "127.0.0.1:5000",
            "localhost:5000",
            "[::1]:5000",
            "127.3.0.1",
        ] {
            Client::new(ok, options()).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let e = Client::new("registry.example.com", options())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("https is not implemented"), "{e}");
        let any = ClientOptions {
            plain_http: PlainHttp::Any,
            ..options()
        };
        assert!(Client::new("registry.internal:5000", any).is_ok());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            encode("repository:a/b:pull,push"),
            "repository%3Aa%2Fb%3Apull%2Cpush"
        );
        assert_eq!(encode("sha256:ab-_.~"), "sha256%3Aab-_.~");
    }
}
