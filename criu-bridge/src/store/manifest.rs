//! `manifest.json`: the versioned description of one checkpoint. The format version is the first
//! key and is checked before the rest is parsed; the file is size-bounded before parsing.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::confine::{MAX_SEQ, lexical_fault};
use crate::criu::DumpStats;
use crate::layer::CaptureStats;
use crate::runc::CriuOptions;

/// The format this library writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Manifests larger than this are refused before parsing.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 20;
/// File name of the manifest inside a checkpoint dir.
pub const MANIFEST_FILE: &str = "manifest.json";
/// CRIU images (and dump.log, stats-dump) inside a checkpoint dir.
pub const CRIU_DIR: &str = "criu";
/// The overlay layer inside a checkpoint dir.
pub const FS_DIR: &str = "fs";
/// The capture index (for the next incremental capture) inside a checkpoint dir.
pub const INDEX_FILE: &str = "fs-index.json";

/// One node of a checkpoint dir, as recorded for verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the checkpoint dir (encoded like layer paths).
    pub path: String,
    /// `f`, `d`, `l`, `c`, `b`, `p`, `s`.
    pub kind: char,
    /// Size (regular files).
    #[serde(default)]
    pub size: u64,
    /// sha256 of the content (regular files) or the target (symlinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

/// A process of the container that a checkpoint does not hold. CRIU dumps the tree of the
/// container's init; a process containerd exec'd is a child of the shim, outside the container,
/// so one still running at the checkpoint instant is not part of it (what it daemonized is:
/// orphans are reparented to init). After a restore it is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UncapturedExec {
    /// containerd's exec id.
    pub exec_id: String,
    /// Its pid on the host at the checkpoint instant.
    pub pid: u32,
}

/// Sizes of a checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sizes {
    /// Bytes of CRIU images.
    pub criu_bytes: u64,
    /// Bytes of file data in the fs layer.
    pub fs_bytes: u64,
    /// Bytes of all files.
    pub total_bytes: u64,
    /// Number of recorded nodes.
    pub files: u64,
}

/// Where the time of a checkpoint went (microseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timings {
    /// Before the freeze: the page cache of older checkpoints' CRIU images released
    /// (`Store::release_older_images`), for the dump's writes to reuse. Absent in older manifests.
    #[serde(default)]
    pub release_us: u64,
    /// `runc pause` (0 when the container was already paused or stopped).
    pub freeze_us: u64,
    /// `runc checkpoint` (CRIU dump).
    pub dump_us: u64,
    /// The fs layer capture.
    pub fs_capture_us: u64,
    /// `runc resume`.
    pub thaw_us: u64,
    /// From freeze to thaw: how long the container was stopped.
    pub frozen_us: u64,
    /// Hashing, manifest, fsync and rename.
    pub write_us: u64,
    /// The whole checkpoint.
    pub total_us: u64,
}

/// The manifest of one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Must stay the first field: readers check it before anything else.
    pub format_version: u32,
    /// containerd namespace.
    pub namespace: String,
    /// Container id.
    pub container: String,
    /// Sequence number of this checkpoint within the container.
    pub seq: u64,
    /// The checkpoint this one's filesystem is relative to.
    pub parent: Option<u64>,
    /// The checkpoint's instant, milliseconds since the Unix epoch: when the freeze began; the
    /// processes and the fs layer are as they were then (the dump, capture and write follow,
    /// `timings`). Manifests written before 2026-12-03 hold the time the write began instead.
    pub created_unix_ms: u64,
    /// `sha256:<hex>` of the bundle's config.json at checkpoint time.
    pub spec_digest: String,
    /// The image lower dirs, newest first, under the chain.
    pub image_lowers: Vec<PathBuf>,
    /// The rootfs mount was in a peer group on the host (`shared:N`; docker's are), so the
    /// container's root was its slave: a restore under another mount point (a fork) makes its
    /// rootfs mount shared too. Absent in older manifests: false.
    #[serde(default)]
    pub rootfs_shared: bool,
    /// Checkpoint seqs whose `fs/` layers form the rootfs, newest first (this one first).
    pub fs_chain: Vec<u64>,
    /// The CRIU image dir, relative to the checkpoint dir.
    pub criu_dir: String,
    /// The fs layer dir, relative to the checkpoint dir.
    pub fs_dir: String,
    /// The processes kept running after the dump.
    pub leave_running: bool,
    /// Exec'd processes that were running and are not in the checkpoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uncaptured_execs: Vec<UncapturedExec>,
    /// CRIU options used (restore must use the same).
    pub criu_options: CriuOptions,
    /// Sizes.
    pub sizes: Sizes,
    /// Timings.
    pub timings: Timings,
    /// CRIU's own dump figures.
    pub criu_stats: Option<DumpStats>,
    /// Figures of the fs capture.
    pub capture: CaptureStats,
    /// Every node of the checkpoint dir except the manifest.
    pub files: Vec<FileEntry>,
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// The manifest could not be read.
    #[error("cannot read manifest {path}")]
    Read {
        /// The manifest.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The manifest is larger than the bound.
    #[error("manifest {path} is {size} bytes, over the {MAX_MANIFEST_BYTES}-byte bound")]
    TooLarge {
        /// The manifest.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The manifest does not start with a format version.
    #[error(
        "manifest {path} does not start with a format_version (truncated or not a Belayer manifest)"
    )]
    NoVersion {
        /// The manifest.
        path: PathBuf,
    },
    /// The format version is not one this build reads.
    #[error(
        "manifest {path} has format_version {found}; this build reads version {FORMAT_VERSION}"
    )]
    UnknownVersion {
        /// The manifest.
        path: PathBuf,
        /// The version found.
        found: u64,
    },
    /// The manifest ends early.
    #[error("manifest {path} is truncated")]
    Truncated {
        /// The manifest.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A field names what a checkpoint may not: a path outside its dir, an id out of range.
    #[error("manifest {path}: {field} {value:?} {why}")]
    Invalid {
        /// The manifest.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The manifest is not valid.
    #[error("manifest {path} is malformed")]
    Malformed {
        /// The manifest.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the leading `{"format_version":N` without parsing the rest.
pub fn probe_version(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(&bytes[..bytes.len().min(128)]).ok()?;
    let rest = text.trim_start().strip_prefix('{')?.trim_start();
    let rest = rest
        .strip_prefix("\"format_version\"")?
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = rest[digits.len()..].trim_start();
    if digits.is_empty() || !(after.starts_with(',') || after.starts_with('}')) {
        return None;
    }
    digits.parse().ok()
}

impl Manifest {
    /// The manifest of checkpoint `seq` of `namespace`/`container` with filesystem chain
    /// `fs_chain` (newest first) over `image_lowers`, its parent the chain's second member, and
    /// every figure empty: for tools and tests that write checkpoints without CRIU.
    pub fn bare(
        namespace: &str,
        container: &str,
        seq: u64,
        fs_chain: Vec<u64>,
        image_lowers: Vec<PathBuf>,
    ) -> Self {
        Manifest {
            format_version: FORMAT_VERSION,
            namespace: namespace.into(),
            container: container.into(),
            seq,
            parent: fs_chain.get(1).copied(),
            created_unix_ms: 0,
            spec_digest: "sha256:none".into(),
            image_lowers,
            rootfs_shared: false,
            fs_chain,
            criu_dir: CRIU_DIR.into(),
            fs_dir: FS_DIR.into(),
            leave_running: true,
            uncaptured_execs: Vec::new(),
            criu_options: CriuOptions::default(),
            sizes: Sizes::default(),
            timings: Timings::default(),
            criu_stats: None,
            capture: CaptureStats::default(),
            files: Vec::new(),
        }
    }

    /// Reads and checks a manifest: size bound, then format version, then the rest.
    pub fn read(path: &Path) -> Result<Self, FormatError> {
        let read_err = |source| FormatError::Read {
            path: path.into(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        let size = file.metadata().map_err(read_err)?.len();
        if size > MAX_MANIFEST_BYTES {
            return Err(FormatError::TooLarge {
                path: path.into(),
                size,
            });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        file.take(MAX_MANIFEST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_err)?;
        Self::parse(path, &bytes)
    }

    /// Checks and parses manifest bytes (`path` only names the file in errors).
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(FormatError::TooLarge {
                path: path.into(),
                size: bytes.len() as u64,
            });
        }
        let version =
            probe_version(bytes).ok_or_else(|| FormatError::NoVersion { path: path.into() })?;
        if version != u64::from(FORMAT_VERSION) {
            return Err(FormatError::UnknownVersion {
                path: path.into(),
                found: version,
            });
        }
        let m: Self = serde_json::from_slice(bytes).map_err(|source| {
            if source.is_eof() {
                FormatError::Truncated {
                    path: path.into(),
                    source,
                }
            } else {
                FormatError::Malformed {
                    path: path.into(),
                    source,
                }
            }
        })?;
        m.check(path)?;
        Ok(m)
    }

    /// Refuses what no checkpoint this library writes holds and an imported one must not: an id
    /// out of range ([`MAX_SEQ`]), a chain that does not start at the checkpoint or names a later
    /// one, a `criu_dir` or `fs_dir` that is not a relative path inside the checkpoint dir.
    fn check(&self, path: &Path) -> Result<(), FormatError> {
        let invalid = |field, value: String, why| FormatError::Invalid {
            path: path.into(),
            field,
            value,
            why,
        };
        if self.seq == 0 || self.seq >= MAX_SEQ {
            return Err(invalid("seq", self.seq.to_string(), "is not in 1..2^32"));
        }
        if let Some(p) = self.parent.filter(|p| *p >= self.seq) {
            return Err(invalid(
                "parent",
                p.to_string(),
                "is not an earlier checkpoint",
            ));
        }
        let chain_ok = self.fs_chain.first() == Some(&self.seq)
            && self.fs_chain[1..].iter().all(|s| *s < self.seq);
        if !chain_ok {
            return Err(invalid(
                "fs_chain",
                format!("{:?}", self.fs_chain),
                "does not start at the checkpoint and go back",
            ));
        }
        for (field, value) in [("criu_dir", &self.criu_dir), ("fs_dir", &self.fs_dir)] {
            if let Some(why) = lexical_fault(value) {
                return Err(invalid(field, value.clone(), why));
            }
        }
        Ok(())
    }

    /// The manifest as written to disk.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        v.push(b'\n');
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest {
            created_unix_ms: 1,
            spec_digest: "sha256:00".into(),
            files: vec![FileEntry {
                path: "criu/x.img".into(),
                kind: 'f',
                size: 3,
                sha256: Some("ab".into()),
            }],
            ..Manifest::bare("default", "c1", 2, vec![2, 1], vec!["/img/l1".into()])
        }
    }

    #[test]
    fn round_trips_with_the_version_first() {
        let m = sample();
        let bytes = m.to_bytes();
        assert_eq!(probe_version(&bytes), Some(1));
        assert_eq!(Manifest::parse(Path::new("m"), &bytes).unwrap(), m);
    }

    #[test]
    fn unknown_version_is_refused_before_parsing_the_rest() {
        let e =
            Manifest::parse(Path::new("m"), br#"{"format_version": 7, "anything": ["#).unwrap_err();
        assert!(
            matches!(e, FormatError::UnknownVersion { found: 7, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("format_version 7"));
    }

    #[test]
    fn paths_out_of_the_checkpoint_and_ids_out_of_range_are_refused() {
        type Break = fn(&mut Manifest);
        let cases: [(&str, Break); 6] = [
            ("criu_dir", |m| m.criu_dir = "/etc/cron.d".into()),
            ("criu_dir", |m| m.criu_dir = "criu/../../../x".into()),
            ("fs_dir", |m| m.fs_dir = "".into()),
            ("seq", |m| m.seq = u64::MAX),
            ("parent", |m| m.parent = Some(7)),
            ("fs_chain", |m| m.fs_chain = vec![2, 9]),
        ];
        for (field, break_it) in cases {
            let mut m = sample();
            break_it(&mut m);
            let e = Manifest::parse(Path::new("m"), &m.to_bytes()).unwrap_err();
            assert!(
                matches!(&e, FormatError::Invalid { field: f, .. } if *f == field),
                "{field}: {e}"
            );
        }
    }

    #[test]
    fn truncation_and_garbage_are_named() {
        let bytes = sample().to_bytes();
        let e = Manifest::parse(Path::new("m"), &bytes[..bytes.len() / 2]).unwrap_err();
        assert!(matches!(e, FormatError::Truncated { .. }), "{e}");
        let e = Manifest::parse(Path::new("m"), &bytes[..10]).unwrap_err();
        assert!(matches!(e, FormatError::NoVersion { .. }), "{e}");
        let e = Manifest::parse(Path::new("m"), b"").unwrap_err();
        assert!(matches!(e, FormatError::NoVersion { .. }), "{e}");
    }
}
