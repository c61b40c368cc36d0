//! The broker binary refuses settings it cannot honour, with a message naming the flag.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn refused(extra: &[&str], flag: &str) {
    let d = Dir::new("cli");
    let mut args = vec!["--socket".to_string(), sock(&d.0).display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut child = Command::new(BROKER)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if std::time::Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("broker started with {extra:?} instead of refusing it");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = std::io::read_to_string(child.stderr.take().unwrap()).unwrap();
    assert!(!status.success(), "{extra:?}");
    assert!(err.contains(flag), "{extra:?}: {err}");
}

#[test]
fn unusable_lease_and_kv_sizes_are_refused() {
    refused(&["--lease-ms", "0"], "--lease-ms 0");
    refused(&["--lease-ms", "4294967296"], "--lease-ms 4294967296");
    refused(&["--kv-mib", "0"], "--kv-mib 0");
    refused(&["--kv-mib", "17592186044416"], "--kv-mib 17592186044416");
}
