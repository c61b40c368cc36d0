//! One reaper for every child: the shim framework reaps on SIGCHLD and publishes each exit on its
//! monitor; this module routes those exits to whoever waits for that pid.
//!
//! Exits can arrive before anyone asks for them (a `runc exec` child may exit before the pid file
//! is read), so an unclaimed exit is kept until claimed or until it is too old to matter.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use containerd_shim::asynchronous::monitor::monitor_subscribe;
use containerd_shim::monitor::{Subject, Topic};
use tokio::sync::oneshot;

/// How long an exit nobody has claimed is kept.
const UNCLAIMED_TTL: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Exits {
    waiters: HashMap<i32, oneshot::Sender<i32>>,
    unclaimed: HashMap<i32, (i32, Instant)>,
}

static EXITS: LazyLock<Mutex<Exits>> = LazyLock::new(Default::default);

/// Starts routing exits from the shim's monitor. Call once, before the first child is spawned.
pub async fn start() -> containerd_shim::Result<()> {
    let mut sub = monitor_subscribe(Topic::Pid).await?;
    tokio::spawn(async move {
        while let Some(exit) = sub.rx.recv().await {
            if let Subject::Pid(pid) = exit.subject {
                deliver(pid, exit.exit_code);
            }
        }
    });
    Ok(())
}

fn deliver(pid: i32, code: i32) {
    let mut exits = EXITS.lock().unwrap_or_else(|e| e.into_inner());
    match exits.waiters.remove(&pid) {
        Some(tx) => {
            let _ = tx.send(code);
        }
        None => {
            let now = Instant::now();
            exits
                .unclaimed
                .retain(|_, (_, at)| now.duration_since(*at) < UNCLAIMED_TTL);
            exits.unclaimed.insert(pid, (code, now));
        }
    }
}

/// Returns a receiver for `pid`'s exit code (`128 + n` for signal `n`). Resolves at once if the
/// exit was already reaped.
pub fn watch(pid: i32) -> oneshot::Receiver<i32> {
    let (tx, rx) = oneshot::channel();
    let mut exits = EXITS.lock().unwrap_or_else(|e| e.into_inner());
    match exits.unclaimed.remove(&pid) {
        Some((code, _)) => {
            let _ = tx.send(code);
        }
        None => {
            exits.waiters.insert(pid, tx);
        }
    }
    rx
}

/// Runs criu-bridge's runc invocations through this reaper (see [`criu_bridge::runc::Spawner`]).
/// Blocking: call it from a blocking thread.
pub struct ReaperSpawner;

impl criu_bridge::runc::Spawner for ReaperSpawner {
    fn output(&self, mut cmd: std::process::Command) -> std::io::Result<std::process::Output> {
        use std::io::Read;
        use std::os::unix::process::ExitStatusExt;
        let mut child = cmd.spawn()?;
        let exit = watch(child.id() as i32);
        drop(cmd);
        let read = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = read(
            child
                .stdout
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        );
        let err = read(
            child
                .stderr
                .take()
                .map(|r| Box::new(r) as Box<dyn Read + Send>),
        );
        let code = exit.blocking_recv().unwrap_or(255);
        Ok(std::process::Output {
            status: std::process::ExitStatus::from_raw((code & 0xff) << 8),
            stdout: out.join().unwrap_or_default(),
            stderr: err.join().unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn exit_before_watch_is_kept() {
        deliver(999_001, 3);
        assert_eq!(watch(999_001).await.unwrap(), 3);
    }

    #[tokio::test]
    async fn exit_after_watch_is_delivered() {
        let rx = watch(999_002);
        deliver(999_002, 137);
        assert_eq!(rx.await.unwrap(), 137);
    }
}
