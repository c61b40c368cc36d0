//! Protocol tests against a real broker process (no model needed): malformed packets, epoch
//! fencing, promotion of a waiting shadow, and the restarted-broker error.

mod common;

use std::time::Duration;

use common::*;
use gpu_broker::client::{Client, ClientError};
use gpu_broker::seqpacket::{Conn, SocketError};
use gpu_broker::wire::{self, CommitEntry, ErrorCode, Msg, Role, SamplingParams};

const PAGE: u64 = 4096;

fn params() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        top_k: 0,
        seed: 1,
        max_new_tokens: 8,
    }
}

fn entry(id: u64, pos: u32, tok: u32) -> CommitEntry {
    CommitEntry {
        request_id: id,
        pos,
        tokens: vec![tok],
        sampler_state: 0,
        finished: false,
    }
}

fn assert_dropped(c: &Conn) {
    match c.recv() {
        Err(SocketError::Closed) => {}
        other => panic!("expected the broker to drop the connection, got {other:?}"),
    }
}

#[test]
fn malformed_packets_drop_only_that_connection() {
    let d = Dir::new("malformed");
    let mut b = broker(&d.0, &[]);
    let instance = Client::connect(&sock(&d.0), Role::Observer, 0)
        .unwrap()
        .instance;
    let hello = wire::encode(&Msg::Hello {
        role: Role::Observer,
        known_instance: 0,
    });
    let mut bad_version = hello.clone();
    bad_version[4] = 77;
    let mut bad_len = hello.clone();
    bad_len[8] = 200;
    let mut bad_kind = hello.clone();
    bad_kind[6] = 250;
    let garbage: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![],
        bad_version,
        bad_len,
        bad_kind,
        hello[..hello.len() - 1].to_vec(),
        vec![0xAB; 70 * 1024],
        wire::encode(&Msg::Commit {
            epoch: 1,
            entries: vec![],
        }), // before hello
    ];
    for g in &garbage {
        let c = Conn::connect(&sock(&d.0)).unwrap();
        c.send_raw(g, &[]).unwrap();
        assert_dropped(&c);
    }
    // After a valid hello: garbage, and a second hello, and fds the broker never asked for.
    for g in [b"\x00\x01".to_vec(), hello.clone()] {
        let c = Conn::connect(&sock(&d.0)).unwrap();
        c.send_raw(&hello, &[]).unwrap();
        assert!(matches!(c.recv().unwrap().0, Msg::HelloOk { .. }));
        let f = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsRawFd;
        c.send_raw(&g, &[f.as_raw_fd()]).unwrap();
        assert_dropped(&c);
    }
    // The broker survived, same instance.
    assert!(b.child.try_wait().unwrap().is_none(), "broker died");
    let c = Client::connect(&sock(&d.0), Role::Observer, 0).unwrap();
    assert_eq!(c.instance, instance);
    assert_eq!(c.status().unwrap().instance, instance);
}

#[test]
fn stale_epochs_are_refused_after_a_fence() {
    let d = Dir::new("fence");
    let _b = broker(&d.0, &[]);
    let a = Client::connect(&sock(&d.0), Role::Primary, 0).unwrap();
    let g = a.acquire(PAGE, 4).unwrap();
    assert!(!g.takeover);
    a.admit(1, params(), 0, vec![5, 6]).unwrap();
    a.commit(vec![entry(1, 0, 7)]).unwrap();
    // A second primary cannot take a held lease.
    let b2 = Client::connect(&sock(&d.0), Role::Primary, 0).unwrap();
    assert!(b2.acquire(PAGE, 4).unwrap_err().is_stale_epoch());
    // An operator fences the primary: its epoch is dead.
    let op = Client::connect(&sock(&d.0), Role::Observer, 0).unwrap();
    let e2 = op.fence().unwrap();
    assert!(e2 > g.epoch);
    let err = a.commit(vec![entry(1, 1, 8)]).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Refused {
                code: ErrorCode::StaleEpoch,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(a.heartbeat().unwrap_err().is_stale_epoch());
    assert!(a.alloc_weights(1, 4096).unwrap_err().is_stale_epoch());
    // The log kept exactly what the valid epoch committed.
    assert_eq!(op.log_get(1).unwrap().generated, vec![7]);
    // A new primary gets a newer epoch and continues the log; an old epoch stays refused.
    let g3 = b2.acquire(PAGE, 4).unwrap();
    assert!(g3.epoch > e2 && g3.takeover);
    b2.commit(vec![entry(1, 1, 9)]).unwrap();
    assert!(
        b2.commit_at(g.epoch, vec![entry(1, 2, 9)])
            .unwrap_err()
            .is_stale_epoch()
    );
    // Out-of-order commits are refused too.
    assert!(matches!(
        b2.commit(vec![entry(1, 5, 9)]).unwrap_err(),
        ClientError::Refused {
            code: ErrorCode::BadRequest,
            ..
        }
    ));
}

#[test]
fn waiting_shadow_is_promoted_when_the_primary_connection_dies() {
    let d = Dir::new("promote");
    let _b = broker(&d.0, &[]);
    let p = Client::connect(&sock(&d.0), Role::Primary, 0).unwrap();
    let g = p.acquire(PAGE, 8).unwrap();
    p.admit(3, params(), 0, vec![1, 2, 3]).unwrap();
    p.commit(vec![entry(3, 0, 4)]).unwrap();
    let path = sock(&d.0);
    let shadow = std::thread::spawn(move || {
        let s = Client::connect(&path, Role::Shadow, 0).unwrap();
        let g = s.acquire(PAGE, 8).unwrap();
        (s, g)
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(status(&d.0).shadows_waiting, 1);
    drop(p); // connection closes; this process lives on, so the broker fences it as a zombie
    let (s, g2) = shadow.join().unwrap();
    assert!(g2.takeover && g2.epoch > g.epoch);
    // The zombie's KV pages are quarantined: the shadow got different ones.
    assert!(g2.pages.iter().all(|r| !g.pages.contains(r)));
    let l = s.log_get(3).unwrap();
    assert_eq!((l.prompt, l.generated), (vec![1, 2, 3], vec![4]));
    s.commit(vec![entry(3, 1, 5)]).unwrap();
    assert_eq!(status(&d.0).takeovers, 1);
}

#[test]
fn restarted_broker_refuses_a_hello_for_the_old_instance() {
    let d = Dir::new("instance");
    let b = broker(&d.0, &[]);
    let old = Client::connect(&sock(&d.0), Role::Primary, 0).unwrap();
    drop(b);
    assert!(matches!(old.status().unwrap_err(), ClientError::BrokerGone));
    let _b2 = broker(&d.0, &[]);
    let err = Client::connect(&sock(&d.0), Role::Primary, old.instance).unwrap_err();
    assert!(err.is_broker_restart(), "{err:?}");
    assert!(err.to_string().contains("broker restarted"), "{err}");
}
