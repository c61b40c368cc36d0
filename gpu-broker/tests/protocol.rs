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
    let op = Client::connect(&sock(&d.0), Role::Operator, 0).unwrap();
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

/// A real primary process (a few lines of Python speaking the wire format) is SIGKILLed: the
/// broker confirms the death via its pidfd, frees its pages, promotes the shadow exactly once
/// (no second fence when the socket hang-up and the pidfd fire together), and the promoted
/// shadow keeps its lease.
#[test]
fn sigkilled_primary_process_is_confirmed_dead_and_the_shadow_keeps_its_lease() {
    const PRIMARY: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
for frame in sys.argv[2:]:
    s.send(bytes.fromhex(frame))
    s.recv(65536)
print('{"event": "granted"}', flush=True)
time.sleep(600)
"#;
    let hex = |m: &Msg| {
        wire::encode(m)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let d = Dir::new("pykill");
    let _b = broker(&d.0, &["--kv-mib", "1"]);
    let total = (1 << 20) / PAGE as u32; // --kv-mib 1, created at the first grant
    for round in 1..=4u32 {
        let args = vec![
            "-c".to_string(),
            PRIMARY.to_string(),
            sock(&d.0).display().to_string(),
            hex(&Msg::Hello {
                role: Role::Primary,
                known_instance: 0,
            }),
            hex(&Msg::Acquire {
                page_bytes: PAGE,
                pages: 8,
            }),
        ];
        let mut p = Proc::spawn("python3", &args, d.0.join(format!("py-{round}.err")));
        p.wait_event("granted", Duration::from_secs(30));
        let path = sock(&d.0);
        let shadow = std::thread::spawn(move || {
            let s = Client::connect(&path, Role::Shadow, 0).unwrap();
            let g = s.acquire(PAGE, 8).unwrap();
            (s, g)
        });
        while status(&d.0).shadows_waiting == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        p.signal(libc::SIGKILL);
        let (s, g) = shadow.join().unwrap();
        assert!(g.takeover);
        // Longer than the broker's confirmation wait: a spurious second fence would land here.
        std::thread::sleep(Duration::from_millis(700));
        s.heartbeat()
            .unwrap_or_else(|e| panic!("round {round}: promoted shadow lost its lease: {e}"));
        let st = status(&d.0);
        assert_eq!(st.takeovers, round);
        assert_eq!(st.primary_pid, s.pid);
        // The dead primary's pages went back to the pool (only the shadow's 8 are out).
        assert_eq!(st.kv_free_pages, total - 8);
        s.release().unwrap();
    }
}

#[test]
fn a_second_broker_does_not_steal_a_live_socket() {
    let d = Dir::new("second");
    let b = broker(&d.0, &[]);
    let instance = status(&d.0).instance;
    let mut second = Proc::spawn(
        BROKER,
        &["--socket".into(), sock(&d.0).display().to_string()],
        d.0.join("second.err"),
    );
    assert_ne!(second.wait_exit(Duration::from_secs(10)), 0);
    assert!(
        second.stderr_text().contains("another broker is listening"),
        "{}",
        second.stderr_text()
    );
    assert_eq!(status(&d.0).instance, instance);
    drop(b);
}
