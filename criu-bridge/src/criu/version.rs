//! The CRIU version gate: older CRIUs fail on sockets on this kernel (criu#2705), so Belayer
//! refuses to run with anything below 4.2.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A CRIU release number.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct CriuVersion {
    /// Major.
    pub major: u32,
    /// Minor.
    pub minor: u32,
    /// Patch (sublevel), 0 when absent.
    pub patch: u32,
}

impl fmt::Display for CriuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The oldest CRIU that dumps TCP/UDP sockets on this kernel.
pub const MIN_CRIU_VERSION: CriuVersion = CriuVersion {
    major: 4,
    minor: 2,
    patch: 0,
};

/// Why the CRIU gate refused.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    /// The binary could not be run.
    #[error("cannot run {binary} --version; install CRIU >= {MIN_CRIU_VERSION} (DESIGN.md §7)")]
    NotRunnable {
        /// The CRIU binary.
        binary: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// `criu --version` printed something unexpected.
    #[error("cannot read a version from `{binary} --version` output: {output:?}")]
    Unparsable {
        /// The CRIU binary.
        binary: PathBuf,
        /// What it printed.
        output: String,
    },
    /// CRIU is too old.
    #[error(
        "CRIU {found} at {binary} is too old: Belayer needs >= {MIN_CRIU_VERSION} (older ones fail to dump sockets on this kernel)"
    )]
    TooOld {
        /// The CRIU binary.
        binary: PathBuf,
        /// Its version.
        found: CriuVersion,
    },
}

/// Reads the version out of `criu --version` output ("Version: 4.2.1", maybe a "GitID:" line).
pub fn parse_version(output: &str) -> Option<CriuVersion> {
    let line = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("Version:"))?;
    let mut parts = line.trim().split(['.', '-', ' ']).map(|p| p.parse::<u32>());
    let major = parts.next()?.ok()?;
    let minor = parts.next().and_then(Result::ok).unwrap_or(0);
    let patch = parts.next().and_then(Result::ok).unwrap_or(0);
    Some(CriuVersion {
        major,
        minor,
        patch,
    })
}

/// Runs `criu --version` and checks it is at least [`MIN_CRIU_VERSION`].
pub fn check_criu(binary: &Path) -> Result<CriuVersion, VersionError> {
    check_criu_with(&crate::runc::StdSpawner, binary)
}

/// The file `binary` runs (searched on `PATH` when it has no `/`) and what changes when it is
/// replaced: path, inode, size, mtime.
fn identity(binary: &Path) -> Option<(std::path::PathBuf, u64, u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let path = if binary.components().count() > 1 {
        binary.to_path_buf()
    } else {
        std::env::split_paths(&std::env::var_os("PATH")?)
            .map(|d| d.join(binary))
            .find(|p| p.is_file())?
    };
    let m = std::fs::metadata(&path).ok()?;
    Some((path, m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// [`check_criu`], spawning through `spawner` (a shim's reaper must see every child). A binary
/// that passed once is not run again until the file changes (each checkpoint and restore asks).
/// The first check holds the others back: a fork of N restores side by side, and all N would
/// otherwise miss the cache together and run CRIU N times.
pub fn check_criu_with(
    spawner: &dyn crate::runc::Spawner,
    binary: &Path,
) -> Result<CriuVersion, VersionError> {
    type Passed = std::collections::HashMap<(std::path::PathBuf, u64, u64, i64, i64), CriuVersion>;
    static PASSED: std::sync::Mutex<Option<Passed>> = std::sync::Mutex::new(None);
    let id = identity(binary);
    let mut passed = PASSED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(v) = id.as_ref().and_then(|id| passed.as_ref()?.get(id)) {
        return Ok(*v);
    }
    let found = run_version_check(spawner, binary)?;
    if let Some(id) = id {
        passed
            .get_or_insert_with(Default::default)
            .insert(id, found);
    }
    Ok(found)
}

fn run_version_check(
    spawner: &dyn crate::runc::Spawner,
    binary: &Path,
) -> Result<CriuVersion, VersionError> {
    let mut cmd = Command::new(binary);
    cmd.arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = spawner
        .output(cmd)
        .map_err(|source| VersionError::NotRunnable {
            binary: binary.into(),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let found = parse_version(&text).ok_or_else(|| VersionError::Unparsable {
        binary: binary.into(),
        output: text,
    })?;
    if found < MIN_CRIU_VERSION {
        return Err(VersionError::TooOld {
            binary: binary.into(),
            found,
        });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_and_git_builds() {
        let v = parse_version("Version: 4.2.1\n").unwrap();
        assert_eq!(
            v,
            CriuVersion {
                major: 4,
                minor: 2,
                patch: 1
            }
        );
        let v = parse_version("Version: 3.17\nGitID: v3.17-1-gabc\n").unwrap();
        assert_eq!(
            v,
            CriuVersion {
                major: 3,
                minor: 17,
                patch: 0
            }
        );
        assert!(v < MIN_CRIU_VERSION);
        assert!(parse_version("criu: unknown option").is_none());
    }

    /// Runs the command, counting the runs; slow enough that concurrent checks overlap.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl crate::runc::Spawner for Counting {
        fn output(&self, mut cmd: Command) -> std::io::Result<std::process::Output> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(50));
            cmd.output()
        }
    }

    #[test]
    fn concurrent_checks_of_one_binary_run_it_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let criu = dir.path().join("criu");
        std::fs::write(&criu, "#!/bin/sh\necho 'Version: 4.2.1'\n").unwrap();
        std::fs::set_permissions(&criu, std::fs::Permissions::from_mode(0o755)).unwrap();
        let spawner = Counting(Default::default());
        std::thread::scope(|s| {
            let checks: Vec<_> = (0..8)
                .map(|_| s.spawn(|| check_criu_with(&spawner, &criu)))
                .collect();
            for c in checks {
                assert_eq!(c.join().unwrap().unwrap().to_string(), "4.2.1");
            }
        });
        assert_eq!(spawner.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        // A replaced binary is checked again.
        std::fs::write(&criu, "#!/bin/sh\necho 'Version: 4.1'\n").unwrap();
        let e = check_criu_with(&spawner, &criu).unwrap_err();
        assert!(matches!(e, VersionError::TooOld { .. }), "{e}");
        assert_eq!(spawner.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[test]
    fn too_old_names_the_installed_version() {
        let e = VersionError::TooOld {
            binary: "/usr/sbin/criu".into(),
            found: parse_version("Version: 4.1.1").unwrap(),
        };
        let msg = e.to_string();
        assert!(msg.contains("4.1.1") && msg.contains(">= 4.2.0"), "{msg}");
    }
}
