//! A read-only OCI distribution registry on 127.0.0.1 that serves the manifests and blobs of one
//! containerd's content store, for what must pull by digest where there is no registry: CRI's
//! restore from a checkpoint archive pulls the checkpoint's base image (`NAME@sha256:…`) before it
//! creates the container. containerd talks plain HTTP to a loopback registry.
//!
//! It answers `GET /v2/`, and `GET`/`HEAD` of `/v2/NAME/manifests/sha256:…` and
//! `/v2/NAME/blobs/sha256:…` (any NAME: the content store is one namespace); tags are not
//! served. Every request it answered is recorded, so a test can tell that the pull came here.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A running registry; stopped on drop.
pub struct Registry {
    /// `127.0.0.1:PORT`: the host part of image names it serves.
    pub host: String,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Registry {
    /// Serves the blobs under `content` (containerd's `io.containerd.content.v1.content`).
    pub fn serve(content: &Path) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the registry");
        let host = listener.local_addr().expect("registry address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let blobs = content.join("blobs");
        let (stop2, requests2) = (stop.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(conn) = conn {
                    let (blobs, requests) = (blobs.clone(), requests2.clone());
                    std::thread::spawn(move || serve_connection(conn, &blobs, &requests));
                }
            }
        });
        Self {
            host,
            stop,
            requests,
            thread: Some(thread),
        }
    }

    /// The requests answered so far, as `METHOD PATH STATUS`.
    pub fn requests(&self) -> Vec<String> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(&self.host);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers the requests on one connection (HTTP/1.1 keep-alive) until it closes.
fn serve_connection(conn: TcpStream, blobs: &Path, requests: &Mutex<Vec<String>>) {
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut words = line.split_whitespace();
        let (Some(method), Some(path)) = (words.next(), words.next()) else {
            // Not HTTP (a TLS hello, say): a plain answer, which clients read as "not TLS".
            let _ = out.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            return;
        };
        let (method, path) = (method.to_string(), path.to_string());
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header.trim().is_empty() {
                break;
            }
        }
        let (status, headers, body) = answer(&path, blobs);
        requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{method} {path} {status}"));
        let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("Docker-Distribution-API-Version: registry/2.0\r\n\r\n");
        let sent = out.write_all(head.as_bytes()).and_then(|()| {
            if method == "HEAD" {
                Ok(())
            } else {
                out.write_all(&body)
            }
        });
        if sent.is_err() {
            return;
        }
    }
}

/// Status line, extra headers and body for `path`.
fn answer(path: &str, blobs: &Path) -> (&'static str, Vec<(&'static str, String)>, Vec<u8>) {
    let not_found = ("404 Not Found", Vec::new(), Vec::new());
    if path == "/v2/" {
        return (
            "200 OK",
            vec![("Content-Type", "application/json".into())],
            b"{}".to_vec(),
        );
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return not_found;
    };
    let (kind, digest) = match (rest.rsplit_once("/manifests/"), rest.rsplit_once("/blobs/")) {
        (Some((_, d)), _) => ("manifest", d),
        (_, Some((_, d))) => ("blob", d),
        _ => return not_found,
    };
    let Some(hex) = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    else {
        return not_found;
    };
    let file: PathBuf = blobs.join("sha256").join(hex);
    let Ok(body) = std::fs::read(&file) else {
        return not_found;
    };
    let media_type = if kind == "manifest" {
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["mediaType"].as_str().map(str::to_string))
            .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".into())
    } else {
        "application/octet-stream".into()
    };
    (
        "200 OK",
        vec![
            ("Content-Type", media_type),
            ("Docker-Content-Digest", digest.to_string()),
        ],
        body,
    )
}
