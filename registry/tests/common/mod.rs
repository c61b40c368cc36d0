//! What the registry tests share: a registry server of their own (the crate's `testing`
//! feature), exports as the shim writes them.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;

use belayer_registry::checkpoint::CHAIN_ARCHIVE;

pub use belayer_registry::testing::{PASSWORD, Registry, USER};

/// The test registry's user and password.
pub fn credentials() -> belayer_registry::auth::Credentials {
    belayer_registry::auth::Credentials {
        username: USER.into(),
        password: PASSWORD.into(),
    }
}

/// An export of checkpoint `seq` of `owner` (`namespace/container`) with `chain` (newest
/// first) as the shim writes one: the
/// newest's CRIU images flat, the chain's dirs (but those images) in the chain archive.
pub fn export(store: &Path, owner: &str, seq: u64, chain: &[u64], dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    let criu = store.join(format!("checkpoints/{owner}/{seq}/criu"));
    for e in std::fs::read_dir(&criu).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dest.join(e.file_name())).unwrap();
    }
    let mut tar = Command::new("tar");
    tar.args([
        "--create",
        "--format=posix",
        "--xattrs",
        "--xattrs-include=*",
    ])
    .args(["--numeric-owner", "--sparse", "--file"])
    .arg(dest.join(CHAIN_ARCHIVE))
    .arg("--directory")
    .arg(store)
    .arg("--anchored")
    .arg(format!("--exclude=checkpoints/{owner}/{seq}/criu"));
    for m in chain {
        tar.arg(format!("checkpoints/{owner}/{m}"));
    }
    assert!(tar.status().unwrap().success());
}

pub fn base64_of(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Unpacks `archive` into `into` (created) as the shim's import does: owners, modes, every
/// xattr namespace, holes.
pub fn unpack(archive: &Path, into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    let ok = Command::new("tar")
        .args([
            "--extract",
            "--xattrs",
            "--xattrs-include=*",
            "--numeric-owner",
        ])
        .args([
            "--sparse",
            "--same-owner",
            "--preserve-permissions",
            "--file",
        ])
        .arg(archive)
        .arg("--directory")
        .arg(into)
        .status()
        .unwrap();
    assert!(ok.success(), "tar cannot extract {}", archive.display());
}
