//! The capture index: what an overlay upper dir held at a checkpoint instant (path → inode
//! identity, ctime, size, mode), so the next capture copies only what changed since.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Identity of an upper directory: a restore mounts a fresh upper, and an index made for another
/// upper must not be used to diff this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpperIdentity {
    /// Device of the upper dir.
    pub dev: u64,
    /// Inode of the upper dir.
    pub ino: u64,
    /// Birth time (seconds, nanoseconds), where the filesystem records it.
    pub btime: Option<(i64, u32)>,
}

impl UpperIdentity {
    /// Reads the identity of `upper`.
    pub fn of(upper: &Path) -> std::io::Result<Self> {
        let m = std::fs::symlink_metadata(upper)?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
            btime: crate::sys::birth_time(upper)?,
        })
    }
}

/// One node of the upper dir at the capture instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Inode number.
    pub ino: u64,
    /// Change time (seconds, nanoseconds): moves on any data or metadata change.
    pub ctime: (i64, i64),
    /// Size in bytes.
    pub size: u64,
    /// Type and permission bits.
    pub mode: u32,
    /// Link count.
    pub nlink: u64,
    /// Directory marked opaque in the upper.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opaque: bool,
}

impl IndexEntry {
    pub(crate) fn from_meta(m: &super::at::Stat, opaque: bool) -> Self {
        Self {
            ino: m.ino,
            ctime: m.ctime,
            size: m.size,
            mode: m.mode,
            nlink: m.nlink,
            opaque,
        }
    }

    /// Same node, unchanged since the index was taken?
    pub(crate) fn unchanged(&self, now: &IndexEntry) -> bool {
        self.ino == now.ino
            && self.ctime == now.ctime
            && self.size == now.size
            && self.mode == now.mode
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// The whole upper dir at one checkpoint instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerIndex {
    /// Which upper dir this index describes.
    pub upper: UpperIdentity,
    /// Relative path (see [`encode_path`]) → node.
    pub entries: BTreeMap<String, IndexEntry>,
}

/// Encodes a relative path as a JSON-safe string: `%`, control bytes and non-ASCII bytes become
/// `%XX`.
pub fn encode_path(rel: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut s = String::new();
    for &b in rel.as_os_str().as_bytes() {
        if b == b'%' || !(0x20..0x7f).contains(&b) {
            s.push_str(&format!("%{b:02X}"));
        } else {
            s.push(b as char);
        }
    }
    s
}

/// Inverse of [`encode_path`].
pub fn decode_path(s: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            // Bytes, not `&s[..]`: a `%` before a multi-byte character must not split it.
            && let Ok(hex) = std::str::from_utf8(&b[i + 1..i + 3])
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_percent_before_a_multibyte_character_is_kept() {
        assert_eq!(decode_path("%aé"), PathBuf::from("%aé"));
        assert_eq!(decode_path("x%é"), PathBuf::from("x%é"));
        assert_eq!(decode_path("%41%"), PathBuf::from("A%"));
    }

    #[test]
    fn path_encoding_round_trips() {
        use std::os::unix::ffi::OsStrExt;
        for raw in [
            &b"a/b c"[..],
            b"100%/x",
            b"caf\xc3\xa9",
            b"bad\xff\x01name",
            b"%",
        ] {
            let p = Path::new(std::ffi::OsStr::from_bytes(raw));
            let e = encode_path(p);
            assert!(e.is_ascii());
            assert_eq!(decode_path(&e), p);
        }
    }
}
