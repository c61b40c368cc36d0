//! Where the binaries and images under test are, and a loud failure when one is missing.

use std::path::{Path, PathBuf};

/// Fails the calling test, naming the prerequisite and how to get it.
#[track_caller]
pub fn missing(what: &str, fix: &str) -> ! {
    panic!("prerequisite missing: {what} ({fix})")
}

/// Finds `name` on PATH or fails the test.
#[track_caller]
pub fn require_bin(name: &str) -> PathBuf {
    let paths = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&paths)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| missing(name, "run scripts/setup"))
}

/// The directory holding the workspace's freshly built binaries (`containerd-shim-belayer-v1`,
/// `belayer`): `$BELAYER_BIN_DIR`, else the cargo target dir this test binary was built into.
#[track_caller]
pub fn bin_dir() -> PathBuf {
    let dir = match std::env::var_os("BELAYER_BIN_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let exe = std::env::current_exe().expect("current exe");
            // target/<profile>/deps/<test> → target/<profile>
            exe.parent()
                .and_then(Path::parent)
                .expect("target dir")
                .to_path_buf()
        }
    };
    if !dir.join("containerd-shim-belayer-v1").is_file() {
        missing(
            &format!("{}/containerd-shim-belayer-v1", dir.display()),
            "build it first: cargo build --workspace --bins (scripts/test does)",
        );
    }
    dir
}

/// The directory of locally built images (`scripts/images`).
pub fn images_dir() -> PathBuf {
    std::env::var_os("BELAYER_IMAGES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/belayer/images"))
}

/// Path of a built image archive, or fails the test.
#[track_caller]
pub fn image(file: &str) -> PathBuf {
    let p = images_dir().join(file);
    if !p.is_file() {
        missing(&p.display().to_string(), "build the images: scripts/images");
    }
    p
}
