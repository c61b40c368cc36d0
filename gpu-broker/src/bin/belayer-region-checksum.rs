//! `belayer-region-checksum FD`: prints the broker's checksum (`gpu_broker::checksum`) of the file
//! open as descriptor FD, from offset 0 to its end, as 16 hex digits. The vLLM plugin
//! (`gpu-broker/vllm-plugin`) runs it on the weights region it filled before `Publish`, so Python
//! never carries a second copy of the hash.

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, RawFd};

use anyhow::{Context, Result, bail};
use gpu_broker::checksum::Hasher;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(fd), None) = (args.next(), args.next()) else {
        bail!("usage: belayer-region-checksum FD");
    };
    let fd: RawFd = fd
        .parse()
        .with_context(|| format!("FD {fd:?} is not a number"))?;
    if fd < 3 {
        bail!("FD {fd} is a standard stream, not a region");
    }
    // The descriptor is inherited from the caller (`subprocess` `pass_fds`) and used only here.
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD)
        .with_context(|| format!("descriptor {fd} is not open"))?;
    // SAFETY: fd was checked open above; this process owns it from here on (nothing else in it
    // refers to that number), and the File closes it once.
    let mut f = unsafe { File::from_raw_fd(fd) };
    let mut h = Hasher::default();
    let mut buf = vec![0u8; 8 << 20];
    let mut filled = 0usize;
    loop {
        let n = f
            .read(&mut buf[filled..])
            .with_context(|| format!("reading descriptor {fd}"))?;
        filled += n;
        // Hasher wants 64-byte multiples until the last chunk.
        if n == 0 || filled == buf.len() {
            let whole = if n == 0 { filled } else { filled - filled % 64 };
            h.update(&buf[..whole]);
            buf.copy_within(whole..filled, 0);
            filled -= whole;
            if n == 0 {
                break;
            }
        }
    }
    println!("{:016x}", h.finish());
    Ok(())
}
