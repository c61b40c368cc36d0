//! Client of a shim's control socket: HTTP/1.1 (hyper) + JSON over a Unix socket, one request
//! per connection.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{CONNECTION, CONTENT_TYPE, HOST};
use hyper_util::rt::TokioIo;

use crate::containerd::Containerd;
use crate::error::{Error, Result};

pub struct Control {
    container: String,
    socket: PathBuf,
}

impl Control {
    pub fn new(namespace: &str, container: &str) -> Self {
        Self {
            container: container.to_string(),
            socket: belayer_api::socket_path(namespace, container),
        }
    }

    /// Whether a shim serves this container (a socket left by a dead shim refuses connections).
    pub fn exists(&self) -> bool {
        UnixStream::connect(&self.socket).is_ok()
    }

    /// This control socket, or a clear error saying why there is none.
    pub fn require(self, containerd: &Containerd) -> Result<Self> {
        if self.exists() {
            return Ok(self);
        }
        containerd.container(&self.container)?;
        Err(Error::NoTask(self.container))
    }

    /// [`Control::request`] from synchronous code (the CLI's verbs).
    pub fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::ControlIo)?
            .block_on(self.request(method, path, body))
    }

    /// `METHOD /v1/containers/{container}/{path}`, returning the decoded answer or the API's error
    /// (with its status). No time limit: a checkpoint takes its time.
    pub async fn request<T: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T> {
        let body = body
            .map(|b| serde_json::to_vec(b).unwrap_or_default())
            .unwrap_or_default();
        let stream = tokio::net::UnixStream::connect(&self.socket)
            .await
            .map_err(|source| Error::Unreachable {
                container: self.container.clone(),
                socket: self.socket.clone(),
                source,
            })?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(Error::Http)?;
        // Drives the connection until the answer is read; it ends when the shim closes it.
        tokio::spawn(connection);
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("/v1/containers/{}/{path}", self.container))
            .header(HOST, "belayer")
            .header(CONTENT_TYPE, "application/json")
            .header(CONNECTION, "close")
            .body(Full::new(Bytes::from(body)))
            .map_err(Error::Request)?;
        let answer = sender.send_request(req).await.map_err(Error::Http)?;
        let status = answer.status().as_u16();
        let payload = answer
            .into_body()
            .collect()
            .await
            .map_err(Error::Http)?
            .to_bytes();
        if status != 200 {
            let err: belayer_api::ErrorBody =
                serde_json::from_slice(&payload).unwrap_or(belayer_api::ErrorBody {
                    error: format!("HTTP {status}"),
                });
            return Err(Error::Api {
                status,
                message: err.error,
            });
        }
        serde_json::from_slice(&payload).map_err(Error::Unreadable)
    }
}
