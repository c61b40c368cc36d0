//! A process's standard streams: containerd hands the shim FIFO paths; the shim gives the process
//! pipes (or a terminal) and copies between the two, so that it can close stdin on request and
//! knows when all output has been delivered.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::error::{Error, Result, io};

/// Standard streams for the process runc starts (the container's init or an exec): given to runc,
/// which hands them to the process. `None` is `/dev/null`.
#[derive(Default)]
pub struct ProcessStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Where containerd wants a process's streams to go.
#[derive(Clone, Debug, Default)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// The shim's side of a running process's streams.
#[derive(Default)]
pub struct ProcessIo {
    /// Writes to the process's stdin; taken (closed) by `close_stdin`.
    stdin: Arc<Mutex<Option<File>>>,
    /// The terminal's master side, for resizing.
    console: Option<Arc<File>>,
    /// One receiver per output copier; each gets the copier's destination back when its
    /// stream hit EOF.
    drained: Vec<oneshot::Receiver<File>>,
}

/// A directory with a random name (`mkdtemp`: mode 0700, whatever the umask) in `$TMPDIR` (else
/// `/tmp`), removed with its content on drop: what the shim puts in a shared directory (runc's
/// console socket, its log) has no name another user can predict, create first or reach.
pub struct PrivateDir(PathBuf);

impl PrivateDir {
    /// Creates `$TMPDIR/<prefix>-XXXXXX`.
    pub fn new(prefix: &str) -> Result<Self> {
        let template = std::env::temp_dir().join(format!("{prefix}-XXXXXX"));
        nix::unistd::mkdtemp(&template)
            .map(Self)
            .map_err(|e| io(format!("create a private directory {}", template.display()))(e.into()))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A listening socket on which runc sends the terminal's master fd (`--console-socket`), in a
/// private directory of its own: no other user can connect to it and hand the shim a terminal
/// of theirs, or squat its name.
pub struct ConsoleSocket {
    pub path: PathBuf,
    listener: UnixListener,
    /// Removes the socket with its directory on drop.
    _dir: PrivateDir,
}

impl ConsoleSocket {
    pub fn new() -> Result<Self> {
        let dir = PrivateDir::new("belayer-pty")?;
        let path = dir.path().join("console.sock");
        let listener = UnixListener::bind(&path).map_err(io("bind console socket"))?;
        Ok(Self {
            path,
            listener,
            _dir: dir,
        })
    }

    /// Receives the master fd runc sent. Call after runc returned successfully.
    fn receive(&self) -> Result<File> {
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
        self.listener
            .set_nonblocking(true)
            .map_err(io("console socket"))?;
        let mut tries = 0;
        let stream = loop {
            match self.listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && tries < 100 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io("accept on console socket")(e)),
            }
        };
        stream
            .set_nonblocking(false)
            .map_err(io("console socket"))?;
        let mut name = [0u8; 4096];
        let mut iov = [std::io::IoSliceMut::new(&mut name)];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::empty(),
        )
        .map_err(|e| io("receive terminal from runc")(e.into()))?;
        for cmsg in msg
            .cmsgs()
            .map_err(|e| io("receive terminal from runc")(e.into()))?
        {
            if let ControlMessageOwned::ScmRights(fds) = cmsg
                && let Some(&fd) = fds.first()
            {
                // SAFETY: the kernel just installed `fd` in our table for this message; nothing
                // else owns it.
                return Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
        }
        Err(Error::FailedPrecondition(
            "runc sent no terminal on the console socket".into(),
        ))
    }
}

fn pipe() -> Result<(File, File)> {
    let (r, w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io("pipe")(e.into()))?;
    Ok((File::from(r), File::from(w)))
}

/// Opens an output destination: a FIFO read+write (never blocks, never EPIPE; containerd holds
/// the read side), or a regular file for appending.
/// The shim's `/dev/null`, where output nobody asked for goes.
fn discard() -> Result<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/null")
        .map_err(io("open /dev/null"))
}

fn open_output(path: &str) -> Result<File> {
    let path = path.strip_prefix("file://").unwrap_or(path);
    if path.starts_with("binary://") {
        return Err(Error::Unimplemented(
            "binary:// logging URIs are not supported".into(),
        ));
    }
    let is_fifo = std::fs::metadata(path)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false);
    let mut opts = OpenOptions::new();
    if is_fifo {
        opts.read(true).write(true);
    } else {
        opts.append(true).create(true);
    }
    opts.custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(io(format!("open output {path}")))
}

/// Copies `from` into `to` on a thread of its own until EOF, then hands `to` back through the
/// receiver instead of closing it: whoever holds the receiver decides when containerd's stream
/// ends. A restore replacing the process opens the stream again before the old destination
/// goes, so a reader (ctr, dockerd's log) never sees EOF in between.
fn spawn_copy(mut from: File, mut to: File) -> oneshot::Receiver<File> {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // EIO: the terminal's slave side is gone.
                Err(_) => break,
            }
        }
        let _ = tx.send(to);
    });
    rx
}

/// Copies containerd's stdin FIFO into `sink` until EOF or until `sink` is taken away (the
/// process exited, or containerd asked to close stdin).
///
/// The FIFO is opened non-blocking and polled: a blocking open would wait forever for a writer
/// that never comes (a client that closed its side before the shim opened). Linux reports POLLHUP
/// on a FIFO only once a writer has come and gone, so polling waits for the first writer.
fn spawn_stdin(path: String, sink: Arc<Mutex<Option<File>>>) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let taken =
        |sink: &Arc<Mutex<Option<File>>>| sink.lock().unwrap_or_else(|e| e.into_inner()).is_none();
    std::thread::spawn(move || {
        let Ok(mut fifo) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
        else {
            return;
        };
        let mut buf = vec![0u8; 32 * 1024];
        while !taken(&sink) {
            let mut fds = [PollFd::new(fifo.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(200u16)) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
            let n = match fifo.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            let mut guard = sink.lock().unwrap_or_else(|e| e.into_inner());
            let written = guard.as_mut().map(|w| w.write_all(&buf[..n]).is_ok());
            if written != Some(true) {
                return;
            }
        }
        // EOF from containerd: the process sees EOF too.
        sink.lock().unwrap_or_else(|e| e.into_inner()).take();
    });
}

/// A process's streams while runc starts or restores it: pipes whose copiers already run, or
/// the socket runc sends the terminal's master on.
pub enum PendingIo {
    Pipes(ProcessIo),
    Terminal(ConsoleSocket),
}

impl PendingIo {
    /// The fds runc hands the process (none for a terminal) and what to finish once runc is done.
    pub fn new(paths: &StdioPaths) -> Result<(ProcessStdio, PendingIo)> {
        if paths.terminal {
            Ok((
                Default::default(),
                PendingIo::Terminal(ConsoleSocket::new()?),
            ))
        } else {
            let (stdio, pio) = ProcessIo::pipes(paths)?;
            Ok((stdio, PendingIo::Pipes(pio)))
        }
    }

    /// runc's `--console-socket`, for a terminal.
    pub fn console_socket(&self) -> Option<&std::path::Path> {
        match self {
            PendingIo::Terminal(socket) => Some(&socket.path),
            PendingIo::Pipes(_) => None,
        }
    }

    /// The running process's streams; call after runc returned successfully.
    pub fn finish(self, paths: &StdioPaths) -> Result<ProcessIo> {
        match self {
            PendingIo::Pipes(pio) => Ok(pio),
            PendingIo::Terminal(socket) => ProcessIo::terminal(paths, &socket),
        }
    }
}

impl ProcessIo {
    /// Pipes for a process without a terminal: returns the ends runc passes to the process and
    /// starts the copiers.
    ///
    /// A stream containerd gives no path for (a fork, a restore by `belayer restore`) is a pipe
    /// all the same — stdin at end of file, output discarded — not runc's own descriptors: those
    /// are the node's `/dev/null`, on a mount the container's mount namespace does not have, and
    /// CRIU refuses to dump a process holding one ("Can't lookup mount ... path=/dev/null"), so
    /// such a container could never be checkpointed.
    fn pipes(paths: &StdioPaths) -> Result<(ProcessStdio, ProcessIo)> {
        let mut stdio = ProcessStdio::default();
        let mut pio = ProcessIo::default();
        let (r, w) = pipe()?;
        stdio.stdin = Some(OwnedFd::from(r));
        if paths.stdin.is_empty() {
            drop(w);
        } else {
            *pio.stdin.lock().unwrap_or_else(|e| e.into_inner()) = Some(w);
            spawn_stdin(paths.stdin.clone(), pio.stdin.clone());
        }
        for (path, slot) in [
            (&paths.stdout, &mut stdio.stdout),
            (&paths.stderr, &mut stdio.stderr),
        ] {
            let out = match path.as_str() {
                "" => discard()?,
                path => open_output(path)?,
            };
            let (r, w) = pipe()?;
            *slot = Some(OwnedFd::from(w));
            pio.drained.push(spawn_copy(r, out));
        }
        Ok((stdio, pio))
    }

    /// A process with a terminal: receives its master from runc and starts the copiers.
    fn terminal(paths: &StdioPaths, socket: &ConsoleSocket) -> Result<ProcessIo> {
        let master = socket.receive()?;
        let mut pio = ProcessIo::default();
        // Without a reader the pty's buffer fills and the process blocks on its next write: a
        // task created without stdio (a fork) has its terminal output discarded instead.
        let out = match paths.stdout.as_str() {
            "" => discard()?,
            path => open_output(path)?,
        };
        let reader = master.try_clone().map_err(io("dup terminal"))?;
        pio.drained.push(spawn_copy(reader, out));
        if !paths.stdin.is_empty() {
            let writer = master.try_clone().map_err(io("dup terminal"))?;
            *pio.stdin.lock().unwrap_or_else(|e| e.into_inner()) = Some(writer);
            spawn_stdin(paths.stdin.clone(), pio.stdin.clone());
        }
        pio.console = Some(Arc::new(master));
        Ok(pio)
    }

    /// Closes the process's stdin (containerd's CloseIO).
    pub fn close_stdin(&self) {
        self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Sets the terminal size.
    pub fn resize(&self, width: u32, height: u32) -> Result<()> {
        let Some(console) = &self.console else {
            return Err(Error::FailedPrecondition("process has no terminal".into()));
        };
        let ws = libc::winsize {
            ws_row: height as u16,
            ws_col: width as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one `winsize` from the pointer, which outlives the call.
        let rc = unsafe { libc::ioctl(console.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc != 0 {
            return Err(io("resize terminal")(std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Waits until every output stream has been delivered, at most `limit`, and returns the
    /// destinations still open: containerd's streams end when the caller drops them. Output
    /// held open by a process that outlives this one (a daemonized grandchild) is not waited
    /// for past `limit`; its stream ends when that copier does.
    pub async fn drained(&mut self, limit: Duration) -> Vec<File> {
        let rxs = std::mem::take(&mut self.drained);
        let mut outputs = Vec::with_capacity(rxs.len());
        let all = async {
            for rx in rxs {
                if let Ok(out) = rx.await {
                    outputs.push(out);
                }
            }
        };
        let _ = tokio::time::timeout(limit, all).await;
        // A terminal master is closed now so a stuck copier cannot keep the pty alive.
        self.close_stdin();
        outputs
    }
}

impl Drop for ProcessIo {
    /// The process is gone or never started: stop feeding its stdin.
    fn drop(&mut self) {
        self.close_stdin();
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn console_sockets_live_in_private_directories_with_random_names() {
        let (a, b) = (ConsoleSocket::new().unwrap(), ConsoleSocket::new().unwrap());
        let dir = a.path.parent().unwrap().to_path_buf();
        assert_ne!(dir, b.path.parent().unwrap());
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert!(
            !name.contains(&std::process::id().to_string()),
            "{name} names the shim's pid"
        );
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
        assert!(
            std::fs::symlink_metadata(&a.path)
                .unwrap()
                .file_type()
                .is_socket()
        );
        drop(a);
        assert!(!dir.exists(), "{} left behind", dir.display());
    }
}
