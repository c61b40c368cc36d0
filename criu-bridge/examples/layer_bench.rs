//! Measures layer capture time against the size of the changes, and the restore mount time
//! against the size of the layer chain (it should stay flat).
//!
//! `cargo run --release -p criu-bridge --example layer_bench [DIR]` (root; DIR defaults to a
//! temp dir on the disk of /var/tmp). Prints one JSON object per measurement.
//! `LAYER_BENCH_CASES=0,5` runs only those cases.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use criu_bridge::layer::{capture_layer, mount_chain, unmount};

fn sh(dir: &Path, script: &str) {
    let ok = Command::new("bash")
        .arg("-euc")
        .arg(script)
        .current_dir(dir)
        .status()
        .expect("bash")
        .success();
    assert!(ok, "step failed: {script}");
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = unmount(&self.0);
    }
}

fn main() {
    let base = std::env::args().nth(1).map(PathBuf::from);
    let tmp = tempfile::tempdir_in(base.unwrap_or_else(|| "/var/tmp".into())).expect("temp dir");
    let base = tmp.path();
    let lower = base.join("lower");
    std::fs::create_dir_all(&lower).unwrap();
    sh(
        &lower,
        "mkdir -p usr/lib; for i in $(seq 1 2000); do echo $i > usr/lib/f$i; done",
    );
    // (files, bytes per file): 1 MiB .. 1 GiB of changes, and many small files.
    let cases: &[(usize, usize)] = &[
        (16, 64 << 10),
        (64, 1 << 20),
        (160, 1 << 20),
        (256, 4 << 20),
        (1024, 1 << 20),
        (10_000, 4 << 10),
        (4, 256 << 20),
    ];
    let only: Option<Vec<usize>> = std::env::var("LAYER_BENCH_CASES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect());
    for (i, &(files, size)) in cases.iter().enumerate() {
        if only.as_ref().is_some_and(|o| !o.contains(&i)) {
            continue;
        }
        let up = base.join(format!("u{i}"));
        let merged = base.join(format!("m{i}"));
        mount_chain(
            std::slice::from_ref(&lower),
            &up,
            &base.join(format!("w{i}")),
            &merged,
        )
        .unwrap();
        let guard = Unmount(merged.clone());
        sh(
            &merged,
            &format!(
                "mkdir -p data; for j in $(seq 1 {files}); do head -c {size} /dev/urandom > data/f$j; done; \
                 rm usr/lib/f1; sync"
            ),
        );
        let layer = base.join(format!("L{i}"));
        let start = Instant::now();
        let (_, stats) = capture_layer(&up, None, &layer).unwrap();
        let capture_s = start.elapsed().as_secs_f64();
        drop(guard);
        // Restore mount over the captured layer with an empty upper.
        let target = base.join(format!("r{i}"));
        let start = Instant::now();
        mount_chain(
            &[layer.clone(), lower.clone()],
            &base.join(format!("ru{i}")),
            &base.join(format!("rw{i}")),
            &target,
        )
        .unwrap();
        let mount_s = start.elapsed().as_secs_f64();
        let _g = Unmount(target);
        println!(
            "{{\"files\":{files},\"bytes\":{},\"capture_s\":{capture_s:.4},\"capture_mb_s\":{:.0},\"restore_mount_s\":{mount_s:.5}}}",
            stats.bytes_written,
            stats.bytes_written as f64 / 1e6 / capture_s
        );
    }
}
