//! The network lock a CRIU dump leaves behind when CRIU dies in the middle of it.
//!
//! To dump TCP connections consistently CRIU blocks the container's network for the dump. With
//! the nftables lock (Belayer's default where it works) that is a table `inet CRIU-<run id>` in
//! the container's network namespace: an input and an output chain that drop every packet, or,
//! in a namespace CRIU does not own, the dumped connections. CRIU deletes the table when the
//! dump ends, failed or not — unless it is killed first (the OOM killer, say). Then the table
//! stays, and the container, thawed and running on, can no longer reach anything, not even
//! itself on 127.0.0.1.
//!
//! The run id is a fresh UUID that runc's `criu swrk` never logs, so the table cannot be named
//! beforehand: [`criu_tables`] lists the CRIU tables before the dump, and after a failed one
//! [`release_left`] deletes those that appeared since. This goes through libnftables (the
//! library CRIU's nftables lock uses, so it is there wherever that lock is), loaded on first use,
//! in a thread that enters the container's network namespace.
//!
//! CRIU's iptables lock (a `CRIU` chain) is not undone here.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::{Arc, OnceLock};

/// Why the CRIU lock tables could not be listed or deleted.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NetLockError {
    #[error("cannot load libnftables.so.1")]
    Library,
    #[error("libnftables.so.1 has no {0}")]
    Symbol(String),
    #[error("nft_ctx_new failed")]
    Context,
    #[error("nft {cmd:?}: {message}")]
    Command { cmd: String, message: String },
    #[error("cannot open {path}: {error}")]
    OpenNamespace {
        path: String,
        error: Arc<std::io::Error>,
    },
    #[error("cannot enter {path}: {error}")]
    EnterNamespace {
        path: String,
        error: Arc<std::io::Error>,
    },
    #[error("the nftables thread panicked")]
    Panicked,
}

/// The prefix of CRIU's lock tables (family and name).
const TABLE_PREFIX: &str = "inet CRIU-";

/// libnftables' entry points (libnftables.so.1, API 1).
struct Nft {
    ctx_new: unsafe extern "C" fn(u32) -> *mut c_void,
    ctx_free: unsafe extern "C" fn(*mut c_void),
    buffer_output: unsafe extern "C" fn(*mut c_void) -> c_int,
    buffer_error: unsafe extern "C" fn(*mut c_void) -> c_int,
    output_buffer: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    error_buffer: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    run_cmd: unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int,
}

fn nft() -> Result<&'static Nft, NetLockError> {
    static NFT: OnceLock<Result<Nft, NetLockError>> = OnceLock::new();
    NFT.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Nft, NetLockError> {
    let name = c"libnftables.so.1";
    // SAFETY: dlopen with a valid C string; the handle is kept for the life of the process.
    let lib = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(NetLockError::Library);
    }
    // SAFETY: each type asked of `sym` is the signature libnftables.h declares for that symbol.
    unsafe {
        Ok(Nft {
            ctx_new: sym(lib, c"nft_ctx_new")?,
            ctx_free: sym(lib, c"nft_ctx_free")?,
            buffer_output: sym(lib, c"nft_ctx_buffer_output")?,
            buffer_error: sym(lib, c"nft_ctx_buffer_error")?,
            output_buffer: sym(lib, c"nft_ctx_get_output_buffer")?,
            error_buffer: sym(lib, c"nft_ctx_get_error_buffer")?,
            run_cmd: sym(lib, c"nft_run_cmd_from_buffer")?,
        })
    }
}

/// Symbol `name` of `lib` as a function pointer of type `F`.
///
/// # Safety
/// `F` must be an `extern "C" fn` type matching the symbol's C declaration.
unsafe fn sym<F: Copy>(lib: *mut c_void, name: &CStr) -> Result<F, NetLockError> {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: dlsym on a live handle with a valid C string.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(NetLockError::Symbol(name.to_string_lossy().into_owned()));
    }
    // SAFETY: F is a function pointer of the same size as p (checked above), and the caller
    // vouches for its signature.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// One nftables context, freed on drop.
struct Ctx<'a> {
    nft: &'a Nft,
    ctx: *mut c_void,
}

impl<'a> Ctx<'a> {
    fn new(nft: &'a Nft) -> Result<Self, NetLockError> {
        // SAFETY: nft_ctx_new(NFT_CTX_DEFAULT) has no preconditions.
        let ctx = unsafe { (nft.ctx_new)(0) };
        if ctx.is_null() {
            return Err(NetLockError::Context);
        }
        // SAFETY: ctx is live; buffering keeps output and errors off the shim's stdio.
        unsafe {
            (nft.buffer_output)(ctx);
            (nft.buffer_error)(ctx);
        }
        Ok(Self { nft, ctx })
    }

    /// Runs `cmd`; its output, or its error text.
    fn run(&self, cmd: &str) -> Result<String, NetLockError> {
        let failed = |message: String| NetLockError::Command {
            cmd: cmd.to_string(),
            message,
        };
        let c = CString::new(cmd).map_err(|e| failed(e.to_string()))?;
        // SAFETY: ctx is live and c a valid C string; the buffers returned stay valid until the
        // next command on ctx, and are copied out at once.
        unsafe {
            let rc = (self.nft.run_cmd)(self.ctx, c.as_ptr());
            let take = |p: *const c_char| match p.is_null() {
                true => String::new(),
                false => CStr::from_ptr(p).to_string_lossy().into_owned(),
            };
            match rc {
                0 => Ok(take((self.nft.output_buffer)(self.ctx))),
                _ => Err(failed(
                    take((self.nft.error_buffer)(self.ctx)).trim().to_string(),
                )),
            }
        }
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        // SAFETY: ctx is live and freed once.
        unsafe { (self.nft.ctx_free)(self.ctx) }
    }
}

/// Runs `f` with an nftables context in the network namespace of process `pid`.
fn in_netns<T: Send>(
    pid: i32,
    f: impl FnOnce(&Ctx<'_>) -> Result<T, NetLockError> + Send,
) -> Result<T, NetLockError> {
    let nft = nft()?;
    let path = format!("/proc/{pid}/ns/net");
    let ns = File::open(&path).map_err(|e| NetLockError::OpenNamespace {
        path: path.clone(),
        error: Arc::new(e),
    })?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a namespace fd we hold; it moves only this thread, which ends
            // when `f` returns.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(NetLockError::EnterNamespace {
                    path: path.clone(),
                    error: Arc::new(std::io::Error::last_os_error()),
                });
            }
            f(&Ctx::new(nft)?)
        })
        .join()
        .unwrap_or_else(|_| Err(NetLockError::Panicked))
    })
}

/// The CRIU lock tables (`inet CRIU-…`) in `list tables` output.
fn parse_tables(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("table "))
        .filter(|t| t.starts_with(TABLE_PREFIX))
        .map(str::to_string)
        .collect()
}

/// The CRIU lock tables now in the network namespace of process `pid`.
pub fn criu_tables(pid: i32) -> Result<Vec<String>, NetLockError> {
    in_netns(pid, |ctx| Ok(parse_tables(&ctx.run("list tables")?)))
}

/// Deletes the CRIU lock tables in the network namespace of `pid` that are not in `before`
/// (what [`criu_tables`] listed before the dump): those a dead CRIU left. Returns them. Nothing
/// to do when `pid` is gone (a container that died in the dump): its own namespace went with
/// it, and in a shared one CRIU's table drops only the dead container's connections.
pub fn release_left(pid: i32, before: &[String]) -> Result<Vec<String>, NetLockError> {
    if crate::blocked::is_dead(pid) {
        return Ok(Vec::new());
    }
    in_netns(pid, |ctx| {
        let left: Vec<String> = parse_tables(&ctx.run("list tables")?)
            .into_iter()
            .filter(|t| !before.contains(t))
            .collect();
        for t in &left {
            ctx.run(&format!("delete table {t}"))?;
        }
        Ok(left)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_criu_tables_are_taken() {
        let listing = "table inet filter\ntable inet CRIU-7d3c-11\ntable ip nat\n\
                       table ip CRIU-x\ntable inet CRIU-ab\n";
        assert_eq!(parse_tables(listing), ["inet CRIU-7d3c-11", "inet CRIU-ab"]);
        assert!(parse_tables("").is_empty());
    }
}
