//! What a restore may bring back: every task's credentials, capability sets, `no_new_privs`,
//! seccomp mode and LSM label, and the checkpoint's mount table, compared with the OCI spec of
//! the container being created before CRIU runs. A checkpoint (Belayer's or a runc-made archive)
//! whose images exceed the spec is refused with the task and the field that exceed it.

use std::path::{Path, PathBuf};

use super::images::{
    self, CredsEntry, ImageError, MntEntry, SECCOMP_MODE_FILTER, TaskKobjIdsEntry, UidGidExtent,
    UsernsEntry,
};

/// The capability names of `linux/capability.h`, by number.
const CAP_NAMES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];
const CAP_SYS_ADMIN: u32 = 21;
/// The securebits the kernel defines (`linux/securebits.h`: four bits and their locks).
const SECBITS_DEFINED: u32 = 0xff;
/// `MS_RDONLY`, `MS_NOSUID`, `MS_NODEV`, `MS_NOEXEC`.
const MOUNT_FLAGS: [(&str, u32); 4] = [("ro", 1), ("nosuid", 2), ("nodev", 4), ("noexec", 8)];

/// Why a checkpoint's processes may not be restored into a container.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    /// The spec (`config.json`) cannot be read or parsed.
    #[error("cannot read the OCI spec {path}")]
    Spec {
        /// The spec file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A CRIU image the check needs cannot be read; nothing is restored from it.
    #[error("cannot check the privilege of the checkpoint's tasks")]
    Image(#[from] ImageError),
    /// The images do not hold a field the check needs (a layout this CRIU does not write).
    #[error("task {pid} (thread {tid}): the core image has no {field}; unknown image layout")]
    Layout {
        /// The task.
        pid: u32,
        /// The thread.
        tid: u32,
        /// The missing field.
        field: &'static str,
    },
    /// A task holds more than the spec grants.
    #[error(
        "task {pid} ({comm}, thread {tid}) exceeds the container's spec: {field} is {found}, \
         the spec allows {allowed}"
    )]
    Task {
        /// The task (thread group) id.
        pid: u32,
        /// The thread.
        tid: u32,
        /// The task's comm, where the image records it.
        comm: String,
        /// The credential field (`euid`, `cap_eff`, `no_new_privs`, `seccomp_mode`, ...).
        field: &'static str,
        /// What the image holds.
        found: String,
        /// What the spec allows.
        allowed: String,
    },
    /// A mount of the checkpoint exceeds the spec.
    #[error(
        "mount {mountpoint} of {image} exceeds the container's spec: {field} is {found}, the spec allows {allowed}"
    )]
    Mount {
        /// The mountpoints image.
        image: PathBuf,
        /// The mount's path in the container.
        mountpoint: String,
        /// What is wrong (`flags`, `mountpoint`, `missing`).
        field: &'static str,
        /// What the image holds.
        found: String,
        /// What the spec allows.
        allowed: String,
    },
}

/// What the OCI spec of the container being created grants its processes.
#[derive(Debug, Clone, Default)]
pub struct Grant {
    /// `process.user.uid`.
    pub uid: u32,
    /// `process.user.gid` and `additionalGids`.
    pub gids: Vec<u32>,
    /// `process.capabilities`: inheritable, permitted, effective, bounding, ambient as bit
    /// masks; `None` when the spec has no capabilities object (runc then leaves the caps alone).
    pub caps: Option<[u64; 5]>,
    /// `process.noNewPrivileges`.
    pub no_new_privs: bool,
    /// `linux.seccomp` is set.
    pub seccomp: bool,
    /// `process.apparmorProfile` or `process.selinuxLabel`, when set.
    pub lsm_label: Option<String>,
    /// `root.readonly`.
    pub readonly_root: bool,
    /// `mounts`: destination, the flags (`MS_RDONLY`...) its options require, and whether it
    /// is a `cgroup` mount (on cgroup v1 runc mounts a tmpfs there and the options go to the
    /// hierarchies under it).
    pub mounts: Vec<(String, u32, bool)>,
    /// `linux.maskedPaths`.
    pub masked: Vec<String>,
    /// `linux.readonlyPaths`.
    pub readonly: Vec<String>,
    /// `linux.devices` paths (runc bind-mounts device nodes in a user namespace).
    pub devices: Vec<String>,
    /// The `linux.namespaces` types the container gets new (no `path`): `network`, `pid`, ...
    pub new_namespaces: Vec<String>,
    /// `linux.uidMappings` and `linux.gidMappings`, sorted: the maps runc writes into the user
    /// namespace it creates.
    pub id_maps: [Vec<UidGidExtent>; 2],
}

const CAP_SETS: [(&str, &str); 5] = [
    ("cap_inh", "inheritable"),
    ("cap_prm", "permitted"),
    ("cap_eff", "effective"),
    ("cap_bnd", "bounding"),
    ("cap_amb", "ambient"),
];

impl Grant {
    /// Reads the spec at `path` (a bundle's `config.json`).
    pub fn read(path: &Path) -> Result<Self, PrivilegeError> {
        let spec_err = |source| PrivilegeError::Spec {
            path: path.into(),
            source,
        };
        let data = std::fs::read(path).map_err(spec_err)?;
        let spec: serde_json::Value = serde_json::from_slice(&data)
            .map_err(|e| spec_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
        Ok(Self::from_spec(&spec))
    }

    /// What `spec` (an OCI runtime spec) grants.
    pub fn from_spec(spec: &serde_json::Value) -> Self {
        let p = &spec["process"];
        let u32_of = |v: &serde_json::Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
        let strings = |v: &serde_json::Value| -> Vec<String> {
            v.as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str().map(normalize)).collect())
                .unwrap_or_default()
        };
        let mut gids = vec![u32_of(&p["user"]["gid"]).unwrap_or(0)];
        if let Some(a) = p["user"]["additionalGids"].as_array() {
            gids.extend(a.iter().filter_map(u32_of));
        }
        let caps = p["capabilities"].as_object().map(|c| {
            CAP_SETS.map(|(_, key)| {
                c.get(key)
                    .and_then(|v| v.as_array())
                    .into_iter()
                    .flatten()
                    .filter_map(|n| n.as_str().and_then(cap_number))
                    .fold(0u64, |m, n| m | 1 << n)
            })
        });
        let label = [&p["apparmorProfile"], &p["selinuxLabel"]]
            .into_iter()
            .filter_map(|v| v.as_str())
            .find(|s| !s.is_empty())
            .map(String::from);
        let mounts = spec["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let dest = normalize(m["destination"].as_str()?);
                let flags = m["options"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|o| o.as_str())
                    .filter_map(|o| MOUNT_FLAGS.iter().find(|(n, _)| *n == o).map(|f| f.1))
                    .fold(0, |a, b| a | b);
                Some((dest, flags, m["type"].as_str() == Some("cgroup")))
            })
            .collect();
        let devices = spec["linux"]["devices"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["path"].as_str().map(normalize))
            .collect();
        let new_namespaces = spec["linux"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["path"].as_str().is_none_or(str::is_empty))
            .filter_map(|n| n["type"].as_str().map(String::from))
            .collect();
        let id_maps = ["uidMappings", "gidMappings"].map(|key| {
            let mut map: Vec<UidGidExtent> = spec["linux"][key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| {
                    Some(UidGidExtent {
                        first: u32_of(&m["containerID"])?,
                        lower_first: u32_of(&m["hostID"])?,
                        count: u32_of(&m["size"])?,
                    })
                })
                .collect();
            map.sort();
            map
        });
        Grant {
            id_maps,
            uid: u32_of(&p["user"]["uid"]).unwrap_or(0),
            gids,
            caps,
            no_new_privs: p["noNewPrivileges"].as_bool().unwrap_or(false),
            seccomp: !spec["linux"]["seccomp"].is_null(),
            lsm_label: label,
            readonly_root: spec["root"]["readonly"].as_bool().unwrap_or(false),
            mounts,
            masked: strings(&spec["linux"]["maskedPaths"]),
            readonly: strings(&spec["linux"]["readonlyPaths"]),
            devices,
            new_namespaces,
        }
    }

    /// Whether the spec lets the container mount what it likes (`CAP_SYS_ADMIN` in its
    /// bounding set, or no capability restriction at all).
    fn may_mount(&self) -> bool {
        self.caps.is_none_or(|c| c[3] & (1 << CAP_SYS_ADMIN) != 0)
    }
}

/// The number of capability `name` (`CAP_SYS_ADMIN` or `SYS_ADMIN`, any case).
pub fn cap_number(name: &str) -> Option<u32> {
    let upper = name.to_ascii_uppercase();
    let full = match upper.starts_with("CAP_") {
        true => upper,
        false => format!("CAP_{upper}"),
    };
    CAP_NAMES.iter().position(|n| *n == full).map(|i| i as u32)
}

fn cap_list(mask: u64) -> String {
    let names: Vec<String> = (0..64)
        .filter(|b| mask & (1 << b) != 0)
        .map(|b| match CAP_NAMES.get(b) {
            Some(n) => (*n).to_string(),
            None => format!("cap {b}"),
        })
        .collect();
    match names.is_empty() {
        true => "none".into(),
        false => names.join(", "),
    }
}

/// `/proc/sys/` and `./proc/sys` → `/proc/sys`.
fn normalize(p: &str) -> String {
    let t = p.trim_start_matches('.').trim_end_matches('/');
    match t.starts_with('/') {
        true => t.to_string(),
        false => format!("/{t}"),
    }
}

/// Whether `p` is strictly below `dir` (`/` is above everything).
fn is_under(p: &str, dir: &str) -> bool {
    p != dir && (dir == "/" || p.strip_prefix(dir).is_some_and(|r| r.starts_with('/')))
}

/// One thread of the checkpoint, as the check sees it.
#[derive(Debug, Clone)]
pub struct ThreadCreds<'a> {
    /// The task (thread group).
    pub pid: u32,
    /// The thread.
    pub tid: u32,
    /// The comm, if recorded.
    pub comm: &'a str,
    /// Its credentials.
    pub creds: &'a CredsEntry,
    /// Its seccomp mode (0 when not recorded).
    pub seccomp_mode: i32,
}

/// Checks one thread against `grant`.
pub fn check_thread(grant: &Grant, t: &ThreadCreds<'_>) -> Result<(), PrivilegeError> {
    let refuse = |field: &'static str, found: String, allowed: String| PrivilegeError::Task {
        pid: t.pid,
        tid: t.tid,
        comm: t.comm.to_string(),
        field,
        found,
        allowed,
    };
    let c = t.creds;
    // Root's ids only where the spec's user is root: a non-root task may have changed to
    // other ids (a setuid program), never to 0.
    if grant.uid != 0 {
        for (field, v) in [
            ("uid", c.uid),
            ("euid", c.euid),
            ("suid", c.suid),
            ("fsuid", c.fsuid),
        ] {
            if v == 0 {
                return Err(refuse(field, "0".into(), format!("{} (not 0)", grant.uid)));
            }
        }
    }
    if !grant.gids.contains(&0) {
        let gids = [
            ("gid", c.gid),
            ("egid", c.egid),
            ("sgid", c.sgid),
            ("fsgid", c.fsgid),
        ];
        let groups = c.groups.iter().map(|&g| ("groups", g));
        for (field, v) in gids.into_iter().chain(groups) {
            if v == 0 {
                return Err(refuse(
                    field,
                    "0".into(),
                    format!("{:?} (not 0)", grant.gids),
                ));
            }
        }
    }
    if let Some(allowed) = grant.caps {
        let found = [&c.cap_inh, &c.cap_prm, &c.cap_eff, &c.cap_bnd, &c.cap_amb];
        for (i, words) in found.into_iter().enumerate() {
            let field = CAP_SETS[i].0;
            if words.iter().skip(2).any(|&w| w != 0) {
                return Err(refuse(
                    field,
                    format!("{words:08x?} (capabilities above 63)"),
                    cap_list(allowed[i]),
                ));
            }
            let mask = words
                .iter()
                .take(2)
                .enumerate()
                .fold(0u64, |m, (j, &w)| m | u64::from(w) << (32 * j));
            // A task may raise its inheritable set up to its bounding set (capset(2) with
            // CAP_SETPCAP; ZDTM's caps01 does): inheritable bits grant nothing by themselves.
            // Its ambient set may then hold what is both permitted and inheritable (prctl
            // PR_CAP_AMBIENT_RAISE's rule): no more than the spec's permitted set.
            let inheritable = allowed[0] | allowed[3];
            let allowed_here = match i {
                0 => inheritable,
                4 => allowed[4] | (allowed[1] & inheritable),
                _ => allowed[i],
            };
            let excess = mask & !allowed_here;
            if excess != 0 {
                return Err(refuse(
                    field,
                    format!("{mask:#x}, with {} beyond the spec", cap_list(excess)),
                    cap_list(allowed_here),
                ));
            }
        }
    }
    if c.secbits & !SECBITS_DEFINED != 0 {
        return Err(refuse(
            "secbits",
            format!("{:#x}", c.secbits),
            format!("bits within {SECBITS_DEFINED:#x}"),
        ));
    }
    if grant.no_new_privs && c.no_new_privs.unwrap_or(0) == 0 {
        let found = c
            .no_new_privs
            .map_or("not recorded".into(), |v| v.to_string());
        return Err(refuse("no_new_privs", found, "1".into()));
    }
    // Strict mode (1) allows less than any filter.
    if grant.seccomp && t.seccomp_mode != SECCOMP_MODE_FILTER && t.seccomp_mode != 1 {
        return Err(refuse(
            "seccomp_mode",
            t.seccomp_mode.to_string(),
            format!("{SECCOMP_MODE_FILTER} (filter)"),
        ));
    }
    if let (Some(want), Some(found)) = (&grant.lsm_label, &c.lsm_profile) {
        // AppArmor shows `profile (enforce)`; complain mode confines nothing.
        let ok = found.is_empty() || found == want || *found == format!("{want} (enforce)");
        if !ok {
            return Err(refuse("lsm_profile", found.clone(), want.clone()));
        }
    }
    Ok(())
}

/// Checks the mounts of one mount namespace (`image`) against `grant`; `exists` says whether a
/// path exists on this host (a masked path that exists here must be covered in the checkpoint,
/// or the restored container would see it).
pub fn check_mounts(
    grant: &Grant,
    image: &Path,
    mounts: &[MntEntry],
    exists: &dyn Fn(&str) -> bool,
) -> Result<(), PrivilegeError> {
    let refuse = |mountpoint: &str, field: &'static str, found: String, allowed: String| {
        PrivilegeError::Mount {
            image: image.into(),
            mountpoint: mountpoint.into(),
            field,
            found,
            allowed,
        }
    };
    let flags_of = |m: &MntEntry| m.flags | m.sb_flags.unwrap_or(0);
    let flag_names = |f: u32| {
        let names: Vec<&str> = MOUNT_FLAGS
            .iter()
            .filter(|(_, b)| f & b != 0)
            .map(|(n, _)| *n)
            .collect();
        match names.is_empty() {
            true => "none".to_string(),
            false => names.join(","),
        }
    };
    let at = |p: &str| -> Vec<&MntEntry> {
        mounts
            .iter()
            .filter(|m| normalize(&m.mountpoint) == p)
            .collect()
    };
    // The cgroup hierarchies at or under `p`.
    let cgroups_at = |p: &str| -> Vec<&MntEntry> {
        mounts
            .iter()
            .filter(|m| m.fstype == 12 || m.fstype == 23)
            .filter(|m| {
                let mp = normalize(&m.mountpoint);
                mp == p || is_under(&mp, p)
            })
            .collect()
    };
    // The flags each destination's (last) spec mount requires.
    let mut required: Vec<(String, u32, bool)> = Vec::new();
    for (dest, f, cgroup) in &grant.mounts {
        required.retain(|(d, ..)| d != dest);
        required.push((dest.clone(), *f, *cgroup));
    }
    if grant.readonly_root {
        required.push(("/".into(), 1, false));
    }
    for p in &grant.readonly {
        required.retain(|(d, ..)| d != p);
        required.push((p.clone(), 1, false));
    }
    for (dest, want, cgroup) in &required {
        let found = match cgroup {
            true => cgroups_at(dest),
            false => at(dest),
        };
        for m in found {
            let have = flags_of(m);
            if have & want != *want {
                return Err(refuse(
                    dest,
                    "flags",
                    flag_names(have),
                    format!("at least {}", flag_names(*want)),
                ));
            }
        }
    }
    // Masked and read-only paths under a proc or sysfs mount of the checkpoint that exist on this
    // host: runc covered them at create, so the checkpoint must cover them too.
    let pseudo: Vec<String> = mounts
        .iter()
        .filter(|m| m.fstype == 1 || m.fstype == 2)
        .map(|m| normalize(&m.mountpoint))
        .collect();
    for p in grant.masked.iter().chain(&grant.readonly) {
        let under_pseudo = pseudo.iter().any(|d| is_under(p, d));
        if under_pseudo && exists(p) && at(p).is_empty() {
            return Err(refuse(
                p,
                "missing",
                "no mount".into(),
                "the masked or read-only mount of the spec".into(),
            ));
        }
    }
    if grant.may_mount() {
        return Ok(());
    }
    // Without CAP_SYS_ADMIN the container made no mounts of its own: every mount is the root,
    // one of the spec's, a masked or read-only path, or a device node runc bind-mounted.
    for m in mounts {
        let p = normalize(&m.mountpoint);
        let known = p == "/"
            || grant
                .mounts
                .iter()
                .any(|(d, ..)| *d == p || is_under(&p, d))
            || grant.masked.contains(&p)
            || grant.readonly.contains(&p)
            || grant.devices.contains(&p)
            || matches!(
                p.as_str(),
                "/dev/null"
                    | "/dev/zero"
                    | "/dev/full"
                    | "/dev/tty"
                    | "/dev/urandom"
                    | "/dev/random"
                    | "/dev/console"
            );
        if !known {
            return Err(refuse(
                &p,
                "mountpoint",
                format!("a mount (fstype {}, source {})", m.fstype, m.source),
                "the spec's mounts (no CAP_SYS_ADMIN to make others)".into(),
            ));
        }
    }
    Ok(())
}

/// Checks that task `pid` is, for every namespace kind the spec creates, in a namespace other
/// than `host` (the one CRIU dumped from, `inventory.img`'s `root_ids`): CRIU restores a task
/// whose id equals the host's into the restoring CRIU's own namespace, the node's.
pub fn check_namespaces(
    grant: &Grant,
    pid: u32,
    comm: &str,
    ids: Option<&TaskKobjIdsEntry>,
    host: &TaskKobjIdsEntry,
) -> Result<(), PrivilegeError> {
    for kind in &grant.new_namespaces {
        let field = match kind.as_str() {
            "pid" => "pid_ns_id",
            "network" => "net_ns_id",
            "ipc" => "ipc_ns_id",
            "uts" => "uts_ns_id",
            "mount" => "mnt_ns_id",
            "user" => "user_ns_id",
            "cgroup" => "cgroup_ns_id",
            "time" => "time_ns_id",
            _ => continue,
        };
        let own = ids.and_then(|i| i.of(kind));
        let found = match own {
            None => "not recorded".to_string(),
            Some(id) if host.of(kind) == Some(id) => format!("{id}, the node's {kind} namespace"),
            Some(_) => continue,
        };
        return Err(PrivilegeError::Task {
            pid,
            tid: pid,
            comm: comm.into(),
            field,
            found,
            allowed: format!("a {kind} namespace of the container's own"),
        });
    }
    Ok(())
}

/// Checks the user namespace task `pid` is restored into. A task in a user namespace other
/// than `host` (the one CRIU dumped from) gets one that CRIU creates and writes the maps of
/// `userns` into: allowed only when the spec creates a user namespace too, and only with the
/// spec's own maps — a map of the checkpoint's choosing (container root onto the node's root)
/// would hand the task the node's files.
pub fn check_user_namespace(
    grant: &Grant,
    pid: u32,
    comm: &str,
    ids: Option<&TaskKobjIdsEntry>,
    host: &TaskKobjIdsEntry,
    userns: impl FnOnce(u32) -> Result<UsernsEntry, ImageError>,
) -> Result<(), PrivilegeError> {
    let Some(own) = ids.and_then(|i| i.user_ns_id) else {
        return Ok(());
    };
    if host.user_ns_id == Some(own) {
        return Ok(());
    }
    let maps = userns(own)?;
    let refuse = |field, found: String, allowed: String| PrivilegeError::Task {
        pid,
        tid: pid,
        comm: comm.into(),
        field,
        found,
        allowed,
    };
    if !grant.new_namespaces.iter().any(|n| n == "user") {
        return Err(refuse(
            "user_ns_id",
            format!(
                "user namespace {own} of its own (uid map {})",
                show_map(&maps.uid_map)
            ),
            "the node's user namespace: the spec creates none".into(),
        ));
    }
    for ((field, found), allowed) in [("uid_map", maps.uid_map), ("gid_map", maps.gid_map)]
        .into_iter()
        .zip(&grant.id_maps)
    {
        let mut found = found;
        found.sort();
        if &found != allowed {
            return Err(refuse(field, show_map(&found), show_map(allowed)));
        }
    }
    Ok(())
}

/// A uid or gid map as `/proc/<pid>/uid_map` writes it, lines joined by `, `.
fn show_map(map: &[UidGidExtent]) -> String {
    if map.is_empty() {
        return "empty".into();
    }
    let lines: Vec<String> = map
        .iter()
        .map(|e| format!("{} {} {}", e.first, e.lower_first, e.count))
        .collect();
    lines.join(", ")
}

/// CRIU's `COMPEL_TASK_DEAD` and `COMPEL_TASK_ZOMBIE` task states (`task_core_entry.task_state`).
const TASK_DEAD: u32 = 2;
const TASK_ZOMBIE: u32 = 6;

/// The seccomp mode CRIU's restore gives every thread of a task through its leader: where all
/// threads share the leader's filter chain, CRIU writes the chain on the leader only, flagged
/// `SECCOMP_FILTER_FLAG_TSYNC`, and no mode on the other threads; the restore installs the chain
/// with that flag, on every thread. `None` when the leader's newest filter is not so flagged.
fn tsync_mode(
    leader: &images::CoreEntry,
    filters: &mut dyn FnMut() -> Result<images::SeccompEntry, images::ImageError>,
) -> Result<Option<i32>, images::ImageError> {
    let Some(th) = &leader.thread_core else {
        return Ok(None);
    };
    let (Some(images::SECCOMP_MODE_FILTER), Some(index)) = (th.seccomp_mode, th.seccomp_filter)
    else {
        return Ok(None);
    };
    let tsync = filters()?
        .seccomp_filters
        .get(index as usize)
        .and_then(|f| f.flags)
        .is_some_and(|f| f & images::SECCOMP_FILTER_FLAG_TSYNC != 0);
    Ok(tsync.then_some(images::SECCOMP_MODE_FILTER))
}

/// Checks every task of the CRIU images in `image_dir` against `grant`. Reads `pstree.img`,
/// each thread's `core-<tid>.img`, `seccomp.img`, each task's `ids-<pid>.img`, `inventory.img` and the
/// `mountpoints-*.img`; any image that is missing or
/// malformed refuses the restore.
pub fn check_images(image_dir: &Path, grant: &Grant) -> Result<(), PrivilegeError> {
    let tasks = images::read_pstree(image_dir)?;
    let host = images::read_inventory(image_dir)?
        .root_ids
        .unwrap_or_default();
    let mut threads = 0usize;
    let mut seccomp: Option<images::SeccompEntry> = None;
    for task in &tasks {
        // A dead task (a zombie) is restored as one that exits at once: it runs nothing with any
        // privilege, and CRIU writes no thread images for it (its pstree thread ids are not
        // thread ids: the chaos soak and ZDTM's zombie00 met `core-4194530656.img`).
        let main = images::read_core(image_dir, task.pid)?;
        if main
            .tc
            .as_ref()
            .and_then(|tc| tc.task_state)
            .is_some_and(|s| s == TASK_DEAD || s == TASK_ZOMBIE)
        {
            continue;
        }
        let tsync = tsync_mode(&main, &mut || {
            if seccomp.is_none() {
                seccomp = Some(images::read_seccomp(image_dir)?.unwrap_or_default());
            }
            Ok(seccomp.clone().unwrap_or_default())
        })?;
        let tids: Vec<u32> = match task.threads.is_empty() {
            true => vec![task.pid],
            false => task.threads.clone(),
        };
        let mut task_comm = None;
        let mut task_seccomp = None;
        for tid in tids {
            threads += 1;
            if threads > images::MAX_ENTRIES {
                return Err(ImageError::TooLarge {
                    path: image_dir.join("pstree.img"),
                    what: format!("more than {} threads", images::MAX_ENTRIES),
                }
                .into());
            }
            let core = images::read_core(image_dir, tid)?;
            if let Some(tc) = &core.tc {
                task_comm = tc.comm.clone().or(task_comm);
                task_seccomp = tc.old_seccomp_mode.or(task_seccomp);
            }
            let layout = |field| PrivilegeError::Layout {
                pid: task.pid,
                tid,
                field,
            };
            let th = core.thread_core.as_ref().ok_or(layout("thread_core"))?;
            let creds = th.creds.as_ref().ok_or(layout("thread_core.creds"))?;
            let comm = th
                .comm
                .as_deref()
                .or(task_comm.as_deref())
                .unwrap_or("comm unknown");
            check_thread(
                grant,
                &ThreadCreds {
                    pid: task.pid,
                    tid,
                    comm,
                    creds,
                    seccomp_mode: th.seccomp_mode.or(task_seccomp).or(tsync).unwrap_or(0),
                },
            )?;
        }
        // A task without ids is restored in its parent's namespaces; the root task has them.
        let ids = images::read_ids(image_dir, task.pid)?;
        if ids.is_some() || task.ppid == 0 {
            let comm = task_comm.as_deref().unwrap_or("comm unknown");
            check_namespaces(grant, task.pid, comm, ids.as_ref(), &host)?;
            check_user_namespace(grant, task.pid, comm, ids.as_ref(), &host, |id| {
                images::read_userns(image_dir, id)
            })?;
        }
    }
    for (image, mounts) in images::read_mounts(image_dir)? {
        check_mounts(grant, &image, &mounts, &|p| Path::new(p).exists())?;
    }
    tracing::debug!(
        images = %image_dir.display(),
        tasks = tasks.len(),
        threads,
        "checkpoint's privilege is within the spec"
    );
    Ok(())
}

/// [`check_images`] against the spec `bundle/config.json` of the container being created.
pub fn check_restore_privilege(image_dir: &Path, bundle: &Path) -> Result<(), PrivilegeError> {
    let grant = Grant::read(&bundle.join("config.json"))?;
    check_images(image_dir, &grant)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> serde_json::Value {
        let caps = serde_json::json!(["CAP_KILL", "CAP_NET_BIND_SERVICE", "CAP_AUDIT_WRITE"]);
        serde_json::json!({
            "process": {
                "user": {"uid": 0, "gid": 0},
                "capabilities": {
                    "bounding": caps, "effective": caps, "permitted": caps,
                },
                "noNewPrivileges": true,
            },
            "root": {"path": "rootfs", "readonly": true},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/sys", "type": "sysfs", "source": "sysfs",
                 "options": ["nosuid", "noexec", "nodev", "ro"]},
                {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                 "options": ["nosuid", "noexec", "nodev", "ro"]},
            ],
            "linux": {
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO"},
                "maskedPaths": ["/proc/kcore", "/proc/acpi"],
                "readonlyPaths": ["/proc/sys"],
            }
        })
    }

    /// What runc gives the spec's process: the caps above (bits 5, 10, 29), nnp, a filter.
    fn creds() -> CredsEntry {
        let caps = vec![(1 << 5) | (1 << 10) | (1 << 29), 0];
        CredsEntry {
            cap_prm: caps.clone(),
            cap_eff: caps.clone(),
            cap_bnd: caps,
            no_new_privs: Some(1),
            ..Default::default()
        }
    }

    fn check(grant: &Grant, creds: &CredsEntry, seccomp_mode: i32) -> Result<(), PrivilegeError> {
        check_thread(
            grant,
            &ThreadCreds {
                pid: 7,
                tid: 8,
                comm: "sh",
                creds,
                seccomp_mode,
            },
        )
    }

    fn field(r: Result<(), PrivilegeError>) -> String {
        match r {
            Err(PrivilegeError::Task { field, pid: 7, .. }) => field.into(),
            other => panic!("not refused for a task field: {other:?}"),
        }
    }

    #[test]
    fn threads_take_the_leaders_filter_only_where_criu_restores_it_with_tsync() {
        use images::{CoreEntry, SeccompEntry, SeccompFilter, ThreadCoreEntry};
        let leader = |mode, filter| CoreEntry {
            tc: None,
            thread_core: Some(ThreadCoreEntry {
                creds: None,
                seccomp_mode: mode,
                seccomp_filter: filter,
                comm: None,
            }),
        };
        let filters = |flags: Option<u32>| SeccompEntry {
            seccomp_filters: vec![
                SeccompFilter {
                    prev: None,
                    flags: None,
                },
                SeccompFilter {
                    prev: Some(0),
                    flags,
                },
            ],
        };
        let mode =
            |core: &CoreEntry, f: SeccompEntry| tsync_mode(core, &mut || Ok(f.clone())).unwrap();
        let filtered = leader(Some(images::SECCOMP_MODE_FILTER), Some(1));
        // What CRIU 4.2 wrote for OpenHands' agent-server: the chain on the leader, TSYNC.
        assert_eq!(
            mode(&filtered, filters(Some(images::SECCOMP_FILTER_FLAG_TSYNC))),
            Some(images::SECCOMP_MODE_FILTER)
        );
        // No TSYNC: a thread without a mode is restored without a filter, and is refused.
        assert_eq!(mode(&filtered, filters(None)), None);
        assert_eq!(mode(&filtered, filters(Some(2))), None);
        // An index past the filters, a leader without a filter: nothing to inherit.
        assert_eq!(
            mode(
                &leader(Some(images::SECCOMP_MODE_FILTER), Some(7)),
                filters(Some(1))
            ),
            None
        );
        let mut read = false;
        assert_eq!(
            tsync_mode(&leader(None, None), &mut || {
                read = true;
                Ok(filters(Some(1)))
            })
            .unwrap(),
            None
        );
        assert!(!read, "seccomp.img is read only for a leader with a filter");
        // The refusal this prevents, and the one it keeps.
        let g = Grant::from_spec(&spec());
        assert!(check(&g, &creds(), images::SECCOMP_MODE_FILTER).is_ok());
        assert_eq!(field(check(&g, &creds(), 0)), "seccomp_mode");
    }

    #[test]
    fn spec_grant_is_parsed() {
        let g = Grant::from_spec(&spec());
        assert_eq!(g.caps.unwrap()[2], (1 << 5) | (1 << 10) | (1 << 29));
        assert_eq!(g.caps.unwrap()[0], 0);
        assert!(g.no_new_privs && g.seccomp && g.readonly_root);
        assert_eq!(g.mounts[1], ("/sys".into(), 15, false));
        assert_eq!(cap_number("sys_admin"), Some(21));
        assert_eq!(cap_number("CAP_CHECKPOINT_RESTORE"), Some(40));
        assert_eq!(cap_number("CAP_NOPE"), None);
    }

    #[test]
    fn what_runc_gives_passes_and_each_excess_is_named() {
        let g = Grant::from_spec(&spec());
        check(&g, &creds(), 2).unwrap();
        // Fewer caps, strict seccomp: less privilege, accepted.
        check(
            &g,
            &CredsEntry {
                cap_eff: vec![0, 0],
                ..creds()
            },
            1,
        )
        .unwrap();
        let raised = |f: fn(&mut CredsEntry)| {
            let mut c = creds();
            f(&mut c);
            field(check(&g, &c, 2))
        };
        assert_eq!(raised(|c| c.cap_eff = vec![u32::MAX, 0x1ff]), "cap_eff");
        assert_eq!(raised(|c| c.cap_prm[1] = 1), "cap_prm");
        assert_eq!(raised(|c| c.cap_bnd[0] |= 1 << 21), "cap_bnd");
        assert_eq!(raised(|c| c.cap_inh = vec![1 << 21]), "cap_inh");
        assert_eq!(raised(|c| c.cap_amb = vec![1 << 21]), "cap_amb");
        assert_eq!(raised(|c| c.cap_eff.push(1)), "cap_eff");
        assert_eq!(raised(|c| c.no_new_privs = Some(0)), "no_new_privs");
        assert_eq!(raised(|c| c.no_new_privs = None), "no_new_privs");
        assert_eq!(raised(|c| c.secbits = 0x100), "secbits");
        assert_eq!(field(check(&g, &creds(), 0)), "seccomp_mode");
        let err = check(
            &g,
            &CredsEntry {
                cap_eff: vec![1 << 21, 0],
                ..creds()
            },
            2,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("task 7 (sh, thread 8)") && err.contains("CAP_SYS_ADMIN beyond"),
            "{err}"
        );
    }

    #[test]
    fn root_ids_only_for_a_root_spec() {
        let mut s = spec();
        s["process"]["user"] = serde_json::json!({"uid": 1000, "gid": 1000, "additionalGids": [5]});
        let g = Grant::from_spec(&s);
        let user = CredsEntry {
            uid: 1000,
            euid: 1000,
            suid: 1000,
            fsuid: 1000,
            gid: 1000,
            egid: 1000,
            sgid: 1000,
            fsgid: 1000,
            groups: vec![5],
            ..creds()
        };
        check(&g, &user, 2).unwrap();
        // Another non-root id (a setuid program's) is not more privilege.
        check(
            &g,
            &CredsEntry {
                euid: 33,
                ..user.clone()
            },
            2,
        )
        .unwrap();
        for (want, c) in [
            (
                "euid",
                CredsEntry {
                    euid: 0,
                    ..user.clone()
                },
            ),
            (
                "fsuid",
                CredsEntry {
                    fsuid: 0,
                    ..user.clone()
                },
            ),
            (
                "sgid",
                CredsEntry {
                    sgid: 0,
                    ..user.clone()
                },
            ),
            (
                "groups",
                CredsEntry {
                    groups: vec![5, 0],
                    ..user.clone()
                },
            ),
        ] {
            assert_eq!(field(check(&g, &c, 2)), want);
        }
    }

    #[test]
    fn no_capabilities_object_leaves_caps_alone_and_lsm_must_match() {
        let mut s = spec();
        s["process"].as_object_mut().unwrap().remove("capabilities");
        s["process"]["apparmorProfile"] = "docker-default".into();
        let g = Grant::from_spec(&s);
        let all = CredsEntry {
            cap_eff: vec![u32::MAX, 0x1ff],
            lsm_profile: Some("docker-default (enforce)".into()),
            ..creds()
        };
        check(&g, &all, 2).unwrap();
        let unconfined = CredsEntry {
            lsm_profile: Some("unconfined".into()),
            ..all
        };
        assert_eq!(field(check(&g, &unconfined, 2)), "lsm_profile");
    }

    #[test]
    fn spec_namespaces_are_not_the_nodes() {
        let mut s = spec();
        s["linux"]["namespaces"] = serde_json::json!([
            {"type": "pid"}, {"type": "network", "path": "/var/run/netns/pod"}, {"type": "mount"},
        ]);
        let g = Grant::from_spec(&s);
        assert_eq!(g.new_namespaces, ["pid", "mount"]);
        let host = TaskKobjIdsEntry {
            pid_ns_id: Some(1),
            net_ns_id: Some(2),
            mnt_ns_id: Some(3),
            ..Default::default()
        };
        let own = TaskKobjIdsEntry {
            pid_ns_id: Some(11),
            net_ns_id: Some(2),
            mnt_ns_id: Some(13),
            ..Default::default()
        };
        // The network namespace is joined by path: the node's id is no concern here.
        check_namespaces(&g, 7, "sh", Some(&own), &host).unwrap();
        let in_host_pid = TaskKobjIdsEntry {
            pid_ns_id: Some(1),
            ..own.clone()
        };
        let r = check_namespaces(&g, 7, "sh", Some(&in_host_pid), &host);
        assert_eq!(field(r), "pid_ns_id");
        assert_eq!(
            field(check_namespaces(&g, 7, "sh", None, &host)),
            "pid_ns_id"
        );
    }

    /// A forged `ids` image that puts the init in a user namespace of its own, with a map of
    /// the forger's choosing: refused unless the spec creates a user namespace with that map.
    #[test]
    fn a_user_namespace_needs_the_spec_and_its_maps() {
        let ext = |first, lower_first, count| UidGidExtent {
            first,
            lower_first,
            count,
        };
        let host = TaskKobjIdsEntry {
            user_ns_id: Some(1),
            ..Default::default()
        };
        let own = TaskKobjIdsEntry {
            user_ns_id: Some(9),
            ..Default::default()
        };
        let root_map = || {
            Ok(UsernsEntry {
                uid_map: vec![ext(0, 0, u32::MAX)],
                gid_map: vec![ext(0, 0, u32::MAX)],
            })
        };
        // No user namespace in the spec: the node's is the only one allowed.
        let g = Grant::from_spec(&spec());
        check_user_namespace(&g, 7, "sh", Some(&host), &host, |_| unreachable!()).unwrap();
        check_user_namespace(&g, 7, "sh", None, &host, |_| unreachable!()).unwrap();
        let r = check_user_namespace(&g, 7, "sh", Some(&own), &host, |_| root_map());
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("user_ns_id") && e.contains("0 0 4294967295"),
            "{e}"
        );

        // A spec with a user namespace: its maps, in any order, and nothing else.
        let mut s = spec();
        s["linux"]["namespaces"] = serde_json::json!([{"type": "user"}, {"type": "pid"}]);
        s["linux"]["uidMappings"] = serde_json::json!([
            {"containerID": 1000, "hostID": 201000, "size": 1000},
            {"containerID": 0, "hostID": 100000, "size": 1000},
        ]);
        s["linux"]["gidMappings"] = serde_json::json!([
            {"containerID": 0, "hostID": 100000, "size": 65536},
        ]);
        let g = Grant::from_spec(&s);
        let spec_maps = || {
            Ok(UsernsEntry {
                uid_map: vec![ext(0, 100000, 1000), ext(1000, 201000, 1000)],
                gid_map: vec![ext(0, 100000, 65536)],
            })
        };
        check_user_namespace(&g, 7, "sh", Some(&own), &host, |id| {
            assert_eq!(id, 9);
            spec_maps()
        })
        .unwrap();
        let r = check_user_namespace(&g, 7, "sh", Some(&own), &host, |_| root_map());
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("uid_map") && e.contains("0 100000 1000, 1000 201000 1000"),
            "{e}"
        );
        let wider_gids = || {
            let mut m = spec_maps()?;
            m.gid_map[0].count += 1;
            Ok(m)
        };
        let r = check_user_namespace(&g, 7, "sh", Some(&own), &host, |_| wider_gids());
        assert_eq!(field(r), "gid_map");
    }

    fn mnt(fstype: u32, mountpoint: &str, flags: u32) -> MntEntry {
        MntEntry {
            fstype,
            mountpoint: mountpoint.into(),
            flags,
            source: "x".into(),
            ..Default::default()
        }
    }

    #[test]
    fn mounts_keep_the_spec_flags_masks_and_no_extra_mounts() {
        let g = Grant::from_spec(&spec());
        let all = |_: &str| true;
        let good = vec![
            mnt(17, "/", 1),
            mnt(1, "/proc", 0),
            mnt(2, "/sys", 15),
            mnt(1, "/proc/sys", 1),
            mnt(5, "/proc/acpi", 1),
            mnt(3, "/proc/kcore", 0),
            mnt(5, "/sys/fs/cgroup", 14),
            mnt(12, "/sys/fs/cgroup/cpu", 15),
        ];
        let img = Path::new("mountpoints-12.img");
        check_mounts(&g, img, &good, &all).unwrap();
        let refused = |f: fn(&mut Vec<MntEntry>)| {
            let mut m = good.clone();
            f(&mut m);
            match check_mounts(&g, img, &m, &all) {
                Err(PrivilegeError::Mount {
                    field, mountpoint, ..
                }) => format!("{mountpoint} {field}"),
                other => panic!("not refused: {other:?}"),
            }
        };
        assert_eq!(refused(|m| m[0].flags = 0), "/ flags");
        assert_eq!(refused(|m| m[2].flags = 1), "/sys flags");
        assert_eq!(refused(|m| m[3].flags = 0), "/proc/sys flags");
        assert_eq!(refused(|m| drop(m.remove(3))), "/proc/sys missing");
        assert_eq!(refused(|m| drop(m.remove(5))), "/proc/kcore missing");
        assert_eq!(refused(|m| m.push(mnt(1, "/x", 0))), "/x mountpoint");
        assert_eq!(refused(|m| m[7].flags = 14), "/sys/fs/cgroup flags");
        // A masked path absent on this host need not be covered.
        let mut m = good.clone();
        m.remove(4);
        check_mounts(&g, img, &m, &|p| p != "/proc/acpi").unwrap();
    }
}
