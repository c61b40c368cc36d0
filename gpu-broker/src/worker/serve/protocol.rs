//! The serving protocol — one JSON object per line over a Unix stream socket — and its client.
//!
//! A client sends a [`GenRequest`] and reads one [`GenReply`] for it. Request ids are chosen by
//! the client and name the request in the broker's token log, so a request sent again with the
//! same id (after the primary died) is continued or answered from the log, never generated twice.
//! [`GenClient::generate`] does that: on a lost or refused connection it reconnects to the same
//! path (which the promoted shadow takes over) and sends the request again.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// One generation request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenRequest {
    /// Client-chosen id, unique per broker (the token log's key).
    pub id: u64,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Tokens to generate.
    pub max_new: u32,
    /// Sampler seed.
    #[serde(default)]
    pub seed: u64,
    /// 0 = greedy.
    #[serde(default)]
    pub temperature: f32,
    /// 0 = no top-k cut.
    #[serde(default)]
    pub top_k: u32,
}

/// The answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenReply {
    /// The request's id.
    pub id: u64,
    /// Generated tokens (empty on error).
    #[serde(default)]
    pub tokens: Vec<u32>,
    /// Why the request was refused.
    #[serde(default)]
    pub error: Option<String>,
    /// The worker that answered.
    pub worker_pid: u32,
    /// Its lease epoch.
    pub epoch: u64,
    /// Answered from the token log (the request had finished before this connection asked).
    #[serde(default)]
    pub from_log: bool,
}

/// A client-side failure.
#[derive(Debug, Error)]
pub enum ServeError {
    /// No answer in time (no worker serving the socket, or generation too slow).
    #[error(
        "no reply to request {id} from {path} within {secs:.1} s ({attempts} attempts; last: {last})"
    )]
    Timeout {
        /// Request id.
        id: u64,
        /// Socket path.
        path: String,
        /// Time allowed.
        secs: f64,
        /// Connection attempts.
        attempts: u32,
        /// The last transient failure.
        #[source]
        last: AttemptError,
    },
    /// The worker refused the request.
    #[error("worker refused request {id}: {message}")]
    Refused {
        /// Request id.
        id: u64,
        /// The worker's explanation.
        message: String,
    },
}

/// Why one connection to the serving socket got no reply (transient: the client tries again).
#[derive(Debug, Error)]
pub enum AttemptError {
    /// The socket does not accept (no worker serving it, or a takeover under way).
    #[error("connect: {0}")]
    Connect(#[source] std::io::Error),
    /// The read timeout cannot be set on the connection.
    #[error("set timeout: {0}")]
    SetTimeout(#[source] std::io::Error),
    /// The request cannot be sent.
    #[error("send: {0}")]
    Send(#[source] std::io::Error),
    /// The reply cannot be read (or none came before the deadline).
    #[error("receive: {0}")]
    Receive(#[source] std::io::Error),
    /// The connection closed before a whole reply line.
    #[error("connection closed before the reply (worker died?)")]
    Closed,
    /// The reply line is not a [`GenReply`].
    #[error("malformed reply: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// What one [`GenClient::generate`] call got.
#[derive(Debug, Clone)]
pub struct Generated {
    /// The reply.
    pub reply: GenReply,
    /// Connections lost or refused before the reply came (a worker died meanwhile).
    pub reconnects: u32,
    /// Wall time of the call.
    pub seconds: f64,
}

/// A client of one serving socket.
#[derive(Debug, Clone)]
pub struct GenClient {
    path: PathBuf,
    timeout: Duration,
}

impl GenClient {
    /// A client of the worker serving `path`; each request may take up to `timeout`.
    pub fn new(path: &Path, timeout: Duration) -> Self {
        Self {
            path: path.to_path_buf(),
            timeout,
        }
    }

    /// Sends `req` and waits for its reply, reconnecting and resending (same id) whenever the
    /// connection is refused or lost.
    pub fn generate(&self, req: &GenRequest) -> Result<Generated, ServeError> {
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut line = serde_json::to_string(req).unwrap_or_default();
        line.push('\n');
        let mut reconnects = 0;
        loop {
            let last = match self.once(&line, deadline) {
                Ok(reply) if reply.error.is_some() => {
                    return Err(ServeError::Refused {
                        id: req.id,
                        message: reply.error.unwrap_or_default(),
                    });
                }
                Ok(reply) => {
                    return Ok(Generated {
                        reply,
                        reconnects,
                        seconds: start.elapsed().as_secs_f64(),
                    });
                }
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(ServeError::Timeout {
                    id: req.id,
                    path: self.path.display().to_string(),
                    secs: self.timeout.as_secs_f64(),
                    attempts: reconnects + 1,
                    last,
                });
            }
            reconnects += 1;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One connection: send, read one line. Any failure is transient (described for the log).
    fn once(&self, line: &str, deadline: Instant) -> Result<GenReply, AttemptError> {
        let mut s = UnixStream::connect(&self.path).map_err(AttemptError::Connect)?;
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .map_err(AttemptError::SetTimeout)?;
        s.write_all(line.as_bytes()).map_err(AttemptError::Send)?;
        let mut reply = String::new();
        let n = BufReader::new(&s)
            .read_line(&mut reply)
            .map_err(AttemptError::Receive)?;
        if n == 0 || !reply.ends_with('\n') {
            return Err(AttemptError::Closed);
        }
        serde_json::from_str(&reply).map_err(AttemptError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_defaults_and_round_trip() {
        let r: GenRequest = serde_json::from_str(r#"{"id":7,"prompt":[1,2],"max_new":3}"#).unwrap();
        assert_eq!((r.seed, r.temperature, r.top_k), (0, 0.0, 0));
        let back: GenRequest = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn no_server_times_out_naming_the_last_failure() {
        let c = GenClient::new(
            Path::new("/nonexistent/belayer.sock"),
            Duration::from_millis(100),
        );
        let req = GenRequest {
            id: 1,
            prompt: vec![1],
            max_new: 1,
            seed: 0,
            temperature: 0.0,
            top_k: 0,
        };
        let e = c.generate(&req).unwrap_err().to_string();
        assert!(e.contains("connect") && e.contains("request 1"), "{e}");
    }
}
