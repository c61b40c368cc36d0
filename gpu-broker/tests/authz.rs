//! Who may use a broker, against a real broker process: the socket's mode is the broker's
//! whatever the umask, a peer of another uid is refused (the client runs as `nobody` in a child
//! process), an observer gets no KV handle and cannot fence, the number of peers is capped, and
//! running out of fds does not make the poll loop spin.

mod common;

use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use gpu_broker::client::{Client, ClientError};
use gpu_broker::mapping::Mapping;
use gpu_broker::seqpacket::Conn;
use gpu_broker::wire::{ErrorCode, RegionKind, Role};

const NOBODY: u32 = 65534;
const PAGE: u64 = 4096;
const PEER_SOCK: &str = "BELAYER_TEST_PEER_SOCK";
const PEER_ROLE: &str = "BELAYER_TEST_PEER_ROLE";
const PEER_WEIGHTS: &str = "BELAYER_TEST_PEER_WEIGHTS";

/// Not a test of its own: the body of the child process [`connect_as_nobody`] starts (this
/// binary, re-run as `nobody` with only this test selected). Prints how its connection went.
#[test]
fn peer_child() {
    let Ok(sock) = std::env::var(PEER_SOCK) else {
        return;
    };
    let role = match std::env::var(PEER_ROLE).as_deref() {
        Ok("operator") => Role::Operator,
        _ => Role::Observer,
    };
    let outcome = match Client::connect(Path::new(&sock), role, 0) {
        Ok(c) => match c.status() {
            Ok(_) if std::env::var_os(PEER_WEIGHTS).is_some() => try_writing_weights(&c),
            Ok(_) => "served".to_string(),
            Err(e) => format!("{e:?}"),
        },
        Err(e) => format!("{e:?}"),
    };
    println!("PEER-OUTCOME {outcome}");
}

/// The child's attempts to write the published weights through the fd its manifest carried: a
/// writable shared mapping, and reopening the fd writable through /proc.
fn try_writing_weights(c: &Client) -> String {
    let regions = c.manifest().unwrap();
    let Some(w) = regions.iter().find(|r| r.info.kind == RegionKind::Weights) else {
        return "no weights".into();
    };
    let map = Mapping::new(&w.fd, w.info.bytes as usize, true).map(drop);
    let reopen = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/proc/self/fd/{}", w.fd.as_raw_fd()))
        .map(drop)
        .map_err(|e| e.kind());
    format!("writable map: {map:?}; reopened writable: {reopen:?}")
}

/// Connects to `sock` from a child process running as `nobody`; returns what it printed.
fn connect_as_nobody(sock: &Path, role: &str) -> String {
    connect_as_nobody_with(sock, role, &[])
}

fn connect_as_nobody_with(sock: &Path, role: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .envs(env.iter().copied())
        .args([
            "peer_child",
            "--exact",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(PEER_SOCK, sock)
        .env(PEER_ROLE, role)
        .uid(NOBODY)
        .gid(NOBODY)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The harness prints "test peer_child ... " on the same line.
    text.split_once("PEER-OUTCOME ")
        .and_then(|(_, rest)| rest.lines().next())
        .unwrap_or_else(|| panic!("the child printed no outcome ({}): {text}", out.status))
        .to_string()
}

/// A broker process started with `umask` and at most `nofile` fds; killed on drop.
struct Broker {
    child: Child,
}

impl Broker {
    fn start(dir: &Path, args: &[&str], umask: u32, nofile: Option<u64>) -> Self {
        let sock = sock(dir);
        let mut cmd = Command::new(BROKER);
        cmd.arg("--socket")
            .arg(&sock)
            .args(["--kv-mib", "16"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("broker.err")).unwrap());
        // SAFETY: umask and setrlimit are async-signal-safe and touch only the child.
        unsafe {
            cmd.pre_exec(move || {
                libc::umask(umask);
                if let Some(n) = nofile {
                    let l = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &l) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let end = Instant::now() + Duration::from_secs(10);
        while Client::connect(&sock, Role::Observer, 0).is_err() {
            assert!(
                Instant::now() < end,
                "broker did not come up: {}",
                std::fs::read_to_string(dir.join("broker.err")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child }
    }

    /// User + system CPU time so far, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the command name (which may hold spaces): state is field 3, utime 14.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mode_and_gid(p: &Path) -> (u32, u32) {
    let m = std::fs::metadata(p).unwrap();
    (m.permissions().mode() & 0o7777, m.gid())
}

#[test]
fn the_socket_mode_is_the_brokers_whatever_the_umask() {
    let d = Dir::new("authz-mode");
    {
        let _b = Broker::start(&d.0, &[], 0, None);
        assert_eq!(mode_and_gid(&sock(&d.0)), (0o600, 0));
    }
    let _b = Broker::start(&d.0, &["--socket-group", "65534"], 0, None);
    assert_eq!(mode_and_gid(&sock(&d.0)), (0o660, NOBODY));
    // Nothing left of the private directory the socket was bound in.
    let names: Vec<_> = std::fs::read_dir(&d.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with(".belayer-broker")),
        "{names:?}"
    );
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    let d = Dir::new("authz-uid");
    {
        // Mode 0600: nobody cannot even connect.
        let _b = Broker::start(&d.0, &[], 0o022, None);
        let out = connect_as_nobody(&sock(&d.0), "observer");
        assert!(out.contains("EACCES"), "{out}");
    }
    {
        // The socket shared with nobody's group: SO_PEERCRED still refuses its uid.
        let _b = Broker::start(&d.0, &["--socket-group", "65534"], 0o022, None);
        let out = connect_as_nobody(&sock(&d.0), "observer");
        assert!(
            out.contains("Forbidden") && out.contains("uid 65534"),
            "{out}"
        );
    }
    // Allowed by uid: served as an observer, refused as an operator.
    let _b = Broker::start(
        &d.0,
        &["--socket-group", "65534", "--allow-uid", "nobody"],
        0o022,
        None,
    );
    assert_eq!(connect_as_nobody(&sock(&d.0), "observer"), "served");
    let out = connect_as_nobody(&sock(&d.0), "operator");
    assert!(out.contains("Forbidden"), "{out}");
}

#[test]
fn an_observer_gets_no_kv_handle_and_cannot_fence_the_primary() {
    let d = Dir::new("authz-observer");
    let _b = Broker::start(&d.0, &[], 0o022, None);
    let p = Client::connect(&sock(&d.0), Role::Primary, 0).unwrap();
    let g = p.acquire(PAGE, 2).unwrap();
    assert!(
        p.manifest()
            .unwrap()
            .iter()
            .any(|r| r.info.kind == RegionKind::Kv)
    );
    let o = Client::connect(&sock(&d.0), Role::Observer, 0).unwrap();
    let regions = o.manifest().unwrap();
    assert!(
        regions.iter().all(|r| r.info.kind != RegionKind::Kv),
        "the observer got the KV arena: {:?}",
        regions.iter().map(|r| &r.info).collect::<Vec<_>>()
    );
    for _ in 0..3 {
        match o.fence() {
            Err(ClientError::Refused {
                code: ErrorCode::Forbidden,
                ..
            }) => {}
            r => panic!("an observer's fence was not refused: {r:?}"),
        }
    }
    // The primary still holds its lease, at its epoch.
    p.heartbeat().unwrap();
    assert_eq!(o.status().unwrap().epoch, g.epoch);
    // A shadow waiting behind it gets no KV arena either.
    let s = Client::connect(&sock(&d.0), Role::Shadow, 0).unwrap();
    assert!(
        s.manifest()
            .unwrap()
            .iter()
            .all(|r| r.info.kind != RegionKind::Kv)
    );
}

#[test]
fn the_number_of_peers_is_capped() {
    let d = Dir::new("authz-cap");
    let _b = Broker::start(&d.0, &["--max-peers", "3"], 0o022, None);
    let mut held: Vec<Client> = (0..3)
        .map(|_| Client::connect(&sock(&d.0), Role::Observer, 0).unwrap())
        .collect();
    match Client::connect(&sock(&d.0), Role::Observer, 0) {
        Err(ClientError::Refused {
            code: ErrorCode::NoCapacity,
            message,
        }) => assert!(message.contains("3 connections"), "{message}"),
        r => panic!("a fourth peer was not refused: {r:?}"),
    }
    held.pop();
    let end = Instant::now() + Duration::from_secs(5);
    while Client::connect(&sock(&d.0), Role::Observer, 0).is_err() {
        assert!(Instant::now() < end, "a freed slot was not reused");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn running_out_of_fds_does_not_spin_the_poll_loop() {
    let d = Dir::new("authz-emfile");
    // 16 fds: stdio, the listener and a socket plus a pidfd per peer leave room for ~6 peers.
    let b = Broker::start(&d.0, &["--max-peers", "1000"], 0o022, Some(16));
    let conns: Vec<Conn> = (0..30)
        .map(|_| Conn::connect(&sock(&d.0)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = b.cpu_ticks();
    std::thread::sleep(Duration::from_secs(1));
    let used = b.cpu_ticks() - t0;
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(
        used * 5 < hz,
        "the broker used {used} of {hz} ticks in a second with connections it cannot accept"
    );
    let log = std::fs::read_to_string(d.0.join("broker.err")).unwrap();
    assert!(log.contains("out of file descriptors"), "{log}");
    // Once peers leave, the waiting connections are taken and a new client is served.
    drop(conns);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match Client::connect(&sock(&d.0), Role::Observer, 0).and_then(|c| c.status()) {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < end, "not served after fds freed: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_peer_that_is_not_the_holder_cannot_write_unsealed_weights() {
    let d = Dir::new("authz-weights");
    let _b = Broker::start(
        &d.0,
        &[
            "--no-seal-weights",
            "--socket-group",
            "65534",
            "--allow-uid",
            "65534",
        ],
        0o022,
        None,
    );
    let p = Client::connect(&sock(&d.0), Role::Primary, 0).unwrap();
    p.acquire(PAGE, 1).unwrap();
    let r = p.alloc_weights(1, PAGE).unwrap();
    Mapping::new(&r.fd, PAGE as usize, true)
        .unwrap()
        .bytes_mut()[0] = 7;
    let sum =
        gpu_broker::checksum::checksum(Mapping::new(&r.fd, PAGE as usize, false).unwrap().bytes());
    p.publish(1, sum, Vec::new()).unwrap();
    // The holder keeps a writable handle (unsealed weights: a buggy worker can still scribble,
    // and the takeover checksum catches it).
    let mine = p.manifest().unwrap();
    let w = mine
        .iter()
        .find(|r| r.info.kind == RegionKind::Weights)
        .unwrap();
    assert!(Mapping::new(&w.fd, PAGE as usize, true).is_ok());
    // An observer of another uid gets a read-only fd it cannot map or reopen writable.
    let out = connect_as_nobody_with(&sock(&d.0), "observer", &[(PEER_WEIGHTS, "1")]);
    assert_eq!(
        out, "writable map: Err(EACCES); reopened writable: Err(PermissionDenied)",
        "{out}"
    );
}
