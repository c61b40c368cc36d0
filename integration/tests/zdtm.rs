//! CRIU's ZDTM static tests through Belayer, a quick subset (the whole suite is
//! `belayer-bench zdtm`): each test that passes in a plain container (control) must pass after a
//! checkpoint, a SIGKILL of the init and a restore in place; in a fork of that checkpoint; and
//! after an automatic checkpoint and the recovery of a crash.

use belayer_integration::zdtm::{Harness, Mode, Outcome, Suite};
use belayer_integration::{Containerd, Flavor};

/// One of each kind of state: environment, a sleeping task, a pipe, a listening TCP socket, a
/// file open for appending, memory mappings, threads, POSIX timers, a deleted (ghost) file and
/// an unconnected Unix socket; a zombie, pending signals, and raised inheritable capabilities
/// (which the restore's privilege check refused before it skipped dead tasks and allowed
/// inheritable bits within the bounding set); a connected UDP socket and a TCP connection over
/// 127.0.0.1 (which CRIU could not restore while the restored network namespace's `lo` was
/// still down); a stopped task; inotify watches on the overlay root (whose handles CRIU cannot
/// open: found by scanning `/`).
const QUICK: &[&str] = &[
    "env00",
    "sleeping00",
    "pipe00",
    "socket_listen",
    "file_append",
    "maps00",
    "pthread00",
    "timers",
    "unlink_fstat00",
    "sk-unix-unconn",
    "zombie00",
    "sigpending",
    "caps01",
    "socket_udp",
    "socket-tcp-local",
    "stopped",
    "inotify04",
];

#[test]
fn zdtm_quick_subset_survives_restore_fork_and_recovery() {
    let suite = Suite::load();
    let c = Containerd::start(Flavor::V2);
    let h = Harness::new(&c, &suite);
    let tests: Vec<_> = QUICK.iter().map(|n| suite.test(n).clone()).collect();
    let modes = [Mode::Restore, Mode::Fork, Mode::Auto];
    let reports = h.run_all(&tests, &modes, 2, &|r| {
        eprintln!("zdtm {} ({:.1}s): {:?}", r.test, r.secs, r.outcomes)
    });
    let mut failures = Vec::new();
    for r in &reports {
        match &r.outcomes[&Mode::Control] {
            Outcome::Fail(why) => {
                failures.push(format!("{} fails in a plain container: {why}", r.test))
            }
            Outcome::Pass => {
                for m in modes {
                    if let Some(Outcome::Fail(why)) = r.outcomes.get(&m) {
                        failures.push(format!("{} [{}]: {why}", r.test, m.name()));
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "ZDTM failures:\n  {}",
        failures.join("\n  ")
    );
}
