//! `belayer-gpu-broker`: the broker daemon (a thin adapter over `gpu_broker::broker`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use gpu_broker::broker::{Access, Broker, ChecksumPolicy, Config, serve};
use nix::unistd::{Group, User};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_term(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

const USAGE: &str = "usage: belayer-gpu-broker --socket PATH [--backend host|cuda] [--lease-ms N] \
[--kv-mib N] [--no-seal-weights] [--checksum always|unsealed] [--keep-finished N] \
[--keep-finished-tokens N] [--allow-uid UID]... [--operator-uid UID]... [--socket-group GROUP] \
[--max-peers N] [--kv-adopt-ms N]

  --allow-uid UID           a uid (or user name) that may connect, besides root and the broker's
                            own uid (checked with SO_PEERCRED); repeatable
  --operator-uid UID        a uid that may connect as an operator (fence), besides root and the
                            broker's own uid; repeatable (it is allowed to connect too)
  --socket-group GROUP      create the socket 0660 owned by this group (name or gid) instead of
                            0600; its members still need --allow-uid
  --max-peers N             connections served at once (default 256); more are refused
  --kv-adopt-ms N           how long a dead primary's KV pages stay out of the pool for its
                            successor to adopt checksummed blocks from (default 60000; 0: never
                            kept, every takeover rebuilds its KV by prefill)
  --keep-finished N         finished requests the token log keeps for resends (default and
                            most 2048)
  --keep-finished-tokens N  their prompt + generated tokens at most (default 67108864)";

/// A user or group id given as a number or a name (`what`: "user" or "group").
fn id(s: &str, what: &str, lookup: impl FnOnce(&str) -> nix::Result<Option<u32>>) -> Result<u32> {
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    lookup(s)
        .with_context(|| format!("looking up {what} {s}"))?
        .with_context(|| format!("no {what} named {s}"))
}

fn uid(s: &str) -> Result<u32> {
    id(s, "user", |n| {
        User::from_name(n).map(|u| u.map(|u| u.uid.as_raw()))
    })
}

fn gid(s: &str) -> Result<u32> {
    id(s, "group", |n| {
        Group::from_name(n).map(|g| g.map(|g| g.gid.as_raw()))
    })
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BELAYER_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut socket = None;
    let mut backend = String::from("host");
    let mut lease_ms = 10_000u64;
    let mut kv_mib = 2048u64;
    let mut kv_adopt_ms = 60_000u64;
    let mut seal = true;
    let mut checksum = ChecksumPolicy::Unsealed;
    let mut retention = gpu_broker::broker::log::Retention::default();
    let mut access = Access::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || {
            args.next()
                .with_context(|| format!("{a} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            "--socket" => socket = Some(PathBuf::from(val()?)),
            "--backend" => backend = val()?,
            "--lease-ms" => lease_ms = val()?.parse().context("--lease-ms")?,
            "--kv-mib" => kv_mib = val()?.parse().context("--kv-mib")?,
            "--kv-adopt-ms" => kv_adopt_ms = val()?.parse().context("--kv-adopt-ms")?,
            "--no-seal-weights" => seal = false,
            "--allow-uid" => access.uids.push(uid(&val()?)?),
            "--operator-uid" => {
                let u = uid(&val()?)?;
                access.uids.push(u);
                access.operator_uids.push(u);
            }
            "--socket-group" => access.group = Some(gid(&val()?)?),
            "--max-peers" => {
                access.max_peers = val()?.parse().context("--max-peers")?;
                if access.max_peers == 0 {
                    bail!("--max-peers 0: expected at least 1");
                }
            }
            "--keep-finished" => retention.requests = val()?.parse().context("--keep-finished")?,
            "--keep-finished-tokens" => {
                retention.tokens = val()?.parse().context("--keep-finished-tokens")?
            }
            "--checksum" => {
                checksum = match val()?.as_str() {
                    "always" => ChecksumPolicy::Always,
                    "unsealed" => ChecksumPolicy::Unsealed,
                    v => bail!("--checksum {v}: expected always or unsealed"),
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ => bail!("unknown argument {a}\n{USAGE}"),
        }
    }
    let socket = socket.context(USAGE)?;
    // The grant carries the lease in u32 milliseconds.
    if lease_ms == 0 || lease_ms > u64::from(u32::MAX) {
        bail!(
            "--lease-ms {lease_ms}: expected 1 to {} (a zero lease fences every primary at once)",
            u32::MAX
        );
    }
    let Some(kv_bytes) = kv_mib.checked_mul(1 << 20).filter(|&b| b > 0) else {
        bail!("--kv-mib {kv_mib}: expected 1 to {} MiB", u64::MAX >> 20);
    };
    let mut cfg = Config::new(socket);
    cfg.lease = Duration::from_millis(lease_ms);
    cfg.kv_bytes = kv_bytes;
    cfg.seal_weights = seal;
    cfg.checksum = checksum;
    cfg.access = access;
    cfg.kv_adopt_keep = Duration::from_millis(kv_adopt_ms);
    if retention.requests > gpu_broker::broker::log::MAX_KEPT_FINISHED {
        bail!(
            "--keep-finished {}: at most {} (the rest of a {}-id log listing is left to requests in flight)",
            retention.requests,
            gpu_broker::broker::log::MAX_KEPT_FINISHED,
            gpu_broker::wire::MAX_LIST
        );
    }
    cfg.log_retention = retention;
    let backend: Box<dyn gpu_broker::backend::Backend> = match backend.as_str() {
        "host" => Box::new(gpu_broker::backend::host::HostBackend),
        #[cfg(feature = "cuda")]
        "cuda" => Box::new(
            gpu_broker::backend::cuda::CudaBackend::new(0)
                .context("initialising the CUDA backend")?,
        ),
        b => bail!("backend {b} is not available in this build"),
    };
    let handler = on_term as extern "C" fn(libc::c_int);
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: installs a handler that only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
    let broker = Broker::new(cfg, backend);
    println!("instance {:016x}", broker.instance());
    serve(broker, &|| STOP.load(Ordering::SeqCst)).context("broker failed")?;
    Ok(())
}
