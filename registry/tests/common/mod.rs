//! What the registry tests share: a registry server of their own, exports as the shim writes
//! them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use belayer_registry::checkpoint::CHAIN_ARCHIVE;

pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
pub const USER: &str = "belayer";
pub const PASSWORD: &str = "s3cret-pass";

/// A registry server of our own, killed when dropped.
pub struct Registry {
    child: Child,
    pub addr: String,
    pub storage: PathBuf,
    pub log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// A registry with htpasswd authentication (user [`USER`], password [`PASSWORD`]).
    pub fn start() -> Self {
        Self::start_with(|dir| {
            let htpasswd = Command::new("htpasswd")
                .args(["-nbB", USER, PASSWORD])
                .output()
                .unwrap_or_else(|e| {
                    panic!(
                        "htpasswd cannot run ({e}): install Debian's apache2-utils package \
                         (apt-get install -y apache2-utils; scripts/setup installs it)"
                    )
                });
            assert!(htpasswd.status.success());
            std::fs::write(dir.join("htpasswd"), &htpasswd.stdout).unwrap();
            format!(
                "auth:\n  htpasswd:\n    realm: belayer-test\n    path: {}\n",
                dir.join("htpasswd").display()
            )
        })
    }

    /// A registry whose config's `auth` section `auth` writes (given the registry's temp dir).
    pub fn start_with(auth: impl FnOnce(&Path) -> String) -> Self {
        assert!(
            Path::new(REGISTRY_BIN).is_file(),
            "{REGISTRY_BIN} is missing: install Debian's docker-registry package \
             (apt-get install -y docker-registry; scripts/setup installs it)"
        );
        let dir = tempfile::tempdir().unwrap();
        let auth = auth(dir.path());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let storage = dir.path().join("data");
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\n\
                 log:\n  level: info\n\
                 storage:\n  filesystem:\n    rootdirectory: {}\n  \
                 maintenance:\n    uploadpurging:\n      enabled: false\n\
                 http:\n  addr: {addr}\n  secret: belayer-test-secret\n{auth}",
                storage.display(),
            ),
        )
        .unwrap();
        // Its request log and errors, in one file.
        let log = dir.path().join("registry.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let registry = Self {
            child,
            addr,
            storage,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&registry.addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {}: {}",
                registry.addr,
                std::fs::read_to_string(&registry.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// How many blob uploads the registry has finished (its request log's `PUT`s of an upload).
    pub fn finished_uploads(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                l.contains("http.request.method=PUT")
                    && l.contains("/blobs/uploads/")
                    && l.contains("response completed")
            })
            .count()
    }

    /// Its log, for a failure's message.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The file the registry keeps blob `digest` in.
    pub fn blob_file(&self, digest: &belayer_registry::Digest) -> PathBuf {
        let hex = digest.hex();
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
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
