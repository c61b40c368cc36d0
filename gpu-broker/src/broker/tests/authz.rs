//! Roles are enforced by the broker: an observer (or a waiting shadow) never gets a handle to the
//! KV arena and cannot fence; only a peer of an operator uid may say hello as an operator.

use std::os::fd::{AsRawFd, OwnedFd};

use super::{
    Broker, PAGE, acquire, add_peer, broker, connect, grant_epoch, granted_with_shadow_waiting,
    refusal,
};
use crate::mapping::Mapping;
use crate::seqpacket::{Conn, SocketError};
use crate::wire::{ErrorCode, Msg, RegionInfo, RegionKind, Role};

/// The regions and fds a `ManifestReq` from `peer` gets.
fn manifest(b: &mut Broker, peer: u32, c: &Conn) -> Vec<(RegionInfo, OwnedFd)> {
    b.handle(peer, Msg::ManifestReq).unwrap();
    match c.recv() {
        Ok((Msg::Manifest { regions }, fds)) => {
            assert_eq!(regions.len(), fds.len());
            regions.into_iter().zip(fds).collect()
        }
        other => panic!("expected a manifest, got {other:?}"),
    }
}

fn has_kv(regions: &[(RegionInfo, OwnedFd)]) -> bool {
    regions.iter().any(|(i, _)| i.kind == RegionKind::Kv)
}

/// A connection from a peer of `uid` that has not said hello yet.
fn connect_as(b: &mut Broker, uid: u32) -> (u32, Conn) {
    add_peer(b, uid, None, None)
}

fn hello(b: &mut Broker, peer: u32, role: Role) -> Result<(), String> {
    b.handle(
        peer,
        Msg::Hello {
            role,
            known_instance: 0,
        },
    )
}

#[test]
fn an_observer_gets_no_kv_handle_and_cannot_fence() {
    let mut b = broker(1 << 20);
    let (p, pw) = connect(&mut b, Role::Primary, None);
    acquire(&mut b, p, PAGE, 2).unwrap();
    let epoch = grant_epoch(&pw);
    // The lease holder maps the arena writable.
    let regions = manifest(&mut b, p, &pw);
    let (info, fd) = regions
        .iter()
        .find(|(i, _)| i.kind == RegionKind::Kv)
        .expect("the primary's manifest has the KV arena");
    let mut m = Mapping::new(fd, info.bytes as usize, true).unwrap();
    m.bytes_mut()[0] = 1;

    let (o, ow) = connect(&mut b, Role::Observer, None);
    let regions = manifest(&mut b, o, &ow);
    assert!(!has_kv(&regions), "an observer got the KV arena");
    assert!(regions.is_empty(), "nothing is published: no fd at all");
    b.handle(o, Msg::Fence).unwrap();
    let (code, message) = refusal(&ow);
    assert_eq!(code, ErrorCode::Forbidden, "{message}");
    assert_eq!(b.epoch, epoch, "the observer's fence bumped the epoch");
    assert_eq!(b.lease.as_ref().map(|l| l.peer), Some(p));
    b.handle(p, Msg::Heartbeat { epoch }).unwrap();
    assert!(matches!(pw.recv(), Ok((Msg::Ok { .. }, _))));
    // Asking for the lease is a violation that drops the observer.
    assert!(acquire(&mut b, o, PAGE, 1).is_err());

    // An operator may fence.
    let (op, opw) = connect(&mut b, Role::Operator, None);
    let regions = manifest(&mut b, op, &opw);
    assert!(!has_kv(&regions), "an operator got the KV arena");
    b.handle(op, Msg::Fence).unwrap();
    assert!(matches!(opw.recv(), Ok((Msg::Ok { epoch: e }, _)) if e > epoch));
    assert!(b.lease.is_none());
}

#[test]
fn a_shadow_gets_the_kv_arena_only_when_promoted() {
    let mut b = broker(1 << 20);
    let (s, sw, _pw) = granted_with_shadow_waiting(&mut b);
    assert!(!has_kv(&manifest(&mut b, s, &sw)));
    b.primary_lost("fenced");
    grant_epoch(&sw);
    assert!(has_kv(&manifest(&mut b, s, &sw)));
}

#[test]
fn only_operator_uids_may_say_hello_as_an_operator() {
    let mut b = broker(1 << 20);
    b.cfg.access.uids.push(65534);
    let (peer, w) = connect_as(&mut b, 65534);
    assert!(hello(&mut b, peer, Role::Operator).is_err());
    let (code, message) = refusal(&w);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(message.contains("65534"), "{message}");
    // The same uid may observe, and a listed operator uid may operate.
    let (peer, w) = connect_as(&mut b, 65534);
    hello(&mut b, peer, Role::Observer).unwrap();
    assert!(matches!(w.recv(), Ok((Msg::HelloOk { .. }, _))));
    b.cfg.access.operator_uids.push(65534);
    let (peer, w) = connect_as(&mut b, 65534);
    hello(&mut b, peer, Role::Operator).unwrap();
    assert!(matches!(w.recv(), Ok((Msg::HelloOk { .. }, _))));
    assert!(matches!(w.recv(), Err(SocketError::WouldBlock)));
}

#[test]
fn only_the_holder_gets_a_writable_handle_to_unsealed_weights() {
    let mut b = broker(1 << 20);
    b.cfg.seal_weights = false;
    let (p, pw) = connect(&mut b, Role::Primary, None);
    acquire(&mut b, p, PAGE, 1).unwrap();
    let epoch = grant_epoch(&pw);
    let alloc = Msg::AllocWeights {
        epoch,
        version: 1,
        bytes: PAGE,
    };
    b.handle(p, alloc).unwrap();
    assert!(matches!(pw.recv(), Ok((Msg::Manifest { .. }, _))));
    let checksum = crate::checksum::checksum(&[0u8; PAGE as usize]);
    let publish = Msg::Publish {
        epoch,
        version: 1,
        checksum,
        meta: Vec::new(),
    };
    b.handle(p, publish).unwrap();
    assert!(matches!(pw.recv(), Ok((Msg::Ok { .. }, _))));
    let weights = |regions: Vec<(RegionInfo, OwnedFd)>| {
        regions
            .into_iter()
            .find(|(i, _)| i.kind == RegionKind::Weights)
            .unwrap()
            .1
    };
    let held = weights(manifest(&mut b, p, &pw));
    assert!(Mapping::new(&held, PAGE as usize, true).is_ok());
    let (o, ow) = connect(&mut b, Role::Observer, None);
    let seen = weights(manifest(&mut b, o, &ow));
    assert_eq!(
        Mapping::new(&seen, PAGE as usize, true).err(),
        Some(nix::errno::Errno::EACCES)
    );
    assert!(Mapping::new(&seen, PAGE as usize, false).is_ok());
    let mode = nix::sys::stat::fstat(seen.as_raw_fd()).unwrap().st_mode & 0o777;
    assert_eq!(
        mode, 0o600,
        "a memfd of mode {mode:o} can be reopened writable by anyone"
    );
}
