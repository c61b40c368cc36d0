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
