//! Just enough tar: walking a GNU tar archive's members (ustar, pax, GNU long names, sparse) —
//! the one reader of tar headers, which the shim's import check and this crate's push and pull
//! both use — copying members with their pax access and change
//! times dropped, and writing the canonical members of a CRIU image directory.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};

/// A tar block.
pub const BLOCK: u64 = 512;
/// The most bytes of an extended header (as the import check bounds it).
const MAX_META: u64 = 1 << 20;
/// The largest size an octal size field holds.
const MAX_OCTAL_SIZE: u64 = 0o77777777777;

/// Why the members of an archive cannot be walked: it is not a whole, well-formed tar archive.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It ends before a header or a member's data does.
    #[error("it ends inside a member, or without its end-of-archive block")]
    Truncated,
    /// It cannot be read.
    #[error("cannot read it at offset {at}: {source}")]
    Read {
        /// Where.
        at: u64,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Extended headers with no member after them.
    #[error("an extended header is followed by the end of the archive")]
    MetaAtEnd,
    /// A header block whose checksum does not hold.
    #[error("the header at offset {at} has a wrong checksum")]
    Checksum {
        /// The header's offset.
        at: u64,
    },
    /// A header whose size field is no number.
    #[error("the header at offset {at} has a size that is no number")]
    HeaderSize {
        /// The header's offset.
        at: u64,
    },
    /// An extended header past [`MAX_META`] bytes.
    #[error("the extended header at offset {at} is over 1 MiB")]
    MetaOverLimit {
        /// The header's offset.
        at: u64,
    },
    /// A pax header whose records do not parse.
    #[error("the pax header at offset {at} is malformed")]
    Pax {
        /// The header's offset.
        at: u64,
    },
    /// A member whose pax size is no number.
    #[error("the member {member:?} has a pax size that is no number")]
    PaxSize {
        /// The member.
        member: String,
    },
    /// An old GNU sparse member whose apparent size is no number.
    #[error("the member {member:?} has a sparse size that is no number")]
    SparseSize {
        /// The member.
        member: String,
    },
    /// A member whose data would end past any offset.
    #[error("the member {member:?} has an impossible size")]
    Size {
        /// The member.
        member: String,
    },
}

/// An extended header before a member (`x`, `g`, `L`, `K`): its header block and its data.
#[derive(Clone, Debug)]
pub struct Meta {
    /// The header block.
    pub header: [u8; 512],
    /// Its data.
    pub data: Vec<u8>,
}

/// A member of an archive.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Offset of its first block (its extended headers included).
    pub start: u64,
    /// Offset of its own header block.
    pub header_at: u64,
    /// Offset of its data.
    pub data_at: u64,
    /// Offset past its padded data.
    pub end: u64,
    /// Its name as the archive gives it (pax path, GNU long name or ustar prefix/name).
    pub name: String,
    /// [`Entry::name`] without `./` or a trailing `/`.
    pub path: String,
    /// What it links to (pax linkpath, GNU long link name or ustar link name), as given.
    pub link: String,
    /// Its type flag.
    pub kind: u8,
    /// Bytes of data in the archive (0 for members that carry none).
    pub size: u64,
    /// Bytes it unpacks to: a sparse member's apparent size, else [`Entry::size`] (0 for
    /// members that carry no data).
    pub apparent: u64,
    /// Its extended headers, in order.
    pub metas: Vec<Meta>,
    /// Whether it is a sparse member (GNU sparse in pax records, or old GNU `S`).
    pub sparse: bool,
}

impl Entry {
    /// Whether it is a regular file (contiguous or not).
    pub fn is_file(&self) -> bool {
        matches!(self.kind, b'0' | b'\0' | b'7')
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.kind == b'5'
    }

    /// Whether its type carries data (regular, contiguous and old GNU sparse files): links,
    /// dirs, devices and fifos have none, whatever their size field says.
    pub fn has_data(&self) -> bool {
        has_data(self.kind)
    }
}

fn has_data(kind: u8) -> bool {
    matches!(kind, b'0' | b'\0' | b'7' | b'S')
}

/// Walks the members of the archive in `file` from offset `at`, up to its end-of-archive block.
pub struct Walker<'a> {
    file: &'a mut File,
    at: u64,
    /// Where the end-of-archive block was found, once it was.
    pub end: Option<u64>,
}

impl<'a> Walker<'a> {
    /// A walker of the archive starting at `at` in `file`.
    pub fn new(file: &'a mut File, at: u64) -> Self {
        Self {
            file,
            at,
            end: None,
        }
    }

    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        self.file
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.file.read_exact(buf))
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::UnexpectedEof => ReadError::Truncated,
                _ => ReadError::Read { at, source },
            })
    }

    /// The next member; `None` at the end-of-archive block (its offset in [`Walker::end`]).
    pub fn next_entry(&mut self) -> Result<Option<Entry>, ReadError> {
        if self.end.is_some() {
            return Ok(None);
        }
        let start = self.at;
        let mut metas = Vec::new();
        let mut block = [0u8; 512];
        loop {
            let at = self.at;
            self.read_at(at, &mut block)?;
            if block.iter().all(|b| *b == 0) {
                if !metas.is_empty() {
                    return Err(ReadError::MetaAtEnd);
                }
                self.end = Some(at);
                return Ok(None);
            }
            if !checksum_ok(&block) {
                return Err(ReadError::Checksum { at });
            }
            let kind = block[156];
            let header_size = number(&block[124..136]).ok_or(ReadError::HeaderSize { at })?;
            if matches!(kind, b'x' | b'g' | b'L' | b'K') {
                if header_size > MAX_META {
                    return Err(ReadError::MetaOverLimit { at });
                }
                let mut data = vec![0u8; header_size as usize];
                self.read_at(at + BLOCK, &mut data)?;
                if kind == b'x' && pax_record_list(&data).is_none() {
                    return Err(ReadError::Pax { at });
                }
                self.at = at + BLOCK + padded(header_size);
                metas.push(Meta {
                    header: block,
                    data,
                });
                continue;
            }
            let mut pax = std::collections::HashMap::new();
            let (mut long_name, mut long_link) = (None, None);
            for m in &metas {
                match m.header[156] {
                    b'x' => pax.extend(pax_records(&m.data)),
                    b'L' => long_name = Some(c_string(&m.data)),
                    b'K' => long_link = Some(c_string(&m.data)),
                    _ => {}
                }
            }
            let sparse = kind == b'S' || pax.keys().any(|k| k.starts_with("GNU.sparse."));
            let name = pax
                .remove("GNU.sparse.name")
                .or_else(|| pax.remove("path"))
                .or(long_name)
                .unwrap_or_else(|| ustar_name(&block));
            let link = pax
                .remove("linkpath")
                .or(long_link)
                .unwrap_or_else(|| c_string(&block[157..257]));
            let size = match pax.remove("size") {
                Some(s) => s.parse().map_err(|_| ReadError::PaxSize {
                    member: name.clone(),
                })?,
                None => header_size,
            };
            let mut apparent = pax
                .remove("GNU.sparse.realsize")
                .or_else(|| pax.remove("GNU.sparse.size"))
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(size);
            let mut data_at = at + BLOCK;
            if kind == b'S' {
                // Old GNU sparse: the apparent size in the header, maybe more map blocks after it.
                apparent = number(&block[483..495]).ok_or_else(|| ReadError::SparseSize {
                    member: name.clone(),
                })?;
                let mut extended = block[482] != 0;
                let mut ext = [0u8; 512];
                while extended {
                    self.read_at(data_at, &mut ext)?;
                    data_at += BLOCK;
                    extended = ext[504] != 0;
                }
            }
            let (size, apparent) = if has_data(kind) {
                (size, apparent)
            } else {
                (0, 0)
            };
            let end = size
                .checked_next_multiple_of(BLOCK)
                .and_then(|padded| data_at.checked_add(padded))
                .ok_or_else(|| ReadError::Size {
                    member: name.clone(),
                })?;
            self.at = end;
            let path = name
                .strip_prefix("./")
                .unwrap_or(&name)
                .trim_end_matches('/')
                .to_string();
            return Ok(Some(Entry {
                start,
                header_at: at,
                data_at,
                end,
                name,
                path,
                link,
                kind,
                size,
                apparent,
                metas,
                sparse,
            }));
        }
    }
}

/// `size` rounded up to whole blocks.
pub fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK) * BLOCK
}

fn checksum_ok(block: &[u8; 512]) -> bool {
    let Some(want) = number(&block[148..156]) else {
        return false;
    };
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
    sum == want
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

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

fn ustar_name(block: &[u8; 512]) -> String {
    let name = c_string(&block[0..100]);
    if &block[257..262] == b"ustar" {
        let prefix = c_string(&block[345..500]);
        if !prefix.is_empty() {
            return format!("{prefix}/{name}");
        }
    }
    name
}

/// The records of a pax extended header, in order (`<len> <key>=<value>\n`).
fn pax_record_list(data: &[u8]) -> Option<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return None;
        }
        let record = &rest[sp + 1..len - 1];
        let eq = record.iter().position(|b| *b == b'=')?;
        out.push((
            String::from_utf8_lossy(&record[..eq]).into_owned(),
            record[eq + 1..].to_vec(),
        ));
        rest = &rest[len..];
    }
    Some(out)
}

fn pax_records(data: &[u8]) -> Vec<(String, String)> {
    pax_record_list(data)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect()
}

/// One pax record, its length prefix counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + body.to_string().len();
    if len.to_string().len() + body != len {
        len = body + len.to_string().len();
    }
    let mut out = format!("{len} {key}=").into_bytes();
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

fn set_checksum(block: &mut [u8; 512]) {
    block[148..156].fill(b' ');
    let sum: u64 = block.iter().map(|b| u64::from(*b)).sum();
    block[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

fn octal(field: &mut [u8], n: u64) {
    let digits = field.len() - 1;
    field.copy_from_slice(format!("{n:0digits$o}\0").as_bytes());
}

/// Copies `n` bytes from offset `at` of `src` to `out`.
pub fn copy_range(src: &mut File, at: u64, n: u64, out: &mut impl Write) -> std::io::Result<()> {
    src.seek(SeekFrom::Start(at))?;
    let copied = std::io::copy(&mut Read::by_ref(src).take(n), out)?;
    if copied != n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Copies `entry` of `src` to `out` with the access and change times of its pax headers
/// dropped (they change whenever the store is read, and would make the same member's bytes
/// differ from one export to the next); everything else as it is.
pub fn copy_normalized(src: &mut File, entry: &Entry, out: &mut impl Write) -> std::io::Result<()> {
    for m in &entry.metas {
        let mut header = m.header;
        let data = if header[156] == b'x' {
            match pax_record_list(&m.data) {
                Some(records) => {
                    let kept: Vec<u8> = records
                        .iter()
                        .filter(|(k, _)| k != "atime" && k != "ctime")
                        .flat_map(|(k, v)| pax_record(k, v))
                        .collect();
                    if kept.is_empty() {
                        continue;
                    }
                    kept
                }
                None => m.data.clone(),
            }
        } else {
            m.data.clone()
        };
        octal(&mut header[124..136], data.len() as u64);
        set_checksum(&mut header);
        out.write_all(&header)?;
        out.write_all(&data)?;
        out.write_all(&vec![
            0u8;
            (padded(data.len() as u64) - data.len() as u64)
                as usize
        ])?;
    }
    let mut header = [0u8; 512];
    src.seek(SeekFrom::Start(entry.header_at))?;
    src.read_exact(&mut header)?;
    if unpid(&mut header) {
        set_checksum(&mut header);
    }
    out.write_all(&header)?;
    copy_range(
        src,
        entry.header_at + BLOCK,
        entry.end - entry.header_at - BLOCK,
        out,
    )
}

/// Replaces the process id GNU tar puts in the names of some headers (`GNUSparseFile.<pid>`
/// before a sparse member's pax name, `PaxHeaders.<pid>` in older versions) by 0, in a header
/// block's name and prefix fields; true if it changed any. Those names are never extracted:
/// the pax name is.
fn unpid(header: &mut [u8; 512]) -> bool {
    let mut changed = false;
    for range in [0..100, 345..500] {
        let field = &mut header[range];
        let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
        let mut text = field[..end].to_vec();
        for marker in [&b"GNUSparseFile."[..], &b"PaxHeaders."[..]] {
            let mut at = 0;
            while let Some(i) = text[at..]
                .windows(marker.len())
                .position(|w| w == marker)
                .map(|i| at + i + marker.len())
            {
                let digits = text[i..].iter().take_while(|b| b.is_ascii_digit()).count();
                if digits > 0 && &text[i..i + digits] != b"0" {
                    text.splice(i..i + digits, [b'0']);
                    changed = true;
                }
                at = i;
            }
        }
        if changed {
            field.fill(0);
            field[..text.len()].copy_from_slice(&text);
        }
    }
    changed
}

/// The header (with a pax header before it where the name or size does not fit ustar) of a
/// canonical member: owner root, time 0, `mode`, `kind` (`b'0'` file, `b'5'` dir).
fn canonical_header(path: &str, kind: u8, mode: u32, size: u64) -> Vec<u8> {
    let mut records = Vec::new();
    let mut block = [0u8; 512];
    let fits = |s: &str, n: usize| s.len() <= n;
    if fits(path, 100) {
        block[..path.len()].copy_from_slice(path.as_bytes());
    } else if let Some(i) = path
        .char_indices()
        .filter(|(_, c)| *c == '/')
        .map(|(i, _)| i)
        .find(|&i| fits(&path[..i], 155) && fits(&path[i + 1..], 100) && i + 1 < path.len())
    {
        block[345..345 + i].copy_from_slice(&path.as_bytes()[..i]);
        let name = &path[i + 1..];
        block[..name.len()].copy_from_slice(name.as_bytes());
    } else {
        records.extend(pax_record("path", path.as_bytes()));
        let tail = &path.as_bytes()[path.len().saturating_sub(90)..];
        block[..tail.len()].copy_from_slice(tail);
    }
    octal(&mut block[100..108], u64::from(mode));
    octal(&mut block[108..116], 0);
    octal(&mut block[116..124], 0);
    if size > MAX_OCTAL_SIZE {
        records.extend(pax_record("size", size.to_string().as_bytes()));
        octal(&mut block[124..136], 0);
    } else {
        octal(&mut block[124..136], size);
    }
    octal(&mut block[136..148], 0);
    block[156] = kind;
    block[257..263].copy_from_slice(b"ustar\0");
    block[263..265].copy_from_slice(b"00");
    set_checksum(&mut block);
    let mut out = Vec::new();
    if !records.is_empty() {
        let mut x = [0u8; 512];
        let name = b"PaxHeaders/canonical";
        x[..name.len()].copy_from_slice(name);
        octal(&mut x[100..108], 0o600);
        octal(&mut x[108..116], 0);
        octal(&mut x[116..124], 0);
        octal(&mut x[124..136], records.len() as u64);
        octal(&mut x[136..148], 0);
        x[156] = b'x';
        x[257..263].copy_from_slice(b"ustar\0");
        x[263..265].copy_from_slice(b"00");
        set_checksum(&mut x);
        out.extend_from_slice(&x);
        let n = records.len() as u64;
        out.extend(records);
        out.resize(out.len() + (padded(n) - n) as usize, 0);
    }
    out.extend_from_slice(&block);
    out
}

/// Writes a canonical directory member `path` (mode 0700).
pub fn write_dir(out: &mut impl Write, path: &str) -> std::io::Result<()> {
    out.write_all(&canonical_header(&format!("{path}/"), b'5', 0o700, 0))
}

/// Writes a canonical file member `path` (mode 0600) of `size` bytes read from `data`.
pub fn write_file(
    out: &mut impl Write,
    path: &str,
    size: u64,
    data: &mut impl Read,
) -> std::io::Result<()> {
    out.write_all(&canonical_header(path, b'0', 0o600, size))?;
    let copied = std::io::copy(&mut data.take(size), out)?;
    if copied != size {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    out.write_all(&vec![0u8; (padded(size) - size) as usize])
}

/// Writes the end-of-archive blocks.
pub fn write_end(out: &mut impl Write) -> std::io::Result<()> {
    out.write_all(&[0u8; 1024])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn walk(path: &std::path::Path) -> Vec<Entry> {
        let mut f = File::open(path).unwrap();
        let mut w = Walker::new(&mut f, 0);
        let mut out = Vec::new();
        while let Some(e) = w.next_entry().unwrap() {
            out.push(e);
        }
        assert!(w.end.is_some());
        out
    }

    #[test]
    fn pax_records_count_their_own_length() {
        for v in [0usize, 1, 5, 6, 7, 90, 93, 94, 95, 1000] {
            let r = pax_record("path", &vec![b'a'; v]);
            let len: usize = std::str::from_utf8(&r[..r.iter().position(|b| *b == b' ').unwrap()])
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(len, r.len(), "value of {v}");
            assert_eq!(pax_record_list(&r).unwrap()[0].1.len(), v);
        }
    }

    /// Canonical members are read back by GNU tar as written: long names, a dir, files.
    #[test]
    fn canonical_members_are_what_gnu_tar_reads() {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("a.tar");
        let long = format!("checkpoints/default/{}/12/criu", "c".repeat(64));
        let longer = format!("checkpoints/{}/{}/1/criu", "n".repeat(100), "c".repeat(100));
        let mut out = File::create(&tar).unwrap();
        for p in [&long, &longer] {
            write_dir(&mut out, p).unwrap();
            write_file(&mut out, &format!("{p}/pages-1.img"), 5, &mut &b"hello"[..]).unwrap();
            write_file(&mut out, &format!("{p}/empty.img"), 0, &mut &b""[..]).unwrap();
        }
        write_end(&mut out).unwrap();
        drop(out);
        let listed = Command::new("tar").arg("-tvf").arg(&tar).output().unwrap();
        assert!(
            listed.status.success(),
            "{}",
            String::from_utf8_lossy(&listed.stderr)
        );
        let listed = String::from_utf8(listed.stdout).unwrap();
        assert!(listed.contains(&format!("{long}/pages-1.img")), "{listed}");
        assert!(
            listed.contains(&format!("{longer}/pages-1.img")),
            "{listed}"
        );
        let entries = walk(&tar);
        assert_eq!(entries.len(), 6);
        assert_eq!(entries[0].path, long);
        assert!(entries[0].is_dir());
        assert_eq!(entries[1].path, format!("{long}/pages-1.img"));
        assert_eq!(entries[1].size, 5);
        assert_eq!(entries[4].path, format!("{longer}/pages-1.img"));
        let x = tempfile::tempdir().unwrap();
        let ok = Command::new("tar")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(x.path())
            .status()
            .unwrap();
        assert!(ok.success());
        assert_eq!(
            std::fs::read(x.path().join(&long).join("pages-1.img")).unwrap(),
            b"hello"
        );
    }

    /// GNU tar's posix members, copied without atime and ctime: the same bytes from two
    /// archives of the same tree taken at different times, and still an archive GNU tar reads.
    #[test]
    fn normalized_copies_of_the_same_tree_are_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("checkpoints/ns/c/1/fs/d")).unwrap();
        std::fs::write(src.join("checkpoints/ns/c/1/fs/d/f"), b"data").unwrap();
        // A sparse member: GNU tar names its header after its own pid.
        let sparse = File::create(src.join("checkpoints/ns/c/1/fs/holes")).unwrap();
        sparse.set_len(1 << 20).unwrap();
        (&sparse).write_all(b"head").unwrap();
        drop(sparse);
        let archive = |name: &str| {
            let p = dir.path().join(name);
            let ok = Command::new("tar")
                .args([
                    "--create",
                    "--format=posix",
                    "--xattrs",
                    "--xattrs-include=*",
                ])
                .args(["--numeric-owner", "--sparse", "--file"])
                .arg(&p)
                .arg("--directory")
                .arg(&src)
                .arg("checkpoints/ns/c/1")
                .status()
                .unwrap();
            assert!(ok.success());
            p
        };
        let a = archive("a.tar");
        // A new access time and change time on every member.
        std::thread::sleep(std::time::Duration::from_millis(20));
        for p in ["checkpoints/ns/c/1", "checkpoints/ns/c/1/fs/d/f"] {
            let f = src.join(p);
            let t = std::fs::metadata(&f).unwrap().modified().unwrap();
            File::options()
                .read(true)
                .open(&f)
                .and_then(|f| {
                    f.set_times(
                        std::fs::FileTimes::new()
                            .set_accessed(std::time::SystemTime::now())
                            .set_modified(t),
                    )
                })
                .unwrap();
        }
        let b = archive("b.tar");
        assert_ne!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        let normalized = |p: &std::path::Path| {
            let mut f = File::open(p).unwrap();
            let mut out = Vec::new();
            for e in walk(p) {
                copy_normalized(&mut f, &e, &mut out).unwrap();
            }
            write_end(&mut out).unwrap();
            out
        };
        let (na, nb) = (normalized(&a), normalized(&b));
        assert_eq!(na, nb);
        let n = dir.path().join("n.tar");
        std::fs::write(&n, &na).unwrap();
        let listed = Command::new("tar").arg("-tf").arg(&n).output().unwrap();
        assert!(listed.status.success());
        assert!(String::from_utf8_lossy(&listed.stdout).contains("checkpoints/ns/c/1/fs/d/f"));
        assert!(!String::from_utf8_lossy(&na).contains("atime="));
        assert!(String::from_utf8_lossy(&na).contains("GNUSparseFile.0/holes"));
        let x = dir.path().join("x");
        std::fs::create_dir(&x).unwrap();
        let ok = Command::new("tar")
            .args(["--extract", "--sparse", "--file"])
            .arg(&n)
            .arg("--directory")
            .arg(&x)
            .status()
            .unwrap();
        assert!(ok.success());
        let holes = std::fs::read(x.join("checkpoints/ns/c/1/fs/holes")).unwrap();
        assert_eq!((holes.len(), &holes[..4]), (1 << 20, &b"head"[..]));
    }

    #[test]
    fn a_corrupt_header_or_a_missing_end_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.tar");
        let mut out = Vec::new();
        write_file(&mut out, "checkpoints/x", 3, &mut &b"abc"[..]).unwrap();
        std::fs::write(&p, &out).unwrap();
        let mut f = File::open(&p).unwrap();
        let e = Walker::new(&mut f, 0).next_entry().unwrap();
        assert!(e.is_some());
        let mut w = Walker::new(&mut f, 0);
        w.next_entry().unwrap();
        assert!(matches!(w.next_entry(), Err(ReadError::Truncated)));
        out[10] ^= 1;
        std::fs::write(&p, &out).unwrap();
        let mut f = File::open(&p).unwrap();
        assert!(matches!(
            Walker::new(&mut f, 0).next_entry(),
            Err(ReadError::Checksum { at: 0 })
        ));
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

    /// Links (long ones through pax or GNU `K` headers) and sparse members' apparent sizes (pax
    /// or old GNU), as GNU tar writes them.
    #[test]
    fn links_and_sparse_sizes_are_read_as_gnu_tar_wrote_them() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let deep = format!("checkpoints/{}", "d".repeat(120));
        std::fs::create_dir_all(src.join(&deep)).unwrap();
        std::fs::write(src.join(&deep).join("f"), b"data").unwrap();
        std::os::unix::fs::symlink(format!("{deep}/f"), src.join("checkpoints/s")).unwrap();
        std::fs::hard_link(src.join(&deep).join("f"), src.join("checkpoints/h")).unwrap();
        let holes = File::create(src.join("checkpoints/holes")).unwrap();
        holes.set_len(1 << 20).unwrap();
        (&holes).write_all(b"head").unwrap();
        drop(holes);
        for format in ["posix", "gnu"] {
            let p = dir.path().join(format!("{format}.tar"));
            let ok = Command::new("tar")
                .arg(format!("--format={format}"))
                .args(["--sparse", "--sort=name", "--create", "--file"])
                .arg(&p)
                .arg("--directory")
                .arg(&src)
                .arg("checkpoints")
                .status()
                .unwrap();
            assert!(ok.success());
            let entries = walk(&p);
            let get = |path: &str| entries.iter().find(|e| e.path == path).unwrap();
            assert_eq!(get("checkpoints/s").link, format!("{deep}/f"), "{format}");
            assert_eq!(get("checkpoints/s").size, 0, "{format}");
            let h = get("checkpoints/h");
            assert_eq!((h.kind, &h.link[..]), (b'1', &format!("{deep}/f")[..]));
            assert_eq!(h.apparent, 0, "{format}");
            let holes = get("checkpoints/holes");
            assert!(holes.sparse, "{format}");
            assert_eq!(holes.apparent, 1 << 20, "{format}");
            assert!(holes.size < 1 << 20, "{format}");
            assert_eq!(get(&format!("{deep}/f")).apparent, 4, "{format}");
            assert!(get(&deep).is_dir() && get(&deep).apparent == 0);
        }
    }

    /// A pax header whose records do not parse is refused (rather than read without them), as
    /// is one the archive ends after; the member's raw name is kept beside its path.
    #[test]
    fn a_malformed_pax_header_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.tar");
        let long = format!("./checkpoints/{}/x", "n".repeat(200));
        let mut out = Vec::new();
        write_file(&mut out, &long, 1, &mut &b"x"[..]).unwrap();
        write_end(&mut out).unwrap();
        std::fs::write(&p, &out).unwrap();
        let e = &walk(&p)[0];
        assert_eq!((e.name.as_str(), e.path.as_str()), (&long[..], &long[2..]));
        // The pax header's data starts at offset 512: break its first record's length.
        out[512] = b'x';
        std::fs::write(&p, &out).unwrap();
        let mut f = File::open(&p).unwrap();
        assert!(matches!(
            Walker::new(&mut f, 0).next_entry(),
            Err(ReadError::Pax { at: 0 })
        ));
        // Only the pax header, then the end.
        let mut out = Vec::new();
        let mut member = Vec::new();
        write_file(&mut member, &long, 0, &mut &b""[..]).unwrap();
        out.extend_from_slice(&member[..1024]);
        write_end(&mut out).unwrap();
        std::fs::write(&p, &out).unwrap();
        let mut f = File::open(&p).unwrap();
        assert!(matches!(
            Walker::new(&mut f, 0).next_entry(),
            Err(ReadError::MetaAtEnd)
        ));
    }
}
