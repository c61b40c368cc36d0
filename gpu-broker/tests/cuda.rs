//! CUDA VMM backend checks (feature `cuda`). The GPU tests are `#[ignore]`d: run them on an
//! NVIDIA machine with `gpu-broker/gpu-check.sh` (or `--include-ignored`). The no-driver test
//! runs everywhere.
#![cfg(feature = "cuda")]

mod common;

use std::time::Duration;

use common::*;
use gpu_broker::backend::Backend;
use gpu_broker::backend::BackendError;
use gpu_broker::backend::cuda::{CudaBackend, CudaDevice, CudaMapping, driver_present};

const CHECK: &str = env!("CARGO_BIN_EXE_belayer-cuda-check");

#[test]
fn missing_driver_is_an_error_not_a_panic() {
    if driver_present() {
        eprintln!("libcuda is present here; the no-driver path is not exercised");
        return;
    }
    assert!(matches!(CudaBackend::new(0), Err(BackendError::NoDriver)));
    assert!(matches!(CudaDevice::open(0), Err(BackendError::NoDriver)));
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn export_import_map_in_process() {
    let b = CudaBackend::new(0).unwrap();
    b.probe().unwrap();
    let r = b.create("t", 64 << 20).unwrap();
    let dev = CudaDevice::open(0).unwrap();
    let m = CudaMapping::import(&dev, r.handle(), r.bytes()).unwrap();
    m.fill_u32(0x1234_5678).unwrap();
    let mut buf = vec![0u8; 4096];
    m.read(m.len() - 4096, &mut buf).unwrap();
    assert!(
        buf.chunks_exact(4)
            .all(|w| w == 0x1234_5678u32.to_le_bytes())
    );
    assert_eq!(r.checksum().unwrap(), m.checksum().unwrap());
    assert!(r.integrity().unwrap().intact);
    // Read-only where the driver allows it: the content reads the same, writes are refused.
    let ro = CudaMapping::import_read_only(&dev, r.handle(), r.bytes()).unwrap();
    eprintln!("cuda: read-only device mapping: {}", ro.read_only());
    assert_eq!(ro.checksum().unwrap(), m.checksum().unwrap());
    if ro.read_only() {
        assert!(ro.fill_u32(0).is_err());
    }
}

/// For each size: a writer process fills broker-owned device memory and is SIGKILLed; the broker
/// keeps the allocation, passes its health checks, and a new process imports, maps and verifies it.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn data_survives_a_sigkilled_worker_and_import_map_is_timed() {
    let sizes: Vec<u64> = std::env::var("BELAYER_CUDA_GIB")
        .unwrap_or_else(|_| "1,2,4,8,10".into())
        .split(',')
        .map(|s| s.trim().parse().unwrap())
        .collect();
    for gib in sizes {
        let d = Dir::new("cuda");
        let _b = broker(&d.0, &["--backend", "cuda", "--kv-mib", "64"]);
        let s = sock(&d.0).display().to_string();
        let mut w = Proc::spawn(
            CHECK,
            &[
                "writer".into(),
                "--socket".into(),
                s.clone(),
                "--gib".into(),
                gib.to_string(),
            ],
            d.0.join("writer.err"),
        );
        w.wait_event("published", Duration::from_secs(120));
        let epoch = status(&d.0).epoch;
        w.signal(libc::SIGKILL);
        // The broker confirms the death, runs its health checks (checksum included: device
        // memory cannot be write-sealed) and fences the epoch.
        let end = std::time::Instant::now() + Duration::from_secs(120);
        while status(&d.0).epoch == epoch {
            assert!(
                std::time::Instant::now() < end,
                "broker did not fence the dead writer"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let st = status(&d.0);
        assert_eq!(st.weights_refused, 0, "intact device memory was refused");
        let mut r = Proc::spawn(
            CHECK,
            &["reader".into(), "--socket".into(), s],
            d.0.join("reader.err"),
        );
        let v = r.wait_event("verified", Duration::from_secs(120));
        assert_eq!(v["intact"], true, "{v}");
        eprintln!(
            "cuda: {gib} GiB kept across SIGKILL; import+map {:.4}s (read-only: {}); health check {} us",
            v["import_map_s"].as_f64().unwrap(),
            v["read_only"],
            st.last_health_us
        );
        assert_eq!(
            r.wait_exit(Duration::from_secs(60)),
            0,
            "{}",
            r.stderr_text()
        );
    }
}
