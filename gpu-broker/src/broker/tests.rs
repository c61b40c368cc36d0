//! Broker decisions driven in-process over real socket pairs, memfds and child processes.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Broker, Config, Peer};
use crate::backend::host::HostBackend;
use crate::pidfd::PidFd;
use crate::seqpacket::{Conn, SocketError};
use crate::wire::{
    ErrorCode, KvBlock, MAX_KV_BLOCKS, MAX_TOKENS, Msg, RequestLog, Role, SamplingParams, Status,
};

const PAGE: u64 = 4096;

fn broker(kv_bytes: u64) -> Broker {
    let mut cfg = Config::new(PathBuf::from("/nonexistent/broker.sock"));
    cfg.kv_bytes = kv_bytes;
    cfg.confirm_timeout = Duration::from_millis(20);
    Broker::new(cfg, Box::new(HostBackend))
}

/// Adds a peer that has said hello as `role`; returns its id and the worker's end (non-blocking,
/// so a missing reply shows as `WouldBlock` instead of a hang).
fn connect(b: &mut Broker, role: Role, pidfd: Option<PidFd>) -> (u32, Conn) {
    add_peer(b, 0, Some(role), pidfd)
}

/// Adds a peer of `uid` that has said hello as `role` (`None`: not yet).
fn add_peer(b: &mut Broker, uid: u32, role: Option<Role>, pidfd: Option<PidFd>) -> (u32, Conn) {
    let (worker, broker_end) = Conn::pair().unwrap();
    worker.set_nonblocking().unwrap();
    broker_end.set_nonblocking().unwrap();
    let id = b.next_peer;
    b.next_peer += 1;
    b.peers.insert(
        id,
        Peer {
            conn: broker_end,
            pid: pidfd.as_ref().map_or(0, PidFd::pid),
            pidfd: pidfd.map(Arc::new),
            uid,
            role,
        },
    );
    (id, worker)
}

/// The reply waiting on a worker's end.
fn reply(c: &Conn) -> Msg {
    match c.recv() {
        Ok((m, _)) => m,
        Err(e) => panic!("expected a reply, got {e:?}"),
    }
}

fn refusal(c: &Conn) -> (ErrorCode, String) {
    match reply(c) {
        Msg::Error { code, message } => (code, message),
        m => panic!("expected a refusal, got {m:?}"),
    }
}

fn grant_epoch(c: &Conn) -> u64 {
    match reply(c) {
        Msg::Grant { epoch, .. } => epoch,
        m => panic!("expected a grant, got {m:?}"),
    }
}

fn acquire(b: &mut Broker, peer: u32, page_bytes: u64, pages: u32) -> Result<(), String> {
    b.handle(peer, Msg::Acquire { page_bytes, pages })
}

/// A `sleep` child, killed and reaped on drop.
struct Sleeper(Child);

impl Sleeper {
    fn new() -> Self {
        Self(Command::new("sleep").arg("60").spawn().unwrap())
    }
    fn pidfd(&self) -> PidFd {
        PidFd::open(self.0.id() as i32).unwrap()
    }
    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn a_reply_too_large_for_a_frame_becomes_an_error() {
    let mut b = broker(1 << 20);
    let (id, w) = connect(&mut b, Role::Observer, None);
    let huge = Msg::LogEntry(RequestLog {
        request_id: 1,
        params: SamplingParams {
            temperature: 0.0,
            top_k: 0,
            seed: 0,
            max_new_tokens: 0,
        },
        prompt: vec![1; MAX_TOKENS],
        generated: vec![2; MAX_TOKENS],
        sampler_state: 0,
        finished: true,
    });
    b.reply(id, &huge, &[]);
    let (code, message) = refusal(&w);
    assert_eq!(code, ErrorCode::Backend);
    assert!(message.contains("frame bound"), "{message}");
}

#[test]
fn a_reply_that_cannot_be_sent_shuts_the_connection_down() {
    let mut b = broker(1 << 20);
    let (id, w) = connect(&mut b, Role::Observer, None);
    // The worker reads nothing: the socket fills and a send fails with no room.
    for _ in 0..100_000 {
        b.reply(id, &Msg::StatusReply(Status::default()), &[]);
    }
    let mut got = 0;
    loop {
        match w.recv() {
            Ok(_) => got += 1,
            Err(SocketError::Closed) => break,
            Err(e) => panic!("after {got} replies: expected end-of-file, got {e:?}"),
        }
    }
    assert!(got > 0 && got < 100_000);
    // The broker's side reads end-of-file too, so its poll loop drops the peer.
    assert!(matches!(b.peers[&id].conn.recv(), Err(SocketError::Closed)));
}

#[test]
fn a_refused_first_grant_leaves_no_kv_arena() {
    let mut b = broker(1 << 20);
    let (p, w) = connect(&mut b, Role::Primary, None);
    for bad in [1, 512, PAGE + 8, 2 << 20] {
        acquire(&mut b, p, bad, 0).unwrap();
        let (code, message) = refusal(&w);
        assert_eq!(code, ErrorCode::BadRequest, "{bad}: {message}");
        assert!(b.kv.is_none());
    }
    // More pages than the arena would have: refused before any arena is made.
    acquire(&mut b, p, PAGE, 257).unwrap();
    assert_eq!(refusal(&w).0, ErrorCode::NoCapacity);
    assert!(b.kv.is_none());
    // So the next worker still picks the page size.
    acquire(&mut b, p, 2 * PAGE, 128).unwrap();
    match reply(&w) {
        Msg::Grant { pages, .. } => assert_eq!(pages, vec![(0, 128)]),
        m => panic!("{m:?}"),
    }
    let kv = b.kv.as_ref().unwrap();
    assert_eq!((kv.page_bytes, kv.pages.free_count()), (2 * PAGE, 0));
}

#[test]
fn a_kv_page_count_beyond_u32_is_refused() {
    let mut b = broker(1 << 45);
    let (p, w) = connect(&mut b, Role::Primary, None);
    acquire(&mut b, p, PAGE, 1).unwrap();
    let (code, message) = refusal(&w);
    assert_eq!(code, ErrorCode::BadRequest, "{message}");
    assert!(message.contains("pages"), "{message}");
    assert!(b.kv.is_none());
}

#[test]
fn a_publish_whose_checksum_outlasts_the_lease_keeps_the_lease() {
    const BYTES: usize = 128 << 20;
    let mut b = broker(1 << 20);
    let lease = Duration::from_millis(2);
    b.cfg.lease = lease;
    let (p, w) = connect(&mut b, Role::Primary, None);
    acquire(&mut b, p, PAGE, 1).unwrap();
    let epoch = grant_epoch(&w);
    b.handle(
        p,
        Msg::AllocWeights {
            epoch,
            version: 7,
            bytes: BYTES as u64,
        },
    )
    .unwrap();
    assert!(matches!(reply(&w), Msg::Manifest { .. }));
    let checksum = crate::checksum::checksum(&vec![0u8; BYTES]);
    let t0 = Instant::now();
    b.handle(
        p,
        Msg::Publish {
            epoch,
            version: 7,
            checksum,
            meta: Vec::new(),
        },
    )
    .unwrap();
    let t1 = Instant::now();
    assert!(matches!(reply(&w), Msg::Ok { .. }));
    assert!(
        t1 - t0 > 4 * lease,
        "the checksum took {:?}: too fast to test against a {lease:?} lease",
        t1 - t0
    );
    // The lease runs from the end of the checksum, not from the start of the publish.
    let deadline = b.lease.as_ref().unwrap().deadline;
    assert!(
        deadline + lease > t1,
        "lease deadline {:?} before t1",
        t1 - deadline
    );
}

#[test]
fn a_peer_lost_twice_still_has_its_death_confirmed() {
    let mut b = broker(1 << 20);
    let mut child = Sleeper::new();
    let (p, w) = connect(&mut b, Role::Primary, Some(child.pidfd()));
    acquire(&mut b, p, PAGE, 2).unwrap();
    grant_epoch(&w);
    // Alive: fenced, its pages quarantined.
    b.primary_lost("fenced");
    assert_eq!(b.zombies.len(), 1);
    // No one else waits: it asks again and gets the lease (and two more pages) back.
    acquire(&mut b, p, PAGE, 2).unwrap();
    grant_epoch(&w);
    child.kill();
    b.primary_lost("lost again");
    b.tick();
    assert!(b.zombies.is_empty());
    let kv = b.kv.as_ref().unwrap();
    assert_eq!(kv.pages.free_count(), 256, "pages stayed retired");
}

/// A primary granted the lease and a shadow queued behind it: the shadow's peer id and
/// connection, and the primary's connection (kept open by the caller).
fn granted_with_shadow_waiting(b: &mut Broker) -> (u32, Conn, Conn) {
    let (p, pw) = connect(b, Role::Primary, None);
    acquire(b, p, PAGE, 1).unwrap();
    grant_epoch(&pw);
    let (s, sw) = connect(b, Role::Shadow, None);
    acquire(b, s, PAGE, 1).unwrap();
    (s, sw, pw)
}

#[test]
fn a_second_acquire_while_waiting_drops_the_connection() {
    let mut b = broker(1 << 20);
    let (s, _sw, _pw) = granted_with_shadow_waiting(&mut b);
    assert!(acquire(&mut b, s, PAGE, 1).is_err());
    assert_eq!(b.shadows.len(), 1);
}

#[test]
fn a_fenced_primary_is_not_promoted_from_its_own_queued_acquire() {
    let mut b = broker(1 << 20);
    let (s, sw, _pw) = granted_with_shadow_waiting(&mut b);
    b.primary_lost("fenced");
    grant_epoch(&sw);
    assert_eq!(b.lease.as_ref().unwrap().peer, s);
    // The promoted shadow queues another acquire, then is fenced itself.
    acquire(&mut b, s, PAGE, 1).unwrap();
    b.primary_lost("fenced");
    assert!(b.lease.is_none(), "the fenced shadow was promoted again");
    assert!(b.shadows.is_empty());
    assert!(matches!(sw.recv(), Err(SocketError::WouldBlock)));
}

fn kv_block(block: u32) -> KvBlock {
    KvBlock {
        block,
        prefix: [block as u8; 16],
        checksum: u64::from(block) * 3,
    }
}

/// (pages, blocks, more) of a `KvAdoptable` reply.
type Adoptable = (Vec<(u32, u32)>, Vec<KvBlock>, bool);

fn adoptable(b: &mut Broker, peer: u32, c: &Conn, epoch: u64, from: u32) -> Adoptable {
    b.handle(peer, Msg::KvAdoptReq { epoch, from }).unwrap();
    match reply(c) {
        Msg::KvAdoptable {
            pages,
            blocks,
            more,
            ..
        } => (pages, blocks, more),
        m => panic!("expected KvAdoptable, got {m:?}"),
    }
}

/// A primary (a real child process) holding 2 of `arena_pages` pages with noted KV blocks 1..=3,
/// and a shadow waiting: (primary's child, its connection, shadow id, shadow connection).
fn noted_primary_and_shadow(b: &mut Broker) -> (Sleeper, Conn, u32, Conn) {
    let child = Sleeper::new();
    let (p, pw) = connect(b, Role::Primary, Some(child.pidfd()));
    acquire(b, p, PAGE, 2).unwrap();
    let epoch = grant_epoch(&pw);
    let blocks = (1..=3).map(kv_block).collect();
    b.handle(p, Msg::KvNote { epoch, blocks }).unwrap();
    assert!(matches!(reply(&pw), Msg::Ok { .. }));
    // A later record of a block replaces the earlier one.
    let mut again = kv_block(2);
    again.checksum = 99;
    b.handle(
        p,
        Msg::KvNote {
            epoch,
            blocks: vec![again],
        },
    )
    .unwrap();
    assert!(matches!(reply(&pw), Msg::Ok { .. }));
    let (s, sw) = connect(b, Role::Shadow, None);
    acquire(b, s, PAGE, 2).unwrap();
    (child, pw, s, sw)
}

#[test]
fn a_dead_primarys_kv_blocks_go_to_its_successor_on_pages_kept_apart() {
    let mut b = broker(8 * PAGE);
    let (mut child, _pw, s, sw) = noted_primary_and_shadow(&mut b);
    child.kill();
    b.primary_lost("pid exited");
    let (epoch, pages) = match reply(&sw) {
        Msg::Grant { epoch, pages, .. } => (epoch, pages),
        m => panic!("{m:?}"),
    };
    assert_eq!(
        pages,
        vec![(2, 2)],
        "the dead primary's pages were handed out again"
    );
    let (old, blocks, more) = adoptable(&mut b, s, &sw, epoch, 0);
    assert_eq!(old, vec![(0, 2)]);
    let mut want: Vec<KvBlock> = (1..=3).map(kv_block).collect();
    want[1].checksum = 99;
    assert_eq!((blocks, more), (want.clone(), false));
    assert_eq!(adoptable(&mut b, s, &sw, epoch, 2).1, want[1..].to_vec());
    assert_eq!(b.kv.as_ref().unwrap().pages.free_count(), 4);
    b.handle(s, Msg::KvAdoptDone { epoch }).unwrap();
    assert!(matches!(reply(&sw), Msg::Ok { .. }));
    assert_eq!(b.kv.as_ref().unwrap().pages.free_count(), 6);
    assert_eq!(adoptable(&mut b, s, &sw, epoch, 0), (vec![], vec![], false));
}

#[test]
fn a_fenced_live_primarys_kv_blocks_are_never_offered() {
    let mut b = broker(8 * PAGE);
    let (_child, _pw, s, sw) = noted_primary_and_shadow(&mut b);
    b.primary_lost("fenced");
    let epoch = grant_epoch(&sw);
    assert_eq!(adoptable(&mut b, s, &sw, epoch, 0), (vec![], vec![], false));
}

#[test]
fn a_fenced_successor_leaves_nothing_to_adopt_not_even_its_predecessors_blocks() {
    let mut b = broker(8 * PAGE);
    let (mut child, _pw, _s, sw) = noted_primary_and_shadow(&mut b);
    child.kill();
    b.primary_lost("pid exited");
    let epoch = grant_epoch(&sw);
    let (s2, s2w) = connect(&mut b, Role::Shadow, None);
    acquire(&mut b, s2, PAGE, 2).unwrap();
    // The successor (alive, no pidfd here) is lost before it is done adopting.
    b.primary_lost("lease expired");
    let e2 = grant_epoch(&s2w);
    assert!(e2 > epoch);
    assert_eq!(adoptable(&mut b, s2, &s2w, e2, 0), (vec![], vec![], false));
}

#[test]
fn with_no_room_beside_them_the_dead_primarys_pages_go_to_its_successor_unadopted() {
    let mut b = broker(2 * PAGE);
    let (mut child, _pw, s, sw) = noted_primary_and_shadow(&mut b);
    child.kill();
    b.primary_lost("pid exited");
    let epoch = match reply(&sw) {
        Msg::Grant { epoch, pages, .. } => {
            assert_eq!(pages, vec![(0, 2)]);
            epoch
        }
        m => panic!("{m:?}"),
    };
    assert_eq!(adoptable(&mut b, s, &sw, epoch, 0), (vec![], vec![], false));
}

#[test]
fn kept_kv_pages_return_to_the_pool_after_the_keep_time() {
    let mut b = broker(8 * PAGE);
    b.cfg.kv_adopt_keep = Duration::from_millis(1);
    let (mut child, _pw, _s, sw) = noted_primary_and_shadow(&mut b);
    child.kill();
    b.primary_lost("pid exited");
    grant_epoch(&sw);
    assert_eq!(b.kv.as_ref().unwrap().pages.free_count(), 4);
    std::thread::sleep(Duration::from_millis(5));
    b.tick();
    assert_eq!(b.kv.as_ref().unwrap().pages.free_count(), 6);
}

#[test]
fn kv_records_page_through_long_lists_and_need_the_lease() {
    let mut b = broker(8 * PAGE);
    let child = Sleeper::new();
    let (p, pw) = connect(&mut b, Role::Primary, Some(child.pidfd()));
    acquire(&mut b, p, PAGE, 2).unwrap();
    let epoch = grant_epoch(&pw);
    let n = MAX_KV_BLOCKS as u32 + 5;
    for chunk in (0..n).collect::<Vec<_>>().chunks(MAX_KV_BLOCKS) {
        let blocks = chunk.iter().copied().map(kv_block).collect();
        b.handle(p, Msg::KvNote { epoch, blocks }).unwrap();
        assert!(matches!(reply(&pw), Msg::Ok { .. }));
    }
    // Not the lease holder: refused, nothing recorded.
    let (o, ow) = connect(&mut b, Role::Shadow, None);
    b.handle(
        o,
        Msg::KvNote {
            epoch,
            blocks: vec![kv_block(n + 7)],
        },
    )
    .unwrap();
    assert_eq!(refusal(&ow).0, ErrorCode::NotPrimary);
    b.handle(o, Msg::KvAdoptReq { epoch, from: 0 }).unwrap();
    assert_eq!(refusal(&ow).0, ErrorCode::NotPrimary);
    let (s, sw) = connect(&mut b, Role::Shadow, None);
    acquire(&mut b, s, PAGE, 2).unwrap();
    drop(child);
    b.primary_lost("pid exited");
    let epoch = grant_epoch(&sw);
    // The old epoch's holder is refused too.
    b.handle(
        p,
        Msg::KvAdoptReq {
            epoch: epoch - 1,
            from: 0,
        },
    )
    .unwrap();
    assert_eq!(refusal(&pw).0, ErrorCode::StaleEpoch);
    let (_, first, more) = adoptable(&mut b, s, &sw, epoch, 0);
    assert_eq!((first.len(), more), (MAX_KV_BLOCKS, true));
    let next = first.last().unwrap().block + 1;
    let (_, rest, more) = adoptable(&mut b, s, &sw, epoch, next);
    assert_eq!((rest.len(), more), (5, false));
    assert_eq!(rest.last().unwrap().block, n - 1);
}

mod authz;
