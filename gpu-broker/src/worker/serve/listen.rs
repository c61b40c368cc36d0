//! The serving socket: bound at a temporary name and renamed over the fixed path, so clients
//! always find either the dead primary's socket (connect refused: retry) or the live one; and one
//! reader thread per connection that forwards parsed requests to the engine thread.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::mpsc::Sender;

use super::protocol::{GenReply, GenRequest};

/// A request and the connection that waits for its reply.
pub(super) struct Incoming {
    pub req: GenRequest,
    pub conn: UnixStream,
}

/// Binds `path` atomically: binds in a fresh private directory beside it (`mkdtemp`: random
/// name, mode 0700), then renames over it. No temporary name in the socket's directory that
/// another user could predict and take first.
pub(super) fn bind(path: &Path) -> std::io::Result<UnixListener> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let staging = nix::unistd::mkdtemp(&dir.join(".belayer-serve-XXXXXX"))?;
    let tmp = staging.join("s");
    let bound = UnixListener::bind(&tmp).and_then(|l| std::fs::rename(&tmp, path).map(|()| l));
    let _ = std::fs::remove_dir_all(&staging);
    bound
}

/// Writes one reply line; a client that went away is not an error of the server.
pub(super) fn reply(conn: &mut UnixStream, r: &GenReply) {
    let mut line = serde_json::to_string(r).unwrap_or_default();
    line.push('\n');
    let _ = conn.write_all(line.as_bytes());
}

/// Accepts connections forever, one reader thread each.
pub(super) fn accept_loop(l: UnixListener, tx: Sender<Incoming>, epoch: u64) {
    for conn in l.incoming().map_while(Result::ok) {
        let tx = tx.clone();
        std::thread::spawn(move || read_conn(conn, &tx, epoch));
    }
}

fn read_conn(conn: UnixStream, tx: &Sender<Incoming>, epoch: u64) {
    let Ok(reader) = conn.try_clone() else { return };
    for line in BufReader::new(reader).lines().map_while(Result::ok) {
        if line.trim().is_empty() {
            continue;
        }
        let Ok(mut out) = conn.try_clone() else {
            return;
        };
        match serde_json::from_str::<GenRequest>(&line) {
            Ok(req) => {
                if tx.send(Incoming { req, conn: out }).is_err() {
                    return;
                }
            }
            Err(e) => reply(
                &mut out,
                &GenReply {
                    id: 0,
                    tokens: Vec::new(),
                    error: Some(format!("malformed request: {e}")),
                    worker_pid: std::process::id(),
                    epoch,
                    from_log: false,
                },
            ),
        }
    }
}
