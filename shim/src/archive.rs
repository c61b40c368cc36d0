//! An import's chain archive, read before a byte of it is unpacked: its size, the bytes it
//! unpacks to (a sparse member at its apparent size: it is hashed in full), its member count and
//! the store's free space are bounded ([`ImportLimits`]); every member lies under `checkpoints/`,
//! with no absolute name, no `..` and no member below a symlink an earlier one made.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

pub use belayer_api::settings::ImportLimits;

/// Why an archive is not imported.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The archive cannot be read.
    #[error("cannot read {path}")]
    Read {
        /// The archive.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A bound of [`ImportLimits`] is passed.
    #[error(
        "{path}: {what} is over {limit}, the import bound (import.{setting} in the node settings)"
    )]
    OverLimit {
        /// The archive.
        path: PathBuf,
        /// What passed it ("the export's size, 3000000 bytes", ...).
        what: String,
        /// The bound.
        limit: u64,
        /// Its setting.
        setting: &'static str,
    },
    /// The store's disk has no room for it.
    #[error("{path} needs {need} bytes; the store's disk ({store}) has {free} free")]
    NoRoom {
        /// The archive.
        path: PathBuf,
        /// Bytes it would write.
        need: u64,
        /// Bytes free.
        free: u64,
        /// The store root.
        store: PathBuf,
    },
    /// A member that no export holds.
    #[error("{path}: member {member:?} {why}")]
    BadMember {
        /// The archive.
        path: PathBuf,
        /// The member's name.
        member: String,
        /// What is wrong with it.
        why: String,
    },
    /// Not a tar archive, or cut short.
    #[error("{path} is not a whole tar archive: {why}")]
    Malformed {
        /// The archive.
        path: PathBuf,
        /// What is wrong.
        why: &'static str,
    },
}

/// What an archive holds, as its headers say.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// Members.
    pub members: u64,
    /// Bytes it unpacks to, sparse members at their apparent size.
    pub unpacked: u64,
    /// Bytes of data it holds (what lands on disk).
    pub stored: u64,
}

/// Largest pax or GNU long-name header read.
const MAX_META: u64 = 1 << 20;

/// Checks the chain archive `path` (with `beside` bytes of CRIU images beside it) against
/// `limits` and the free space of the store at `store`, reading only its headers.
pub fn check(
    path: &Path,
    beside: u64,
    limits: &ImportLimits,
    store: &Path,
) -> Result<Scanned, ArchiveError> {
    let size = std::fs::metadata(path)
        .map_err(|source| ArchiveError::Read {
            path: path.into(),
            source,
        })?
        .len();
    let total = size.saturating_add(beside);
    if total > limits.max_archive_bytes {
        return Err(ArchiveError::OverLimit {
            path: path.into(),
            what: format!("the export's size, {total} bytes"),
            limit: limits.max_archive_bytes,
            setting: "max_archive_bytes",
        });
    }
    let scanned = scan(path, limits)?;
    let free = nix::sys::statvfs::statvfs(store)
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
        .map_err(|e| ArchiveError::Read {
            path: store.into(),
            source: e.into(),
        })?;
    // Each member takes at least a block of metadata besides its data.
    let need = scanned
        .stored
        .saturating_add(scanned.members.saturating_mul(4096))
        .saturating_add(beside);
    if need > free {
        return Err(ArchiveError::NoRoom {
            path: path.into(),
            need,
            free,
            store: store.into(),
        });
    }
    Ok(scanned)
}

/// Reads the headers of the tar archive `path` (ustar, pax, GNU long names and sparse members),
/// refusing a member no export holds and stopping at the first bound passed.
pub fn scan(path: &Path, limits: &ImportLimits) -> Result<Scanned, ArchiveError> {
    let malformed = |why| ArchiveError::Malformed {
        path: path.into(),
        why,
    };
    let read_err = |source: std::io::Error| match source.kind() {
        std::io::ErrorKind::UnexpectedEof => malformed("it ends inside a member"),
        _ => ArchiveError::Read {
            path: path.into(),
            source,
        },
    };
    let mut r = BufReader::new(File::open(path).map_err(read_err)?);
    let mut out = Scanned::default();
    let mut pax: HashMap<String, String> = HashMap::new();
    let (mut long_name, mut long_link): (Option<String>, Option<String>) = (None, None);
    let mut symlinks: HashSet<String> = HashSet::new();
    let mut block = [0u8; 512];
    loop {
        r.read_exact(&mut block).map_err(read_err)?;
        if block.iter().all(|b| *b == 0) {
            return Ok(out);
        }
        if !checksum_ok(&block) {
            return Err(malformed("a header's checksum is wrong"));
        }
        let kind = block[156];
        let header_size =
            number(&block[124..136]).ok_or_else(|| malformed("a size is no number"))?;
        match kind {
            b'x' | b'g' | b'L' | b'K' => {
                if header_size > MAX_META {
                    return Err(malformed("an extended header is over 1 MiB"));
                }
                let mut data = vec![0u8; header_size as usize];
                r.read_exact(&mut data).map_err(read_err)?;
                skip(&mut r, pad(header_size)).map_err(read_err)?;
                match kind {
                    b'x' => pax.extend(pax_records(&data)),
                    b'L' => long_name = Some(c_string(&data)),
                    b'K' => long_link = Some(c_string(&data)),
                    _ => {}
                }
                continue;
            }
            _ => {}
        }
        let name = pax
            .remove("GNU.sparse.name")
            .or_else(|| pax.remove("path"))
            .or(long_name.take())
            .unwrap_or_else(|| ustar_name(&block));
        let link = pax
            .remove("linkpath")
            .or(long_link.take())
            .unwrap_or_else(|| c_string(&block[157..257]));
        let size = match pax.remove("size") {
            Some(s) => s
                .parse()
                .map_err(|_| malformed("a pax size is no number"))?,
            None => header_size,
        };
        let mut apparent = pax
            .remove("GNU.sparse.realsize")
            .or_else(|| pax.remove("GNU.sparse.size"))
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(size);
        pax.clear();
        if kind == b'S' {
            // Old GNU sparse: the apparent size in the header, maybe more map blocks after it.
            apparent = number(&block[483..495]).ok_or_else(|| malformed("a size is no number"))?;
            let mut extended = block[482] != 0;
            while extended {
                r.read_exact(&mut block).map_err(read_err)?;
                extended = block[504] != 0;
            }
        }
        let bad = |why: String| ArchiveError::BadMember {
            path: path.into(),
            member: name.clone(),
            why,
        };
        let member = confined(&name).map_err(|why| bad(why.into()))?;
        if let Some(s) = under_symlink(&member, &symlinks) {
            return Err(bad(format!(
                "lies below the symlink {s:?} the archive made"
            )));
        }
        match kind {
            b'0' | b'\0' | b'7' | b'S' | b'3' | b'4' | b'5' | b'6' => {}
            b'2' => {
                symlinks.insert(member.clone());
            }
            b'1' => {
                let target = confined(&link)
                    .map_err(|why| bad(format!("links to {link:?}, which {why}")))?;
                if under_symlink(&target, &symlinks).is_some() {
                    return Err(bad(format!("links to {link:?}, below a symlink")));
                }
            }
            other => {
                return Err(bad(format!(
                    "is of tar type {:?}, which no export holds",
                    other as char
                )));
            }
        }
        // Links, dirs, devices and fifos have no data, whatever their size field says.
        let has_data = matches!(kind, b'0' | b'\0' | b'7' | b'S');
        let (size, apparent) = if has_data { (size, apparent) } else { (0, 0) };
        out.members += 1;
        out.stored = out.stored.saturating_add(size);
        out.unpacked = out.unpacked.saturating_add(apparent.max(size));
        if out.members > limits.max_files {
            return Err(ArchiveError::OverLimit {
                path: path.into(),
                what: format!("its member count, past {}", limits.max_files),
                limit: limits.max_files,
                setting: "max_files",
            });
        }
        if out.unpacked > limits.max_unpacked_bytes {
            return Err(ArchiveError::OverLimit {
                path: path.into(),
                what: format!(
                    "what it unpacks to, {} bytes with {name:?} ({apparent} bytes{})",
                    out.unpacked,
                    if apparent > size { ", sparse" } else { "" }
                ),
                limit: limits.max_unpacked_bytes,
                setting: "max_unpacked_bytes",
            });
        }
        if has_data {
            skip(&mut r, size + pad(size)).map_err(read_err)?;
        }
    }
}

/// `name` without a trailing `/`, if it is a relative path under `checkpoints/` with no `..`.
fn confined(name: &str) -> Result<String, &'static str> {
    let name = name
        .strip_prefix("./")
        .unwrap_or(name)
        .trim_end_matches('/');
    if name.starts_with('/') {
        return Err("is absolute");
    }
    let parts: Vec<&str> = name.split('/').collect();
    if parts.contains(&"..") {
        return Err("climbs out with '..'");
    }
    if parts.first() != Some(&"checkpoints") || parts.iter().any(|p| p.is_empty()) {
        return Err("is not under checkpoints/");
    }
    Ok(name.to_string())
}

/// The symlink among `symlinks` that `member` lies below, if any.
fn under_symlink<'a>(member: &str, symlinks: &'a HashSet<String>) -> Option<&'a String> {
    let mut at = 0;
    while let Some(i) = member[at..].find('/') {
        at += i;
        if let Some(s) = symlinks.get(&member[..at]) {
            return Some(s);
        }
        at += 1;
    }
    None
}

/// Bytes of padding after `size` bytes of data.
fn pad(size: u64) -> u64 {
    (512 - size % 512) % 512
}

fn skip(r: &mut BufReader<File>, n: u64) -> std::io::Result<()> {
    let copied = std::io::copy(&mut r.by_ref().take(n), &mut std::io::sink())?;
    if copied < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// A tar number field: octal text, or base-256 when its top bit is set.
fn number(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        if field[0] & 0x40 != 0 {
            return None;
        }
        return field[1..]
            .iter()
            .try_fold(u64::from(field[0] & 0x3f), |n, b| {
                n.checked_mul(256)?.checked_add(u64::from(*b))
            });
    }
    let text: String = field
        .iter()
        .map(|b| *b as char)
        .skip_while(|c| *c == ' ' || *c == '\0')
        .take_while(|c| c.is_digit(8))
        .collect();
    if text.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(&text, 8).ok()
}

fn checksum_ok(block: &[u8; 512]) -> bool {
    let sum: u64 = block
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(*b)
            }
        })
        .sum();
    number(&block[148..156]) == Some(sum)
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// A ustar header's name: its prefix, a `/`, its name.
fn ustar_name(block: &[u8; 512]) -> String {
    let name = c_string(&block[..100]);
    let prefix = if &block[257..262] == b"ustar" {
        c_string(&block[345..500])
    } else {
        String::new()
    };
    if prefix.is_empty() {
        name
    } else {
        format!("{prefix}/{name}")
    }
}

/// The `key=value` records of a pax header (`<len> key=value\n` each).
fn pax_records(mut data: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some(space) = data.iter().position(|b| *b == b' ') {
        let Some(len) = std::str::from_utf8(&data[..space])
            .ok()
            .and_then(|l| l.parse::<usize>().ok())
            .filter(|l| *l > space && *l <= data.len())
        else {
            break;
        };
        let record = String::from_utf8_lossy(&data[space + 1..len]);
        if let Some((k, v)) = record.trim_end_matches('\n').split_once('=') {
            out.push((k.to_string(), v.to_string()));
        }
        data = &data[len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_outside_checkpoints_or_below_a_symlink_are_named() {
        assert_eq!(
            confined("./checkpoints/a/b/1/").unwrap(),
            "checkpoints/a/b/1"
        );
        assert_eq!(confined("/etc/cron.d/x"), Err("is absolute"));
        assert_eq!(
            confined("checkpoints/../../etc"),
            Err("climbs out with '..'")
        );
        assert_eq!(confined("etc/passwd"), Err("is not under checkpoints/"));
        let links = HashSet::from(["checkpoints/a/b/1/fs/x".to_string()]);
        assert!(under_symlink("checkpoints/a/b/1/fs/x/etc/passwd", &links).is_some());
        assert!(under_symlink("checkpoints/a/b/1/fs/xy", &links).is_none());
        assert!(under_symlink("checkpoints/a/b/1/fs/x", &links).is_none());
    }

    #[test]
    fn numbers_are_octal_or_base_256() {
        assert_eq!(number(b"00000001750\0"), Some(1000));
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[6] = 1;
        assert_eq!(number(&big), Some(1 << 40));
        big[0] = 0xff;
        assert_eq!(number(&big), None);
    }
}
