//! Serving mode with real processes: clients send requests to `belayer-worker --serve`; the
//! primary is SIGKILLed mid-generation, the shadow takes over the socket path, rebuilds the
//! in-flight requests from the log, and every client gets the same tokens as in a failure-free
//! run. Finished requests asked again are answered from the log.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use gpu_broker::worker::serve::protocol::{GenClient, GenRequest};

const LONG: Duration = Duration::from_secs(240);

fn requests() -> Vec<GenRequest> {
    (1..=4u64)
        .map(|id| GenRequest {
            id,
            prompt: (0..60 + 7 * id as u32)
                .map(|i| 300 + (i * 37 + id as u32 * 101) % 40_000)
                .collect(),
            max_new: 20,
            seed: 9 + id,
            temperature: if id % 2 == 0 { 0.8 } else { 0.0 },
            top_k: if id % 2 == 0 { 40 } else { 0 },
        })
        .collect()
}

fn server(d: &Path, role: &str) -> Proc {
    let listen = d.join("serve.sock").display().to_string();
    worker(
        d,
        role,
        "unused.json",
        &["--serve", &listen, "--max-batch", "4", "--max-seq", "160"],
        &[],
    )
}

/// Sends every request concurrently; returns the replies' tokens by id, and reconnect counts.
fn generate_all(d: &Path) -> Vec<(u64, Vec<u32>, u32)> {
    let c = GenClient::new(&d.join("serve.sock"), LONG);
    std::thread::scope(|s| {
        let hs: Vec<_> = requests()
            .into_iter()
            .map(|r| {
                let c = c.clone();
                s.spawn(move || {
                    let g = c.generate(&r).unwrap();
                    assert_eq!(g.reply.id, r.id);
                    (r.id, g.reply.tokens, g.reconnects)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn served_requests_survive_a_killed_primary_with_identical_tokens() {
    model();
    let base = {
        let d = Dir::new("serve-base");
        let _b = broker(&d.0, &[]);
        let mut p = server(&d.0, "primary");
        p.wait_event("serving", LONG);
        generate_all(&d.0)
    };
    assert!(base.iter().all(|(_, t, _)| t.len() == 20));

    let d = Dir::new("serve-kill");
    let _b = broker(&d.0, &[]);
    let mut p = server(&d.0, "primary");
    let mut s = server(&d.0, "shadow");
    p.wait_event("serving", LONG);
    s.wait_event("shadow_ready", LONG);
    let killer = std::thread::spawn({
        let dir = d.0.clone();
        let pid = p.pid();
        move || {
            wait_generated(&dir, 1, 5, LONG);
            // SAFETY: kill(2) of the primary worker, our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let got = generate_all(&d.0);
    killer.join().unwrap();
    for ((id, t, _), (bid, bt, _)) in got.iter().zip(&base) {
        assert_eq!((id, t), (bid, bt), "tokens after takeover differ");
    }
    assert!(
        got.iter().any(|(_, _, reconnects)| *reconnects > 0),
        "no client saw the primary die"
    );
    let g = s.wait_event("granted", LONG);
    assert_eq!(g["takeover"], true);
    let r = s.wait_event("rebuilt", LONG);
    assert!(r["requests"].as_u64().unwrap() >= 1, "{r}");
    assert!(s.event("cold_load").is_none());
    assert_eq!(status(&d.0).takeovers, 1);

    // Asked again, a finished request is answered from the log; an id reused for another prompt
    // is refused.
    let c = GenClient::new(&d.0.join("serve.sock"), LONG);
    let again = c.generate(&requests()[0]).unwrap();
    assert!(again.reply.from_log);
    assert_eq!(again.reply.tokens, base[0].1);
    let mut other = requests()[0].clone();
    other.prompt.push(301);
    let e = c.generate(&other).unwrap_err().to_string();
    assert!(e.contains("another prompt"), "{e}");
}

#[test]
fn the_log_keeps_only_the_newest_finished_requests_and_a_resend_of_an_older_one_is_generated_anew()
{
    model();
    let d = Dir::new("serve-retention");
    let _b = broker(&d.0, &["--keep-finished", "2"]);
    let mut p = server(&d.0, "primary");
    p.wait_event("serving", LONG);
    let c = GenClient::new(&d.0.join("serve.sock"), LONG);
    // One after another: they finish in id order.
    let first: Vec<Vec<u32>> = requests()
        .iter()
        .map(|r| c.generate(r).unwrap().reply.tokens)
        .collect();
    assert_eq!(
        status(&d.0).requests,
        2,
        "the log holds more than 2 finished requests"
    );
    let newest = c.generate(&requests()[3]).unwrap();
    assert!(newest.reply.from_log);
    assert_eq!(newest.reply.tokens, first[3]);
    // Request 1 was let go: admitted again and generated, to the same tokens (seeded).
    let oldest = c.generate(&requests()[0]).unwrap();
    assert!(!oldest.reply.from_log);
    assert_eq!(oldest.reply.tokens, first[0]);
    assert_eq!(status(&d.0).requests, 2);
}
