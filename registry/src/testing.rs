//! A registry server for tests (feature `testing`): the CNCF distribution registry (Debian's
//! `docker-registry`) on a free loopback port, filesystem storage and config in a directory of
//! its own, htpasswd authentication, killed and removed when dropped. Never the system service.
//! Used by this crate's tests and by the end-to-end suites (`integration/tests/replicate.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;

/// The server binary (Debian's `docker-registry` package).
pub const REGISTRY_BIN: &str = "/usr/bin/docker-registry";
/// The user [`Registry::start`] accepts.
pub const USER: &str = "belayer";
/// [`USER`]'s password.
pub const PASSWORD: &str = "s3cret-pass";

/// A registry server of a test's own, killed and its directory removed when dropped.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Its storage root (`docker/registry/v2/…` below).
    pub storage: PathBuf,
    /// Its log: one line a request, and its errors.
    pub log: PathBuf,
    dir: PathBuf,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory under the temporary directory, unique in this process.
fn fresh_dir() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "belayer-registry-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the registry's dir");
    dir
}

impl Registry {
    /// A registry with htpasswd authentication (user [`USER`], password [`PASSWORD`]).
    /// Panics, naming the package, when `docker-registry` or `htpasswd` is missing.
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
            assert!(htpasswd.status.success(), "htpasswd -nbB failed");
            std::fs::write(dir.join("htpasswd"), &htpasswd.stdout).expect("write htpasswd");
            format!(
                "auth:\n  htpasswd:\n    realm: belayer-test\n    path: {}\n",
                dir.join("htpasswd").display()
            )
        })
    }

    /// A registry whose config's `auth` section `auth` writes (given the registry's dir).
    pub fn start_with(auth: impl FnOnce(&Path) -> String) -> Self {
        assert!(
            Path::new(REGISTRY_BIN).is_file(),
            "{REGISTRY_BIN} is missing: install Debian's docker-registry package \
             (apt-get install -y docker-registry; scripts/setup installs it)"
        );
        let dir = fresh_dir();
        let auth = auth(&dir);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let addr = format!("127.0.0.1:{port}");
        let storage = dir.join("data");
        let config = dir.join("config.yml");
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
        .expect("write the registry's config");
        // Its request log and errors, in one file.
        let log = dir.join("registry.log");
        let out = std::fs::File::create(&log).expect("create the registry's log");
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("dup the log"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {REGISTRY_BIN}: {e}"));
        let registry = Self {
            child,
            addr,
            storage,
            log,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&registry.addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {}: {}",
                registry.addr,
                registry.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        registry
    }

    /// Writes a docker config (`DIR/config.json`) holding `user:password` for this registry;
    /// point `DOCKER_CONFIG` at `dir` to use it.
    pub fn write_docker_config(&self, dir: &Path, user: &str, password: &str) {
        std::fs::create_dir_all(dir).expect("create the docker config dir");
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        let config = serde_json::json!({"auths": {self.addr.clone(): {"auth": auth}}});
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec(&config).expect("serialize the docker config"),
        )
        .expect("write the docker config");
    }

    /// How many blob uploads the registry has finished (its request log's `PUT`s of an upload).
    pub fn finished_uploads(&self) -> usize {
        self.log_text()
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
    pub fn blob_file(&self, digest: &crate::Digest) -> PathBuf {
        let hex = digest.hex();
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}
