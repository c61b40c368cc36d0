//! For `belayer gateway`'s test and benchmark: a stand-in OpenAI server (JSON answers, and SSE
//! streams of chunks sent with delays), a minimal keep-alive HTTP/1.1 client, and a running
//! `belayer gateway` process.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::Containerd;

/// An HTTP message as the stand-in server received it, or as the client got an answer.
#[derive(Clone, Debug, Default)]
pub struct Message {
    /// `METHOD PATH` of a request; the status code of an answer.
    pub method: String,
    pub path: String,
    pub status: u16,
    /// Names lowercased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Message {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_default()
    }
}

/// The stand-in server: `POST` with `"stream": true` answers an SSE stream of `chunks` events
/// `delay` apart; `/status/N` answers status N; anything else a JSON completion after `delay`.
/// Every answer carries `x-upstream: stand-in`.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Requests received, in order.
    pub seen: Arc<Mutex<Vec<Message>>>,
    /// When each stream's last byte was written.
    pub streams_done: Arc<Mutex<Vec<Instant>>>,
}

impl Upstream {
    pub fn start(chunks: u32, delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the stand-in upstream");
        let addr = listener.local_addr().expect("upstream address");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let streams_done = Arc::new(Mutex::new(Vec::new()));
        let (s, d) = (seen.clone(), streams_done.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (s, d) = (s.clone(), d.clone());
                std::thread::spawn(move || serve(conn, &s, &d, chunks, delay));
            }
        });
        Self {
            addr,
            seen,
            streams_done,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn last_seen(&self) -> Message {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("no request reached the upstream")
    }
}

fn serve(
    conn: TcpStream,
    seen: &Mutex<Vec<Message>>,
    done: &Mutex<Vec<Instant>>,
    chunks: u32,
    delay: Duration,
) {
    let _ = conn.set_nodelay(true);
    let mut w = conn.try_clone().expect("clone connection");
    let mut r = BufReader::new(conn);
    while let Some(req) = read_message(&mut r, true, &mut |_| {}) {
        seen.lock().unwrap().push(req.clone());
        let json = req.json();
        let ok = if req.method == "POST" && json["stream"] == true {
            stream(&mut w, chunks, delay).inspect(|_| done.lock().unwrap().push(Instant::now()))
        } else {
            let status = req
                .path
                .strip_prefix("/status/")
                .and_then(|s| s.split('?').next()?.parse().ok())
                .unwrap_or(200u16);
            std::thread::sleep(delay);
            let body = serde_json::json!({
                "id": "chatcmpl-standin",
                "object": "chat.completion",
                "path": req.path,
                "model": json["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
            })
            .to_string();
            write!(
                w,
                "HTTP/1.1 {status} Whatever\r\ncontent-type: application/json\r\nx-upstream: stand-in\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        if ok.is_err() {
            return;
        }
    }
}

fn stream(w: &mut TcpStream, chunks: u32, delay: Duration) -> std::io::Result<()> {
    w.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-upstream: stand-in\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    for i in 0..=chunks {
        let event = if i == chunks {
            "data: [DONE]\n\n".to_string()
        } else {
            format!(
                "data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"tok{i}\"}}}}]}}\n\n"
            )
        };
        write!(w, "{:x}\r\n{event}\r\n", event.len())?;
        w.flush()?;
        if i < chunks {
            std::thread::sleep(delay);
        }
    }
    w.write_all(b"0\r\n\r\n")
}

/// Reads one request (`request`) or answer from `r`, calling `on_chunk` with each body chunk as
/// it arrives; `None` at a clean end of the connection or a malformed message.
pub fn read_message(
    r: &mut impl BufRead,
    request: bool,
    on_chunk: &mut dyn FnMut(&[u8]),
) -> Option<Message> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut first = line.split_whitespace();
    let mut m = Message::default();
    if request {
        m.method = first.next()?.to_string();
        m.path = first.next()?.to_string();
    } else {
        m.status = first.nth(1)?.parse().ok()?;
    }
    loop {
        line.clear();
        r.read_line(&mut line).ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':')?;
        m.headers
            .push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    if m.header("transfer-encoding") == Some("chunked") {
        loop {
            line.clear();
            r.read_line(&mut line).ok()?;
            let n = usize::from_str_radix(line.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            chunk.truncate(n);
            if n == 0 {
                return Some(m);
            }
            on_chunk(&chunk);
            m.body.extend_from_slice(&chunk);
        }
    }
    let n: usize = m
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    m.body = vec![0; n];
    r.read_exact(&mut m.body).ok()?;
    if n > 0 {
        on_chunk(&m.body);
    }
    Some(m)
}

/// A keep-alive HTTP/1.1 client of one server.
pub struct Client {
    addr: SocketAddr,
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Self {
        Self { addr, conn: None }
    }

    /// Sends a request and reads the answer, calling `on_chunk` as body chunks arrive.
    pub fn send_streaming(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        on_chunk: &mut dyn FnMut(&[u8]),
    ) -> Result<Message, String> {
        if self.conn.is_none() {
            let s = TcpStream::connect(self.addr).map_err(|e| format!("{}: {e}", self.addr))?;
            let _ = s.set_nodelay(true);
            let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
            let r = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
            self.conn = Some((s, r));
        }
        let (w, r) = self.conn.as_mut().expect("connected");
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        let mut msg = head.into_bytes();
        msg.extend_from_slice(body);
        let answer = w
            .write_all(&msg)
            .map_err(|e| e.to_string())
            .and_then(|_| read_message(r, false, on_chunk).ok_or("no answer".to_string()));
        let close = answer
            .as_ref()
            .map_or(true, |m| m.header("connection") == Some("close"));
        if close {
            self.conn = None;
        }
        answer
    }

    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Message, String> {
        self.send_streaming(method, path, headers, body, &mut |_| {})
    }
}

/// A running `belayer gateway` of containerd `c`'s namespace; killed when dropped.
pub struct Gateway {
    pub addr: SocketAddr,
    child: Child,
    stderr: std::path::PathBuf,
}

impl Gateway {
    /// Starts `belayer gateway --listen 127.0.0.1:0 --upstream URL ARGS…` and waits for its
    /// address.
    #[track_caller]
    pub fn start(c: &Containerd, upstream: &str, args: &[&str]) -> Self {
        let stderr = c
            .dir
            .join(format!("gateway-{}.log", upstream.replace(['/', ':'], "_")));
        let mut child = c
            .belayer_cmd(&["gateway", "--listen", "127.0.0.1:0", "--upstream", upstream])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("gateway log"))
            .spawn()
            .expect("spawn belayer gateway");
        let mut first = String::new();
        let _ = BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first);
        let addr = first
            .strip_prefix("listening on http://")
            .and_then(|r| r.split(',').next())
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "belayer gateway did not start: {first:?}, stderr: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        };
        Self {
            addr,
            child,
            stderr,
        }
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
