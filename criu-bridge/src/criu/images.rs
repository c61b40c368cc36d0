//! A bounded reader for the few CRIU images that decide what a restored task may do: the process
//! tree (`pstree.img`), each thread's core (`core-<tid>.img`: credentials, seccomp mode, comm), the namespaces of
//! each task (`ids-<pid>.img`, `inventory.img`) and the mount table (`mountpoints-<id>.img`). Only the fields Belayer checks are modelled; the
//! tags are those of CRIU's `images/*.proto` (CRIU 4.x), unknown fields are skipped.
//!
//! An image file is a head magic (`IMG_COMMON_MAGIC`; absent in CRIU's v1 images), the image's
//! own magic, then entries, each a little-endian `u32` length and a protobuf message. Every
//! length is bounded before anything is allocated: the images come from untrusted archives.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// `IMG_COMMON_MAGIC` of `criu/include/magic.h`: heads every non-service image.
pub const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `INVENTORY_MAGIC` (the inventory has no head magic).
pub const INVENTORY_MAGIC: u32 = 0x5831_3116;
/// `IDS_MAGIC`.
pub const IDS_MAGIC: u32 = 0x5443_2030;
/// `PSTREE_MAGIC`.
pub const PSTREE_MAGIC: u32 = 0x5027_3030;
/// `CORE_MAGIC`.
pub const CORE_MAGIC: u32 = 0x5505_3847;
/// `MNTS_MAGIC`.
pub const MNTS_MAGIC: u32 = 0x5556_3928;
/// `USERNS_MAGIC` of CRIU's `magic.h` (`userns-<id>.img`).
pub const USERNS_MAGIC: u32 = 0x5547_4906;
/// `SECCOMP_MAGIC` of CRIU's `magic.h` (`seccomp.img`).
pub const SECCOMP_MAGIC: u32 = 0x6441_3049;
/// `FILES_MAGIC` of CRIU's `magic.h` (`files.img`: every file of the dump).
pub const FILES_MAGIC: u32 = 0x5630_3138;
/// `REMAP_FPATH_MAGIC` of CRIU's `magic.h` (`remap-fpath.img`).
pub const REMAP_FPATH_MAGIC: u32 = 0x5913_3954;
/// `fd_types.REG` of `fdinfo.proto`.
pub const FD_TYPE_REG: i32 = 1;
/// `remap_type.LINKED` of `remap-file-path.proto`.
pub const REMAP_TYPE_LINKED: i32 = 0;
/// The largest entry read: CRIU's core and pstree entries are a few KiB.
pub const MAX_ENTRY: u32 = 16 << 20;
/// The most entries read from one image (tasks of a tree, mounts of a namespace).
pub const MAX_ENTRIES: usize = 65_536;
/// The largest image file opened (a bound on what is read in total).
pub const MAX_IMAGE_FILE: u64 = 64 << 20;

/// `seccomp_mode.filter` of `core.proto`.
pub const SECCOMP_MODE_FILTER: i32 = 2;
/// The kernel's `SECCOMP_FILTER_FLAG_TSYNC`: installing the filter installs it on every thread
/// of the process.
pub const SECCOMP_FILTER_FLAG_TSYNC: u32 = 1;

/// Why a CRIU image cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The file cannot be opened or read.
    #[error("cannot read CRIU image {path}")]
    Io {
        /// The image file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Not a regular file (a symlink, a device, a fifo): refused without reading it.
    #[error("CRIU image {path} is not a regular file")]
    NotAFile {
        /// The image file.
        path: PathBuf,
    },
    /// The magic numbers are not those of the expected image.
    #[error("CRIU image {path} has magic {found:#010x}, expected {expected:#010x}")]
    Magic {
        /// The image file.
        path: PathBuf,
        /// What the file holds.
        found: u32,
        /// The image's magic.
        expected: u32,
    },
    /// A bound is exceeded (file size, entry size or entry count).
    #[error("CRIU image {path} exceeds a bound: {what}")]
    TooLarge {
        /// The image file.
        path: PathBuf,
        /// Which bound.
        what: String,
    },
    /// The file ends inside an entry.
    #[error("CRIU image {path} is truncated in entry {entry}")]
    Truncated {
        /// The image file.
        path: PathBuf,
        /// The entry's index.
        entry: usize,
    },
    /// An entry is not a valid protobuf message of its type.
    #[error("CRIU image {path}: entry {entry} does not decode")]
    Decode {
        /// The image file.
        path: PathBuf,
        /// The entry's index.
        entry: usize,
        /// The cause.
        #[source]
        source: prost::DecodeError,
    },
    /// The image holds no entry where one is required.
    #[error("CRIU image {path} has no entry")]
    Empty {
        /// The image file.
        path: PathBuf,
    },
}

/// `creds_entry` of `creds.proto`: one thread's credentials.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CredsEntry {
    /// Real uid.
    #[prost(uint32, required, tag = "1")]
    pub uid: u32,
    /// Real gid.
    #[prost(uint32, required, tag = "2")]
    pub gid: u32,
    /// Effective uid.
    #[prost(uint32, required, tag = "3")]
    pub euid: u32,
    /// Effective gid.
    #[prost(uint32, required, tag = "4")]
    pub egid: u32,
    /// Saved uid.
    #[prost(uint32, required, tag = "5")]
    pub suid: u32,
    /// Saved gid.
    #[prost(uint32, required, tag = "6")]
    pub sgid: u32,
    /// Filesystem uid.
    #[prost(uint32, required, tag = "7")]
    pub fsuid: u32,
    /// Filesystem gid.
    #[prost(uint32, required, tag = "8")]
    pub fsgid: u32,
    /// Inheritable capabilities, 32 bits a word, low word first.
    #[prost(uint32, repeated, packed = "false", tag = "9")]
    pub cap_inh: Vec<u32>,
    /// Permitted capabilities.
    #[prost(uint32, repeated, packed = "false", tag = "10")]
    pub cap_prm: Vec<u32>,
    /// Effective capabilities.
    #[prost(uint32, repeated, packed = "false", tag = "11")]
    pub cap_eff: Vec<u32>,
    /// Bounding set.
    #[prost(uint32, repeated, packed = "false", tag = "12")]
    pub cap_bnd: Vec<u32>,
    /// Securebits (`prctl(PR_GET_SECUREBITS)`).
    #[prost(uint32, required, tag = "13")]
    pub secbits: u32,
    /// Supplementary groups.
    #[prost(uint32, repeated, packed = "false", tag = "14")]
    pub groups: Vec<u32>,
    /// The LSM profile (`/proc/<pid>/attr/current`).
    #[prost(string, optional, tag = "15")]
    pub lsm_profile: Option<String>,
    /// The LSM socket-creation label.
    #[prost(string, optional, tag = "16")]
    pub lsm_sockcreate: Option<String>,
    /// AppArmor policy data.
    #[prost(bytes = "vec", optional, tag = "17")]
    pub apparmor_data: Option<Vec<u8>>,
    /// `prctl(PR_GET_NO_NEW_PRIVS)`; absent in images of CRIU before 3.x.
    #[prost(uint32, optional, tag = "18")]
    pub no_new_privs: Option<u32>,
    /// Ambient capabilities.
    #[prost(uint32, repeated, packed = "false", tag = "19")]
    pub cap_amb: Vec<u32>,
}

/// `thread_core_entry` of `core.proto`, the fields checked.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadCoreEntry {
    /// The thread's credentials (CRIU 1.x and later keep them here).
    #[prost(message, optional, tag = "10")]
    pub creds: Option<CredsEntry>,
    /// `seccomp_mode`: 0 disabled, 1 strict, 2 filter.
    #[prost(int32, optional, tag = "11")]
    pub seccomp_mode: Option<i32>,
    /// Index in `seccomp.img` of the newest filter of the thread's chain.
    #[prost(uint32, optional, tag = "12")]
    pub seccomp_filter: Option<u32>,
    /// The thread's comm.
    #[prost(string, optional, tag = "13")]
    pub comm: Option<String>,
}

/// `seccomp_filter` of `seccomp.proto`, without the BPF program itself.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SeccompFilter {
    /// Index of the filter installed before this one in the same chain.
    #[prost(uint32, optional, tag = "2")]
    pub prev: Option<u32>,
    /// The flags CRIU installs it with (`SECCOMP_FILTER_FLAG_*`).
    #[prost(uint32, optional, tag = "3")]
    pub flags: Option<u32>,
}

/// `seccomp_entry` of `seccomp.proto`: every filter of the dump.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SeccompEntry {
    /// The filters, indexed by `thread_core_entry.seccomp_filter` and `prev`.
    #[prost(message, repeated, tag = "1")]
    pub seccomp_filters: Vec<SeccompFilter>,
}

/// `task_core_entry` of `core.proto` (the thread-group leader's core only).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskCoreEntry {
    /// CRIU's task state (`COMPEL_TASK_*`: 1 alive, 2 dead, 3 stopped, 6 zombie).
    #[prost(uint32, optional, tag = "1")]
    pub task_state: Option<u32>,
    /// The task's comm.
    #[prost(string, optional, tag = "6")]
    pub comm: Option<String>,
    /// The seccomp mode of images written before it was per thread.
    #[prost(int32, optional, tag = "11")]
    pub old_seccomp_mode: Option<i32>,
}

/// `task_kobj_ids_entry` of `core.proto`: the namespaces a task is in, as CRIU's ids.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TaskKobjIdsEntry {
    /// Pid namespace.
    #[prost(uint32, optional, tag = "5")]
    pub pid_ns_id: Option<u32>,
    /// Network namespace.
    #[prost(uint32, optional, tag = "6")]
    pub net_ns_id: Option<u32>,
    /// IPC namespace.
    #[prost(uint32, optional, tag = "7")]
    pub ipc_ns_id: Option<u32>,
    /// UTS namespace.
    #[prost(uint32, optional, tag = "8")]
    pub uts_ns_id: Option<u32>,
    /// Mount namespace.
    #[prost(uint32, optional, tag = "9")]
    pub mnt_ns_id: Option<u32>,
    /// User namespace.
    #[prost(uint32, optional, tag = "10")]
    pub user_ns_id: Option<u32>,
    /// Cgroup namespace.
    #[prost(uint32, optional, tag = "11")]
    pub cgroup_ns_id: Option<u32>,
    /// Time namespace.
    #[prost(uint32, optional, tag = "12")]
    pub time_ns_id: Option<u32>,
}

impl TaskKobjIdsEntry {
    /// The id of namespace `kind` (an OCI namespace type: `pid`, `network`, ...).
    pub fn of(&self, kind: &str) -> Option<u32> {
        match kind {
            "pid" => self.pid_ns_id,
            "network" => self.net_ns_id,
            "ipc" => self.ipc_ns_id,
            "uts" => self.uts_ns_id,
            "mount" => self.mnt_ns_id,
            "user" => self.user_ns_id,
            "cgroup" => self.cgroup_ns_id,
            "time" => self.time_ns_id,
            _ => None,
        }
    }
}

/// `uid_gid_extent` of `userns.proto`: one line of a uid or gid map.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, prost::Message)]
pub struct UidGidExtent {
    /// First id inside the namespace.
    #[prost(uint32, required, tag = "1")]
    pub first: u32,
    /// First id outside (in the parent namespace).
    #[prost(uint32, required, tag = "2")]
    pub lower_first: u32,
    /// How many ids.
    #[prost(uint32, required, tag = "3")]
    pub count: u32,
}

/// `userns_entry` of `userns.proto`: the maps CRIU writes into a user namespace it creates.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UsernsEntry {
    /// `uid_map`.
    #[prost(message, repeated, tag = "1")]
    pub uid_map: Vec<UidGidExtent>,
    /// `gid_map`.
    #[prost(message, repeated, tag = "2")]
    pub gid_map: Vec<UidGidExtent>,
}

/// `inventory_entry` of `inventory.proto`, the field checked.
#[derive(Clone, PartialEq, prost::Message)]
pub struct InventoryEntry {
    /// The namespaces CRIU itself was in at dump time: a task whose id equals one of these is
    /// restored in the restoring CRIU's (the host's) namespace of that kind.
    #[prost(message, optional, tag = "3")]
    pub root_ids: Option<TaskKobjIdsEntry>,
}

/// `core_entry` of `core.proto`, the fields checked.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CoreEntry {
    /// The task part (leaders only).
    #[prost(message, optional, tag = "3")]
    pub tc: Option<TaskCoreEntry>,
    /// The thread part.
    #[prost(message, optional, tag = "5")]
    pub thread_core: Option<ThreadCoreEntry>,
}

/// `pstree_entry` of `pstree.proto`: one task (thread group) of the tree.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PstreeEntry {
    /// The task's pid (in its pid namespace).
    #[prost(uint32, required, tag = "1")]
    pub pid: u32,
    /// Its parent's pid.
    #[prost(uint32, required, tag = "2")]
    pub ppid: u32,
    /// Its thread ids (the leader's included).
    #[prost(uint32, repeated, packed = "false", tag = "5")]
    pub threads: Vec<u32>,
}

/// `mnt_entry` of `mnt.proto`, the fields checked.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MntEntry {
    /// CRIU's `fstype` enum.
    #[prost(uint32, required, tag = "1")]
    pub fstype: u32,
    /// The mount's id.
    #[prost(uint32, required, tag = "2")]
    pub mnt_id: u32,
    /// Per-mount flags (`MS_RDONLY`, `MS_NOSUID`, ...).
    #[prost(uint32, required, tag = "5")]
    pub flags: u32,
    /// The mountpoint, relative to the namespace's root (CRIU writes it with a leading `.` or `/`).
    #[prost(string, required, tag = "7")]
    pub mountpoint: String,
    /// The source.
    #[prost(string, required, tag = "8")]
    pub source: String,
    /// Superblock flags.
    #[prost(uint32, optional, tag = "17")]
    pub sb_flags: Option<u32>,
}

/// `reg_file_entry` of `regfile.proto`, the fields read.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RegFileEntry {
    /// The file's id (`file_entry.id`).
    #[prost(uint32, required, tag = "1")]
    pub id: u32,
    /// Its path, relative to its mount namespace's root, with a leading `/`.
    #[prost(string, required, tag = "6")]
    pub name: String,
}

/// `file_entry` of `fdinfo.proto`, regular files only.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FileEntry {
    /// `fd_types`.
    #[prost(int32, required, tag = "1")]
    pub kind: i32,
    /// The file's id.
    #[prost(uint32, required, tag = "2")]
    pub id: u32,
    /// A regular file's entry.
    #[prost(message, optional, tag = "3")]
    pub reg: Option<RegFileEntry>,
}

/// `remap_file_path_entry` of `remap-file-path.proto`: an open file whose name was gone at the
/// dump, reached through another file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RemapFilePathEntry {
    /// The id of the file as the tasks had it open.
    #[prost(uint32, required, tag = "1")]
    pub orig_id: u32,
    /// The id of the file it is restored through.
    #[prost(uint32, required, tag = "2")]
    pub remap_id: u32,
    /// `remap_type` (`LINKED` when absent).
    #[prost(int32, optional, tag = "3")]
    pub remap_type: Option<i32>,
}

/// Opens `path` without following a symlink and checks that it is a regular file of bounded size.
fn open_image(path: &Path) -> Result<std::fs::File, ImageError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => ImageError::NotAFile { path: path.into() },
            _ => ImageError::Io {
                path: path.into(),
                source,
            },
        })?;
    let meta = f.metadata().map_err(|source| ImageError::Io {
        path: path.into(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(ImageError::NotAFile { path: path.into() });
    }
    if meta.len() > MAX_IMAGE_FILE {
        return Err(ImageError::TooLarge {
            path: path.into(),
            what: format!("{} bytes, at most {MAX_IMAGE_FILE}", meta.len()),
        });
    }
    Ok(f)
}

/// Reads every entry of the protobuf image `path` whose own magic is `magic`.
pub fn read_entries<M: prost::Message + Default>(
    path: &Path,
    magic: u32,
) -> Result<Vec<M>, ImageError> {
    let f = open_image(path)?;
    let mut data = Vec::new();
    f.take(MAX_IMAGE_FILE + 1)
        .read_to_end(&mut data)
        .map_err(|source| ImageError::Io {
            path: path.into(),
            source,
        })?;
    decode_entries(path, &data, magic)
}

/// [`read_entries`] of an image already read into `data` (`path` names it in errors).
pub fn decode_entries<M: prost::Message + Default>(
    path: &Path,
    data: &[u8],
    magic: u32,
) -> Result<Vec<M>, ImageError> {
    let mut rest = data;
    let next_u32 = |rest: &mut &[u8]| -> Option<u32> {
        let (head, tail) = rest.split_first_chunk::<4>()?;
        *rest = tail;
        Some(u32::from_le_bytes(*head))
    };
    let bad_magic = |found| ImageError::Magic {
        path: path.into(),
        found,
        expected: magic,
    };
    let mut found = next_u32(&mut rest).ok_or_else(|| bad_magic(0))?;
    // CRIU's v1 images have no head magic; v1.1 (every CRIU since 2015) do.
    if found == IMG_COMMON_MAGIC {
        found = next_u32(&mut rest).ok_or_else(|| bad_magic(0))?;
    }
    if found != magic {
        return Err(bad_magic(found));
    }
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let entry = entries.len();
        if entry >= MAX_ENTRIES {
            return Err(ImageError::TooLarge {
                path: path.into(),
                what: format!("more than {MAX_ENTRIES} entries"),
            });
        }
        let len = next_u32(&mut rest).ok_or_else(|| ImageError::Truncated {
            path: path.into(),
            entry,
        })?;
        if len > MAX_ENTRY {
            return Err(ImageError::TooLarge {
                path: path.into(),
                what: format!("entry {entry} of {len} bytes, at most {MAX_ENTRY}"),
            });
        }
        let len = len as usize;
        if rest.len() < len {
            return Err(ImageError::Truncated {
                path: path.into(),
                entry,
            });
        }
        let (msg, tail) = rest.split_at(len);
        rest = tail;
        entries.push(M::decode(msg).map_err(|source| ImageError::Decode {
            path: path.into(),
            entry,
            source,
        })?);
    }
    Ok(entries)
}

/// Encodes `entries` as an image with `magic` (the layout CRIU 4.x writes); for tests and tools
/// that rewrite images.
pub fn encode_entries<M: prost::Message>(magic: u32, entries: &[M]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&IMG_COMMON_MAGIC.to_le_bytes());
    out.extend_from_slice(&magic.to_le_bytes());
    for e in entries {
        let body = e.encode_to_vec();
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// The inventory (`dir/inventory.img`: one entry).
pub fn read_inventory(dir: &Path) -> Result<InventoryEntry, ImageError> {
    let path = dir.join("inventory.img");
    read_entries::<InventoryEntry>(&path, INVENTORY_MAGIC)?
        .into_iter()
        .next()
        .ok_or(ImageError::Empty { path })
}

/// The namespaces of task `pid` (`dir/ids-<pid>.img`), `None` where the image is absent (CRIU
/// then restores the task in its parent's).
pub fn read_ids(dir: &Path, pid: u32) -> Result<Option<TaskKobjIdsEntry>, ImageError> {
    let path = dir.join(format!("ids-{pid}.img"));
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    Ok(read_entries::<TaskKobjIdsEntry>(&path, IDS_MAGIC)?
        .into_iter()
        .next())
}

/// The maps of user namespace `id` (`dir/userns-<id>.img`: one entry); an empty entry when the
/// image is missing, as CRIU then writes no map.
pub fn read_userns(dir: &Path, id: u32) -> Result<UsernsEntry, ImageError> {
    let path = dir.join(format!("userns-{id}.img"));
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(UsernsEntry::default());
    }
    Ok(read_entries::<UsernsEntry>(&path, USERNS_MAGIC)?
        .into_iter()
        .next()
        .unwrap_or_default())
}

/// The seccomp filters of the dump (`dir/seccomp.img`: one entry), `None` where the image is
/// absent (no task had a filter).
pub fn read_seccomp(dir: &Path) -> Result<Option<SeccompEntry>, ImageError> {
    let path = dir.join("seccomp.img");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(None);
    }
    Ok(read_entries::<SeccompEntry>(&path, SECCOMP_MAGIC)?
        .into_iter()
        .next())
}

/// The tasks of `dir/pstree.img`.
pub fn read_pstree(dir: &Path) -> Result<Vec<PstreeEntry>, ImageError> {
    let path = dir.join("pstree.img");
    let tasks = read_entries::<PstreeEntry>(&path, PSTREE_MAGIC)?;
    if tasks.is_empty() {
        return Err(ImageError::Empty { path });
    }
    Ok(tasks)
}

/// The core of thread `tid` (`dir/core-<tid>.img`: one entry).
pub fn read_core(dir: &Path, tid: u32) -> Result<CoreEntry, ImageError> {
    let path = dir.join(format!("core-{tid}.img"));
    read_entries::<CoreEntry>(&path, CORE_MAGIC)?
        .into_iter()
        .next()
        .ok_or(ImageError::Empty { path })
}

/// The mounts of every `dir/mountpoints-<id>.img` (one per mount namespace), with their file.
pub fn read_mounts(dir: &Path) -> Result<Vec<(PathBuf, Vec<MntEntry>)>, ImageError> {
    let io = |source| ImageError::Io {
        path: dir.into(),
        source,
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        let name = e.map_err(io)?.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("mountpoints-") && name.ends_with(".img") {
            if out.len() >= MAX_ENTRIES {
                return Err(ImageError::TooLarge {
                    path: dir.into(),
                    what: format!("more than {MAX_ENTRIES} mount namespaces"),
                });
            }
            let path = dir.join(&*name);
            let mounts = read_entries::<MntEntry>(&path, MNTS_MAGIC)?;
            out.push((path, mounts));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The link remaps of the dump in `dir`: `(the path the file was open under, the link CRIU made
/// to restore it through)`, both relative to their mount namespace's root. Empty where CRIU
/// wrote no `remap-fpath.img`.
pub fn read_link_remaps(dir: &Path) -> Result<Vec<(String, String)>, ImageError> {
    let path = dir.join("remap-fpath.img");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(Vec::new());
    }
    let remaps = read_entries::<RemapFilePathEntry>(&path, REMAP_FPATH_MAGIC)?;
    let linked: Vec<_> = remaps
        .iter()
        .filter(|r| r.remap_type.unwrap_or(REMAP_TYPE_LINKED) == REMAP_TYPE_LINKED)
        .collect();
    if linked.is_empty() {
        return Ok(Vec::new());
    }
    let files = read_entries::<FileEntry>(&dir.join("files.img"), FILES_MAGIC)?;
    let name = |id: u32| {
        files
            .iter()
            .find(|f| f.id == id && f.kind == FD_TYPE_REG)
            .and_then(|f| f.reg.as_ref())
            .map(|r| r.name.clone())
    };
    Ok(linked
        .into_iter()
        .filter_map(|r| Some((name(r.orig_id)?, name(r.remap_id)?)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn creds() -> CredsEntry {
        CredsEntry {
            cap_eff: vec![0x2000_0020, 0],
            cap_bnd: vec![u32::MAX, 0x1ff],
            no_new_privs: Some(1),
            groups: vec![0, 10],
            ..Default::default()
        }
    }

    #[test]
    fn link_remaps_name_the_removed_file_and_its_link() {
        let d = tempfile::tempdir().unwrap();
        assert!(read_link_remaps(d.path()).unwrap().is_empty());
        let reg = |id: u32, name: &str| FileEntry {
            kind: FD_TYPE_REG,
            id,
            reg: Some(RegFileEntry {
                id,
                name: name.into(),
            }),
        };
        let files = [
            reg(3, "/run/a"),
            reg(7, "/run/link_remap.7"),
            reg(9, "/run/g"),
        ];
        std::fs::write(
            d.path().join("files.img"),
            encode_entries(FILES_MAGIC, &files),
        )
        .unwrap();
        let remaps = [
            RemapFilePathEntry {
                orig_id: 3,
                remap_id: 7,
                remap_type: None,
            },
            // A ghost file's content is in the images: no link to keep.
            RemapFilePathEntry {
                orig_id: 9,
                remap_id: 11,
                remap_type: Some(1),
            },
        ];
        std::fs::write(
            d.path().join("remap-fpath.img"),
            encode_entries(REMAP_FPATH_MAGIC, &remaps),
        )
        .unwrap();
        assert_eq!(
            read_link_remaps(d.path()).unwrap(),
            [("/run/a".to_string(), "/run/link_remap.7".to_string())]
        );
    }

    #[test]
    fn round_trip_and_v1_head() {
        let core = CoreEntry {
            tc: Some(TaskCoreEntry {
                task_state: Some(1),
                comm: Some("sh".into()),
                old_seccomp_mode: None,
            }),
            thread_core: Some(ThreadCoreEntry {
                creds: Some(creds()),
                seccomp_mode: Some(SECCOMP_MODE_FILTER),
                seccomp_filter: Some(0),
                comm: None,
            }),
        };
        let img = encode_entries(CORE_MAGIC, std::slice::from_ref(&core));
        let p = Path::new("core-1.img");
        assert_eq!(
            decode_entries::<CoreEntry>(p, &img, CORE_MAGIC).unwrap(),
            std::slice::from_ref(&core)
        );
        // v1: no head magic.
        assert_eq!(
            decode_entries::<CoreEntry>(p, &img[4..], CORE_MAGIC).unwrap(),
            [core]
        );
        assert!(matches!(
            decode_entries::<CoreEntry>(p, &img, PSTREE_MAGIC),
            Err(ImageError::Magic { found, .. }) if found == CORE_MAGIC
        ));
    }

    #[test]
    fn hostile_lengths_are_bounded() {
        let p = Path::new("pstree.img");
        let mut img = encode_entries::<PstreeEntry>(PSTREE_MAGIC, &[]);
        img.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_entries::<PstreeEntry>(p, &img, PSTREE_MAGIC),
            Err(ImageError::TooLarge { .. })
        ));
        let mut img = encode_entries::<PstreeEntry>(PSTREE_MAGIC, &[]);
        img.extend_from_slice(&100u32.to_le_bytes());
        img.extend_from_slice(&[8, 1]);
        assert!(matches!(
            decode_entries::<PstreeEntry>(p, &img, PSTREE_MAGIC),
            Err(ImageError::Truncated { entry: 0, .. })
        ));
        // Many empty entries: bounded in number.
        let mut img = encode_entries::<PstreeEntry>(PSTREE_MAGIC, &[]);
        img.extend(std::iter::repeat_n(0u8, 4 * (MAX_ENTRIES + 1)));
        assert!(matches!(
            decode_entries::<PstreeEntry>(p, &img, PSTREE_MAGIC),
            Err(ImageError::TooLarge { .. })
        ));
    }

    #[test]
    fn symlinked_image_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", tmp.path().join("pstree.img")).unwrap();
        assert!(matches!(
            read_pstree(tmp.path()),
            Err(ImageError::NotAFile { .. })
        ));
    }
}
