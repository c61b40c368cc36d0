//! The capture race: a process outside the frozen cgroup swaps a directory of the upper with a
//! symlink to a host directory (`renameat2(RENAME_EXCHANGE)`) in a loop while layers are
//! captured. No byte of the host directory may ever land in a layer; a capture either succeeds
//! with the upper's own content or fails with "changed during capture".

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{mount_fresh, require_root};
use criu_bridge::layer::capture_layer;

const SECRET: &[u8] = b"HOST-SECRET-7f3a9c1e-never-in-a-layer";
const INSIDE: &[u8] = b"inside the upper\n";
const MAX_CAPTURES: u32 = 1000;
const MAX_TIME: Duration = Duration::from_secs(10);

/// Swaps `a` and `b` until `stop` is set; counts the swaps.
fn swapper(a: PathBuf, b: PathBuf, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) {
    let a = CString::new(a.as_os_str().as_bytes()).unwrap();
    let b = CString::new(b.as_os_str().as_bytes()).unwrap();
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: both strings are NUL-terminated and outlive the call; the raw syscall takes
        // no other pointers.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                a.as_ptr(),
                libc::AT_FDCWD,
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
        swaps.fetch_add(1, Ordering::Relaxed);
    }
}

/// Every problem with the layer at `layer`: the secret in a file's data, a symlink target or a
/// name; a host entry name; `d`/`swap` not being the upper's dir and symlink.
fn layer_problems(layer: &Path, outside: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut stack = vec![layer.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().as_bytes();
            if name.starts_with(b"host_") || contains(name, SECRET) {
                problems.push(format!("host entry {} in the layer", p.display()));
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() {
                if contains(&std::fs::read(&p).unwrap(), SECRET) {
                    problems.push(format!("secret bytes in {}", p.display()));
                }
            } else if m.file_type().is_symlink()
                && contains(
                    std::fs::read_link(&p).unwrap().as_os_str().as_bytes(),
                    SECRET,
                )
            {
                problems.push(format!("secret in the target of {}", p.display()));
            }
        }
    }
    // Consistent: one of d/swap is the upper's dir with its one file, the other the symlink.
    let mut dirs = 0;
    for name in ["d", "swap"] {
        let p = layer.join(name);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {
                dirs += 1;
                let names: Vec<_> = std::fs::read_dir(&p)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect();
                if names != ["f"] || std::fs::read(p.join("f")).unwrap() != INSIDE {
                    problems.push(format!("{} is not the upper's dir: {names:?}", p.display()));
                }
            }
            Ok(m) if m.file_type().is_symlink() => {
                if std::fs::read_link(&p).unwrap() != outside {
                    problems.push(format!("{} is not the upper's symlink", p.display()));
                }
            }
            other => problems.push(format!("{}: {other:?}", p.display())),
        }
    }
    if dirs != 1 {
        problems.push(format!("{dirs} dirs among d and swap"));
    }
    problems
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Makes the host dir (the secret under the same name as the upper's file, and more) and, through
/// `view` (the upper itself or the container's merged overlay), `d/f` and the symlink `swap` to
/// the host dir. Returns the host dir.
fn setup(base: &Path, view: &Path) -> PathBuf {
    let outside = base.join("outside");
    std::fs::create_dir_all(outside.join("host_dir")).unwrap();
    std::fs::write(outside.join("f"), SECRET).unwrap();
    std::fs::write(outside.join("host_secret"), SECRET).unwrap();
    std::fs::write(outside.join("host_dir/f"), SECRET).unwrap();
    std::fs::create_dir_all(view.join("d")).unwrap();
    std::fs::write(view.join("d/f"), INSIDE).unwrap();
    std::os::unix::fs::symlink(&outside, view.join("swap")).unwrap();
    outside
}

/// Captures `upper` up to `max` times (`MAX_TIME` at most), every other capture incremental,
/// while a thread exchanges `view`/d and `view`/swap; fails on any host byte in a layer, an
/// inconsistent full layer, or an error other than "changed during capture".
fn race(base: &Path, upper: &Path, view: &Path, outside: &Path, max: u32) {
    let layers = base.join("layers");
    std::fs::create_dir_all(&layers).unwrap();
    let (clean, _) = capture_layer(upper, None, &layers.join("clean")).unwrap();
    assert!(layer_problems(&layers.join("clean"), outside).is_empty());

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let racer = {
        let (a, b) = (view.join("d"), view.join("swap"));
        let (stop, swaps) = (stop.clone(), swaps.clone());
        std::thread::spawn(move || swapper(a, b, stop, swaps))
    };

    let start = Instant::now();
    let (mut ok, mut refused, mut bad) = (0u32, 0u32, Vec::new());
    let mut i = 0;
    while i < max && start.elapsed() < MAX_TIME {
        let layer = layers.join(format!("L{i}"));
        let parent = (i % 2 == 1).then_some(&clean);
        match capture_layer(upper, parent, &layer) {
            Ok(_) => {
                ok += 1;
                // An incremental layer holds only what changed: check it for host bytes.
                bad.extend(
                    layer_problems(&layer, outside)
                        .into_iter()
                        .filter(|p| parent.is_none() || p.contains("host") || p.contains("secret")),
                );
            }
            Err(e) => {
                let chain = std::iter::successors(
                    Some(&e as &dyn std::error::Error),
                    |e: &&dyn std::error::Error| e.source(),
                )
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(": ");
                if chain.contains("changed during capture") {
                    refused += 1;
                } else {
                    bad.push(format!("capture {i} failed with another error: {chain}"));
                }
                // A refused capture may leave a partial layer: it must hold no host byte either.
                if layer.exists() {
                    bad.extend(
                        layer_problems(&layer, outside)
                            .into_iter()
                            .filter(|p| p.contains("host") || p.contains("secret")),
                    );
                }
            }
        }
        if layer.exists() {
            std::fs::remove_dir_all(&layer).unwrap();
        }
        i += 1;
    }
    stop.store(true, Ordering::Relaxed);
    racer.join().unwrap();
    let swaps = swaps.load(Ordering::Relaxed);
    eprintln!(
        "capture race through {}: {i} captures in {:?}: {ok} succeeded, {refused} refused as changed during capture, {swaps} swaps",
        view.display(),
        start.elapsed()
    );
    let problems = bad.len();
    bad.truncate(20);
    assert!(bad.is_empty(), "{problems} problems:\n{}", bad.join("\n"));
    assert!(swaps > 0, "the racer never swapped");
}

#[test]
fn swapping_a_dir_for_a_symlink_never_puts_host_bytes_in_a_layer() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let upper = tmp.path().join("upper");
    let outside = setup(tmp.path(), &upper);
    race(tmp.path(), &upper, &upper, &outside, MAX_CAPTURES);
}

/// The same race as a pod sibling runs it: through the container's merged overlay view.
#[test]
fn swapping_through_the_overlay_never_puts_host_bytes_in_a_layer() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let lower = tmp.path().join("lower");
    std::fs::create_dir_all(&lower).unwrap();
    let (_guard, upper, merged) = mount_fresh(tmp.path(), "c", &[lower]);
    let outside = setup(tmp.path(), &merged);
    race(tmp.path(), &upper, &merged, &outside, MAX_CAPTURES / 2);
}
