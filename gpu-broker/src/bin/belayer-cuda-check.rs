//! `belayer-cuda-check`: the two worker halves of the CUDA backend check, talking to a real
//! `belayer-gpu-broker --backend cuda`.
//!
//! `writer --socket S --gib N`: takes the lease, has the broker allocate N GiB of device memory,
//! imports and maps it, fills it with a pattern, publishes it, then hangs (to be SIGKILLed).
//! `reader --socket S`: maps the published region and checks the pattern; prints one JSON line
//! with the import+map time.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gpu_broker::backend::cuda::{CudaDevice, CudaMapping};
use gpu_broker::client::Client;
use gpu_broker::wire::{RegionKind, Role};

fn pattern(gib: u64) -> u32 {
    0xC0FF_EE00 | (gib as u32 & 0xff)
}

fn writer(socket: &Path, gib: u64) -> Result<()> {
    let dev = CudaDevice::open(0).context("opening the CUDA device")?;
    let c = Client::connect(socket, Role::Primary, 0)?;
    c.acquire(1 << 20, 1)?;
    let r = c.alloc_weights(gib, gib << 30)?;
    let m = CudaMapping::import(&dev, r.fd.as_fd(), r.info.bytes)?;
    m.fill_u32(pattern(gib))?;
    let sum = m.checksum()?;
    c.publish(gib, sum, gib.to_le_bytes().to_vec())?;
    let _hb = c.start_heartbeat(Duration::from_millis(200));
    println!(
        "{}",
        serde_json::json!({ "event": "published", "gib": gib, "bytes": r.info.bytes })
    );
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn reader(socket: &Path) -> Result<()> {
    let dev = CudaDevice::open(0).context("opening the CUDA device")?;
    let c = Client::connect(socket, Role::Observer, 0)?;
    let regions = c.manifest()?;
    let r = regions
        .iter()
        .find(|r| r.info.kind == RegionKind::Weights && r.info.published)
        .context("the broker holds no published weights (refused at the health check?)")?;
    let gib = u64::from_le_bytes(r.info.meta.as_slice().try_into().context("meta")?);
    let t = Instant::now();
    let m = CudaMapping::import_read_only(&dev, r.fd.as_fd(), r.info.bytes)?;
    let import_map_s = t.elapsed().as_secs_f64();
    let want = pattern(gib).to_le_bytes();
    let mut buf = vec![0u8; 1 << 20];
    for off in [0, m.len() / 2, m.len() - buf.len()] {
        m.read(off, &mut buf)?;
        ensure!(
            buf.chunks_exact(4).all(|w| w == want),
            "data at offset {off} is not the writer's pattern"
        );
    }
    let full = m.checksum()? == r.info.checksum;
    println!(
        "{}",
        serde_json::json!({ "event": "verified", "gib": gib, "import_map_s": import_map_s, "intact": full, "read_only": m.read_only() })
    );
    Ok(())
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let cmd = args.next().unwrap_or_default();
    let mut socket = None;
    let mut gib = 1u64;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            "--gib" => gib = args.next().context("--gib")?.parse()?,
            _ => bail!("unknown argument {a}"),
        }
    }
    let socket = socket.context("--socket is required")?;
    match cmd.as_str() {
        "writer" => writer(&socket, gib),
        "reader" => reader(&socket),
        _ => bail!("usage: belayer-cuda-check writer|reader --socket S [--gib N]"),
    }
}
