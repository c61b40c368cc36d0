//! `belayer gateway` in front of a stand-in OpenAI server, with real Belayer shims behind it:
//! requests and answers pass through unchanged (streams chunk by chunk), `X-Belayer-*` headers
//! stay behind, and each mapped generation reaches its container's shim as `llm-start` /
//! `llm-end` (seen in `belayer status`), unmapped ones as nothing.
//!
//! Counts are exact because the test waits for one generation's hints to reach the shim before it
//! starts the next: the gateway replaces a hint still waiting behind one on its way (only the
//! newest state matters to the scheduler), so back-to-back generations on a loaded machine would
//! coalesce. The stand-in takes 200 ms an answer, longer than one delivery.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use belayer_integration::bench::openai::{Client, Gateway, Message, Upstream};
use belayer_integration::{Containerd, Flavor};
use common::*;

const CHAT: &str = "/v1/chat/completions";

fn hints(c: &Containerd, id: &str) -> serde_json::Value {
    let out = c.belayer(&["status", id]).ok();
    let status: serde_json::Value = serde_json::from_str(&out.stdout).expect("status JSON");
    status["hints"].clone()
}

/// Waits until `id`'s shim took `n` hints, the last an `llm-end`; fails on more.
#[track_caller]
fn expect_hints(c: &Containerd, id: &str, n: u64) -> serde_json::Value {
    let done = |h: &serde_json::Value| h["received"] == n && h["last"] == "llm-end";
    wait_until(Duration::from_secs(10), || done(&hints(c, id)));
    let h = hints(c, id);
    assert!(done(&h), "{id}: expected {n} hints ending in llm-end: {h}");
    h
}

/// The answer's headers but those each server sets on its own.
fn end_to_end_headers(m: &Message) -> Vec<(String, String)> {
    let mut h: Vec<_> = m
        .headers
        .iter()
        .filter(|(k, _)| !["date", "connection", "keep-alive"].contains(&k.as_str()))
        .cloned()
        .collect();
    h.sort();
    h
}

#[test]
fn gateway_passes_requests_through_and_hints_the_mapped_containers() {
    let c = Containerd::start(Flavor::V2);
    for id in ["gw-header", "gw-bearer", "gw-user"] {
        run_detached(&c, BELAYER, id, &["sleep", "infinity"]);
    }
    run_detached(&c, RUNC, "gw-runc", &["sleep", "infinity"]);
    let up = Upstream::start(5, Duration::from_millis(200));
    let gw = Gateway::start(
        &c,
        &up.url(),
        &["--map", "sk-bearer=gw-bearer", "--map", "agent-7=gw-user"],
    );
    let mut direct = Client::new(up.addr);
    let mut via = Client::new(gw.addr);

    // Unmapped requests first: a hint from one of them would arrive before the mapped ones'.
    let body = br#"{"model":"m","user":"agent-unknown","max_tokens":9}"#;
    let json = ("content-type", "application/json");
    for auth in ["Bearer sk-other", "Basic sk-bearer"] {
        let m = via.send("POST", CHAT, &[json, ("authorization", auth)], body);
        assert_eq!(m.expect("unmapped request").status, 200);
    }
    let m = via.send(
        "GET",
        "/v1/models",
        &[("x-belayer-container", "gw-header")],
        b"",
    );
    assert_eq!(m.expect("GET").status, 200, "GETs pass, without hints");

    // Header-mapped: the answer, status and headers are the upstream's, the request reaches it
    // unchanged but for X-Belayer-*.
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":7}"#;
    let headers = [
        json,
        ("x-belayer-container", "gw-header"),
        ("x-belayer-namespace", c.ns.as_str()),
        ("x-client", "kept"),
        ("authorization", "Bearer sk-whatever"),
    ];
    let want = direct.send("POST", CHAT, &headers[3..], body).unwrap();
    let got = via.send("POST", CHAT, &headers, body).unwrap();
    assert_eq!((got.status, &got.body), (want.status, &want.body));
    expect_hints(&c, "gw-header", 2);
    assert_eq!(end_to_end_headers(&got), end_to_end_headers(&want));
    let seen = up.last_seen();
    assert_eq!(seen.body, body, "request body changed on the way");
    assert!(
        seen.headers
            .iter()
            .all(|(k, _)| !k.starts_with("x-belayer-")),
        "X-Belayer-* reached the upstream: {:?}",
        seen.headers
    );
    assert_eq!(seen.header("x-client"), Some("kept"));
    assert_eq!(seen.header("authorization"), Some("Bearer sk-whatever"));
    let teapot = via.send("POST", "/status/418?q=1", &headers, body).unwrap();
    assert_eq!(teapot.status, 418);
    assert_eq!(up.last_seen().path, "/status/418?q=1");
    let h = expect_hints(&c, "gw-header", 4);
    assert_eq!(h["last_expected_tokens"], 7, "{h}");
    assert_eq!(h["llm_in_flight"], false, "{h}");

    // Streaming: chunks arrive as the upstream sends them, the container is mid-generation
    // meanwhile, and two concurrent streams make one llm-start/llm-end pair.
    let stream = br#"{"model":"m","stream":true,"max_completion_tokens":50}"#;
    let (mut firsts, mut during) = (Vec::new(), None);
    let mut second = None;
    let got = via
        .send_streaming("POST", CHAT, &headers, stream, &mut |chunk| {
            firsts.push((Instant::now(), chunk.len()));
            if firsts.len() == 1 {
                // The gateway sends hints off the request path: the llm-start can reach the
                // shim just after the first chunk reached us (CI saw it). Look again while the
                // stream is open, 2 s at most.
                let asked = Instant::now();
                let mut h = hints(&c, "gw-header");
                while h["llm_in_flight"] != true && asked.elapsed() < Duration::from_secs(2) {
                    std::thread::sleep(Duration::from_millis(10));
                    h = hints(&c, "gw-header");
                }
                during = Some(h);
                let (addr, headers) = (gw.addr, headers.map(|(k, v)| (k, v.to_string())));
                second = Some(std::thread::spawn(move || {
                    let h: Vec<(&str, &str)> =
                        headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    Client::new(addr).send("POST", CHAT, &h, stream)
                }));
            }
        })
        .unwrap();
    let second = second.expect("no chunk").join().unwrap().unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-type"), Some("text/event-stream"));
    assert_eq!(got.body, second.body);
    assert!(got.body.ends_with(b"data: [DONE]\n\n"));
    let upstream_done = *up.streams_done.lock().unwrap().first().expect("stream end");
    assert!(
        firsts.len() >= 5 && firsts[0].0 < upstream_done,
        "stream buffered: {} chunks, first {:?} before the upstream finished",
        firsts.len(),
        upstream_done.checked_duration_since(firsts[0].0)
    );
    let during = during.unwrap();
    assert_eq!(during["llm_in_flight"], true, "{during}");
    assert_eq!(during["last_expected_tokens"], 50, "{during}");
    expect_hints(&c, "gw-header", 6);

    // --map by bearer token, and by the body's `user`.
    let m = via.send(
        "POST",
        CHAT,
        &[json, ("authorization", "Bearer sk-bearer")],
        body,
    );
    assert_eq!(m.unwrap().status, 200);
    let user = br#"{"model":"m","user":"agent-7","max_tokens":3}"#;
    assert_eq!(
        via.send("POST", "/v1/completions", &[json], user)
            .unwrap()
            .status,
        200
    );
    expect_hints(&c, "gw-bearer", 2);
    assert_eq!(expect_hints(&c, "gw-user", 2)["last_expected_tokens"], 3);
    // None of the unmapped requests reached a shim.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(hints(&c, "gw-header")["received"], 6);
    assert_eq!(hints(&c, "gw-bearer")["received"], 2);
    assert_eq!(hints(&c, "gw-user")["received"], 2);

    // A container without a Belayer shim: the request goes through all the same.
    let headers = [json, ("x-belayer-container", "gw-runc")];
    let got = via.send("POST", CHAT, &headers, body).unwrap();
    assert_eq!((got.status, got.body), (want.status, want.body));
    assert!(
        wait_until(Duration::from_secs(5), || gw.log().contains("gw-runc")),
        "failed hints of gw-runc not logged: {}",
        gw.log()
    );

    // The upstream down: 502 with a JSON error naming it.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let gw_dead = Gateway::start(&c, &dead_url, &[]);
    let got = Client::new(gw_dead.addr)
        .send("POST", CHAT, &headers, body)
        .unwrap();
    assert_eq!(got.status, 502);
    assert_eq!(got.header("content-type"), Some("application/json"));
    let err = got.json();
    assert_eq!(err["error"]["code"], "upstream_unreachable", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(&dead_url)),
        "{err}"
    );

    for id in ["gw-header", "gw-bearer", "gw-user", "gw-runc"] {
        remove(&c, id);
    }
}

/// `belayer gateway` with no containerd behind it (what the attacks below test happens before any
/// shim is asked), killed and its scratch directory removed on drop.
struct BareGateway {
    addr: SocketAddr,
    child: Child,
    dir: PathBuf,
}

impl BareGateway {
    #[track_caller]
    fn start(namespace: &str, upstream: &str, args: &[&str]) -> Self {
        let dir = scratch("gw");
        let log = dir.join("gateway.log");
        let mut child = Command::new(belayer_integration::prereq::bin_dir().join("belayer"))
            .args([
                "--namespace",
                namespace,
                "gateway",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--upstream", upstream])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn belayer gateway");
        let mut first = String::new();
        let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut first);
        let addr = first
            .strip_prefix("listening on http://")
            .and_then(|r| r.split(',').next())
            .and_then(|a| a.parse().ok());
        let Some(addr) = addr else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "belayer gateway did not start: {first:?}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        };
        Self { addr, child, dir }
    }
}

impl Drop for BareGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory under $TMPDIR.
fn scratch(tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let d = std::env::temp_dir().join(format!("belayer-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Asserts a gateway error answer: its status and code.
#[track_caller]
fn expect_refused(m: Result<Message, String>, status: u16, code: &str) -> Message {
    let m = m.expect("an answer");
    let err = m.json();
    assert_eq!(
        (m.status, err["error"]["code"].as_str()),
        (status, Some(code)),
        "{err}"
    );
    m
}

/// A namespace header of `/tmp/...` or `../..` made the gateway join it into a control socket path
/// and send hints to whatever listened there: now such names are refused with 400 before any
/// socket is touched or anything is forwarded.
#[test]
fn gateway_refuses_header_names_that_are_paths() {
    const NS: &str = "belayer-gw-attack";
    // The control directory the `..` names climb out of (shims make it; this test has none).
    let ctl = Path::new("/run/belayer/ctl").join(NS);
    std::fs::create_dir_all(&ctl).unwrap();
    let outside = scratch("gw-outside");
    let _cleanup = Removed(vec![ctl.clone(), outside.clone()]);
    let bait = UnixListener::bind(outside.join("victim.sock")).unwrap();
    bait.set_nonblocking(true).unwrap();
    let up = Upstream::start(1, Duration::from_millis(10));
    let gw = BareGateway::start(NS, &up.url(), &[]);
    let mut via = Client::new(gw.addr);

    let abs = outside.display().to_string();
    let climb = format!("../../../..{abs}");
    let json = ("content-type", "application/json");
    let body = br#"{"model":"m","max_tokens":5}"#;
    for headers in [
        vec![
            ("x-belayer-namespace", abs.as_str()),
            ("x-belayer-container", "victim"),
        ],
        vec![
            ("x-belayer-namespace", climb.as_str()),
            ("x-belayer-container", "victim"),
        ],
        vec![
            ("x-belayer-namespace", ".."),
            ("x-belayer-container", "victim"),
        ],
        vec![("x-belayer-container", &format!("../../../..{abs}/victim"))],
    ] {
        let mut h = headers.clone();
        h.push(json);
        let m = expect_refused(
            via.send("POST", CHAT, &h, body),
            400,
            "invalid_container_name",
        );
        assert!(
            String::from_utf8_lossy(&m.body).contains("not valid"),
            "{headers:?}"
        );
    }
    // A valid name passes (its hints go to the namespace's own directory, where no shim is).
    let ok = via.send(
        "POST",
        CHAT,
        &[
            json,
            ("x-belayer-namespace", NS),
            ("x-belayer-container", "victim"),
        ],
        body,
    );
    assert_eq!(ok.unwrap().status, 200);
    assert_eq!(
        up.seen.lock().unwrap().len(),
        1,
        "a refused request was forwarded"
    );
    std::thread::sleep(Duration::from_millis(500));
    match bait.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the gateway reached a socket outside the control directory: {other:?}"),
    }
}

/// Directories removed on drop, pass or fail.
struct Removed(Vec<PathBuf>);

impl Drop for Removed {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// Bodies, requests in flight and header read time are bounded; the gateway listens on loopback
/// unless told otherwise.
#[test]
fn gateway_bounds_bodies_requests_and_header_time() {
    let up = Upstream::start(5, Duration::from_millis(300));
    let gw = BareGateway::start(
        "belayer-gw-bounds",
        &up.url(),
        &[
            "--max-body",
            "1024",
            "--max-concurrent",
            "1",
            "--header-timeout-ms",
            "300",
        ],
    );
    let json = ("content-type", "application/json");
    let hinted = [json, ("x-belayer-container", "box")];
    let big = format!(r#"{{"model":"m","pad":"{}"}}"#, "x".repeat(2000));

    // Oversize: 413, hinted (buffered) or passed through, and nothing reaches the upstream.
    for headers in [&hinted[..], &[][..]] {
        expect_refused(
            Client::new(gw.addr).send("POST", CHAT, headers, big.as_bytes()),
            413,
            "request_too_large",
        );
    }
    assert!(up.seen.lock().unwrap().is_empty());
    // A chunked body (no length to refuse up front) is cut where it passes the bound.
    let mut raw = TcpStream::connect(gw.addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req =
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..4 {
        req.extend_from_slice(format!("200\r\n{}\r\n", "y".repeat(512)).as_bytes());
    }
    req.extend_from_slice(b"0\r\n\r\n");
    raw.write_all(&req).unwrap();
    let mut status = String::new();
    BufReader::new(raw).read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 413 "), "{status:?}");

    // One request in flight at most: a second is refused with 503 while the first streams.
    let addr = gw.addr;
    let first = std::thread::spawn(move || {
        Client::new(addr).send(
            "POST",
            CHAT,
            &[("content-type", "application/json")],
            br#"{"model":"m","stream":true}"#,
        )
    });
    wait_until(Duration::from_secs(5), || {
        !up.seen.lock().unwrap().is_empty()
    });
    let m = expect_refused(
        Client::new(gw.addr).send("GET", "/v1/models", &[], b""),
        503,
        "too_many_requests",
    );
    assert_eq!(m.header("retry-after"), Some("1"));
    assert_eq!(first.join().unwrap().unwrap().status, 200);
    let again = Client::new(gw.addr).send("GET", "/v1/models", &[], b"");
    assert_eq!(again.unwrap().status, 200, "the slot was not given back");

    // A client that never finishes its headers is cut off.
    let mut slow = TcpStream::connect(gw.addr).unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t = Instant::now();
    let mut rest = Vec::new();
    let _ = slow.read_to_end(&mut rest);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "a slow header held its connection for {:?}",
        t.elapsed()
    );

    // Not on a non-loopback address unless told.
    let out = Command::new(belayer_integration::prereq::bin_dir().join("belayer"))
        .args(["gateway", "--listen", "0.0.0.0:0", "--upstream", &up.url()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--allow-remote"),
        "{}: {err}",
        out.status
    );
}
