//! Decoding CRIU's `stats-dump` / `stats-restore` image files by hand: a service magic, the
//! stats magic, then one size-prefixed protobuf `StatsEntry` (CRIU images/stats.proto).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// First magic of CRIU "service" images (stats, inventory-less files).
const IMG_SERVICE_MAGIC: u32 = 0x5510_5940;
/// Magic of the stats image.
const STATS_MAGIC: u32 = 0x5709_3306;

/// Figures of one CRIU dump (times in microseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DumpStats {
    /// Time to freeze the tasks.
    pub freezing_time_us: u64,
    /// Time the tasks stayed frozen.
    pub frozen_time_us: u64,
    /// Time to collect memory pages.
    pub memdump_time_us: u64,
    /// Time to write memory pages.
    pub memwrite_time_us: u64,
    /// Pages scanned.
    pub pages_scanned: u64,
    /// Pages skipped because a parent image had them.
    pub pages_skipped_parent: u64,
    /// Pages written.
    pub pages_written: u64,
    /// Pages left for lazy restore.
    pub pages_lazy: u64,
    /// Time to resolve inotify paths, if any.
    pub irmap_resolve_us: Option<u64>,
    /// Shared-memory pages written, if reported.
    pub shpages_written: Option<u64>,
}

/// Figures of one CRIU restore (times in microseconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreStats {
    /// Pages compared with a parent image.
    pub pages_compared: u64,
    /// Pages skipped thanks to copy-on-write.
    pub pages_skipped_cow: u64,
    /// Time to fork the task tree.
    pub forking_time_us: u64,
    /// Time of the whole restore.
    pub restore_time_us: u64,
    /// Pages restored, if reported.
    pub pages_restored: Option<u64>,
}

/// Why a stats file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// The file could not be read.
    #[error("cannot read CRIU stats file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The magic numbers are not those of a stats image.
    #[error("{path} is not a CRIU stats image (magic {found:#010x})")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first magic found.
        found: u32,
    },
    /// The file ends early or the protobuf is malformed.
    #[error("CRIU stats image {path} is malformed: {what}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: &'static str,
    },
    /// The entry lacks the expected dump or restore part.
    #[error("CRIU stats image {path} has no {part} entry")]
    Missing {
        /// The file.
        path: PathBuf,
        /// "dump" or "restore".
        part: &'static str,
    },
}

/// Reads `stats-dump` (CRIU writes it into its work dir).
pub fn read_dump_stats(path: &Path) -> Result<DumpStats, StatsError> {
    let entry = read_entry(path)?;
    let body = find_field(&entry, 1).map_err(|what| StatsError::Malformed {
        path: path.into(),
        what,
    })?;
    let body = body.ok_or_else(|| StatsError::Missing {
        path: path.into(),
        part: "dump",
    })?;
    let mut s = DumpStats::default();
    for_each_varint(body, |field, v| match field {
        1 => s.freezing_time_us = v,
        2 => s.frozen_time_us = v,
        3 => s.memdump_time_us = v,
        4 => s.memwrite_time_us = v,
        5 => s.pages_scanned = v,
        6 => s.pages_skipped_parent = v,
        7 => s.pages_written = v,
        8 => s.irmap_resolve_us = Some(v),
        9 => s.pages_lazy = v,
        14 => s.shpages_written = Some(v),
        _ => {}
    })
    .map_err(|what| StatsError::Malformed {
        path: path.into(),
        what,
    })?;
    Ok(s)
}

/// Reads `stats-restore` (CRIU writes it into its work dir).
pub fn read_restore_stats(path: &Path) -> Result<RestoreStats, StatsError> {
    let entry = read_entry(path)?;
    let body = find_field(&entry, 2).map_err(|what| StatsError::Malformed {
        path: path.into(),
        what,
    })?;
    let body = body.ok_or_else(|| StatsError::Missing {
        path: path.into(),
        part: "restore",
    })?;
    let mut s = RestoreStats::default();
    for_each_varint(body, |field, v| match field {
        1 => s.pages_compared = v,
        2 => s.pages_skipped_cow = v,
        3 => s.forking_time_us = v,
        4 => s.restore_time_us = v,
        5 => s.pages_restored = Some(v),
        _ => {}
    })
    .map_err(|what| StatsError::Malformed {
        path: path.into(),
        what,
    })?;
    Ok(s)
}

/// The bytes of the single `StatsEntry` after the magics and the size prefix.
fn read_entry(path: &Path) -> Result<Vec<u8>, StatsError> {
    let data = std::fs::read(path).map_err(|source| StatsError::Read {
        path: path.into(),
        source,
    })?;
    let word = |i: usize| {
        data.get(i..i + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let malformed = |what| StatsError::Malformed {
        path: path.into(),
        what,
    };
    let first = word(0).ok_or_else(|| malformed("shorter than its magic"))?;
    if first != IMG_SERVICE_MAGIC {
        return Err(StatsError::BadMagic {
            path: path.into(),
            found: first,
        });
    }
    let second = word(4).ok_or_else(|| malformed("shorter than its magic"))?;
    if second != STATS_MAGIC {
        return Err(StatsError::BadMagic {
            path: path.into(),
            found: second,
        });
    }
    let size = word(8).ok_or_else(|| malformed("no entry size"))? as usize;
    let body = data
        .get(12..12 + size)
        .ok_or_else(|| malformed("entry shorter than its size"))?;
    Ok(body.to_vec())
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long")
}

/// Walks protobuf fields, calling `f(field, value)` for varints and skipping the rest.
fn walk_fields<'a>(buf: &'a [u8], mut f: impl FnMut(u64, Field<'a>)) -> Result<(), &'static str> {
    let mut pos = 0;
    while pos < buf.len() {
        let key = read_varint(buf, &mut pos)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => f(field, Field::Varint(read_varint(buf, &mut pos)?)),
            1 => pos += 8,
            2 => {
                let len = read_varint(buf, &mut pos)? as usize;
                let bytes = buf.get(pos..pos + len).ok_or("truncated field")?;
                pos += len;
                f(field, Field::Bytes(bytes));
            }
            5 => pos += 4,
            _ => return Err("unknown wire type"),
        }
    }
    if pos > buf.len() {
        Err("truncated field")
    } else {
        Ok(())
    }
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn find_field(buf: &[u8], want: u64) -> Result<Option<&[u8]>, &'static str> {
    let mut found = None;
    walk_fields(buf, |field, v| {
        if let (true, Field::Bytes(b)) = (field == want, v) {
            found = Some(b);
        }
    })?;
    Ok(found)
}

fn for_each_varint(buf: &[u8], mut f: impl FnMut(u64, u64)) -> Result<(), &'static str> {
    walk_fields(buf, |field, v| {
        if let Field::Varint(v) = v {
            f(field, v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Real files written by CRIU 4.2.1 on this machine (a busybox shell loop).
    const DUMP: &[u8] = b"\x40\x59\x10\x55\x06\x33\x09\x57\x23\x00\x00\x00\x0a\x21\x08\x87\x03\x10\xdf\x90\x04\x18\x84\x07\x20\x85\x01\x28\x30\x30\x00\x38\x21\x40\x00\x48\x00\x50\x08\x58\x08\x60\x00\x68\x00\x70\x00";
    const RESTORE: &[u8] = b"\x40\x59\x10\x55\x06\x33\x09\x57\x0f\x00\x00\x00\x12\x0d\x08\x09\x10\x02\x18\x87\x02\x20\xfb\xc4\x08\x28\x1f";

    fn write(bytes: &[u8]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        f
    }

    #[test]
    fn decodes_a_real_stats_dump() {
        let f = write(DUMP);
        let s = read_dump_stats(f.path()).unwrap();
        assert_eq!(s.freezing_time_us, 391);
        assert_eq!(s.frozen_time_us, 67679);
        assert_eq!(s.memdump_time_us, 900);
        assert_eq!(s.memwrite_time_us, 133);
        assert_eq!(s.pages_scanned, 48);
        assert_eq!(s.pages_written, 33);
        assert_eq!(s.irmap_resolve_us, Some(0));
        assert_eq!(s.shpages_written, Some(0));
    }

    #[test]
    fn decodes_a_real_stats_restore() {
        let f = write(RESTORE);
        let s = read_restore_stats(f.path()).unwrap();
        assert_eq!(
            s,
            RestoreStats {
                pages_compared: 9,
                pages_skipped_cow: 2,
                forking_time_us: 263,
                restore_time_us: 139899,
                pages_restored: Some(31)
            }
        );
        assert!(matches!(
            read_dump_stats(f.path()),
            Err(StatsError::Missing { part: "dump", .. })
        ));
    }

    #[test]
    fn rejects_bad_magic_and_truncation() {
        let f = write(&DUMP[..20]);
        assert!(matches!(
            read_dump_stats(f.path()),
            Err(StatsError::Malformed { .. })
        ));
        let mut bad = DUMP.to_vec();
        bad[0] = 0;
        let f = write(&bad);
        assert!(matches!(
            read_dump_stats(f.path()),
            Err(StatsError::BadMagic { .. })
        ));
    }
}
