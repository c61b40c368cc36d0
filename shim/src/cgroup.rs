//! Container metrics read straight from the cgroup filesystem, in the shape runc-v2 reports them:
//! `io.containerd.cgroups.v1.Metrics` on a cgroup v1 host, `io.containerd.cgroups.v2.Metrics` on
//! a unified (v2) host.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use containerd_shim::protos::cgroups::metrics as v1;
use containerd_shim::protos::cgroups_v2::metrics as v2;
use containerd_shim::protos::protobuf::well_known_types::any::Any;
use containerd_shim::protos::protobuf::{MessageDyn, MessageField};

use crate::error::{Error, Result, io};

/// Reads a file of one number ("max" reads as 0, as runc-v2 reports an unlimited pids limit).
fn num(path: &Path) -> u64 {
    let s = fs::read_to_string(path).unwrap_or_default();
    let s = s.trim();
    if s == "max" {
        0
    } else {
        s.parse().unwrap_or(0)
    }
}

/// `key value` lines (memory.stat, cpu.stat) as a map.
fn keyed(path: &Path) -> HashMap<String, u64> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.parse().ok()?))
        })
        .collect()
}

/// A cgroup v1 mount: the subsystems it carries, its root within the hierarchy, where it is.
struct Mount {
    subsystems: Vec<String>,
    root: String,
    point: PathBuf,
}

fn v1_mounts() -> Vec<Mount> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mut post = post.split_whitespace();
            if post.next()? != "cgroup" {
                return None;
            }
            let opts = post.nth(1)?;
            let pre: Vec<&str> = pre.split_whitespace().collect();
            Some(Mount {
                subsystems: opts.split(',').map(str::to_string).collect(),
                root: pre.get(3)?.to_string(),
                point: PathBuf::from(pre.get(4)?),
            })
        })
        .collect()
}

/// The directory of `subsystem`'s cgroup for `pid` on a v1 host.
fn v1_dir(pid: u32, subsystem: &str, mounts: &[Mount]) -> Option<PathBuf> {
    let cgroups = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = cgroups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, subs, path) = (parts.next()?, parts.next()?, parts.next()?);
        subs.split(',')
            .any(|s| s == subsystem)
            .then(|| path.to_string())
    })?;
    let m = mounts
        .iter()
        .find(|m| m.subsystems.iter().any(|s| s == subsystem))?;
    let rel = path
        .strip_prefix(m.root.as_str())
        .unwrap_or(&path)
        .trim_start_matches('/');
    Some(m.point.join(rel))
}

/// The cgroup v2 path in a `/proc/PID/cgroup` text: its `0::` line.
pub fn unified_path(cgroups: &str) -> Option<&str> {
    cgroups.lines().find_map(|l| l.strip_prefix("0::"))
}

/// Whether the host is cgroup v2 (unified): `/sys/fs/cgroup` is the cgroup2 hierarchy.
pub fn is_unified() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The cgroup runc (as root) puts a container in on a cgroup v2 host, as a path in the
/// hierarchy (`/default/ID`), from the spec's `linux.cgroupsPath` (`None` when it has none), the
/// container id, whether runc runs with `--systemd-cgroup`, and the cgroup of the process that
/// runs runc (`/proc/self/cgroup`'s `0::` path), which a relative path is taken from. The rules
/// are runc's (`specconv.CreateCgroupConfig`, `fs2` and `systemd` managers). `None` for a path
/// runc would refuse.
pub fn runc_v2_path(
    cgroups_path: Option<&str>,
    id: &str,
    systemd: bool,
    own: &str,
) -> Option<String> {
    let given = cgroups_path.filter(|p| !p.is_empty());
    if systemd {
        let (slice, prefix, name) = match given {
            None => ("", "runc", id),
            Some(p) => {
                let parts: Vec<&str> = p.split(':').collect();
                let [slice, prefix, name] = parts[..] else {
                    return None;
                };
                (slice, prefix, name)
            }
        };
        let slice = expand_slice(if slice.is_empty() {
            "system.slice"
        } else {
            slice
        })?;
        let unit = if name.ends_with(".slice") {
            name.to_string()
        } else {
            format!("{prefix}-{name}.scope")
        };
        return Some(clean(&format!("{slice}/{unit}")));
    }
    let inner = clean(given.unwrap_or(id));
    if given.is_some_and(|p| p.starts_with('/')) {
        return Some(inner);
    }
    // A relative path goes below the parent of runc's own cgroup: its own one has tasks in it.
    let own = clean(own);
    let parent = Path::new(&own)
        .parent()
        .map_or("/".into(), |p| p.display().to_string());
    Some(clean(&format!("{parent}/{inner}")))
}

/// systemd's slice name → its path: `a-b.slice` → `/a.slice/a-b.slice` (runc's `ExpandSlice`).
fn expand_slice(slice: &str) -> Option<String> {
    let name = slice.strip_suffix(".slice")?;
    if name.is_empty() || slice.contains('/') {
        return None;
    }
    if name == "-" {
        return Some("/".into());
    }
    let (mut path, mut prefix) = (String::new(), String::new());
    for component in name.split('-') {
        if component.is_empty() {
            return None;
        }
        path.push_str(&format!("/{prefix}{component}.slice"));
        prefix.push_str(&format!("{component}-"));
    }
    Some(path)
}

/// A path made absolute and lexically clean, `..` stopping at the root (runc's `CleanPath`).
fn clean(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Metrics of the cgroup `pid` lives in, packed for containerd.
pub fn metrics(pid: u32) -> Result<Any> {
    let msg: Box<dyn MessageDyn> = if is_unified() {
        Box::new(collect_v2(pid)?)
    } else {
        Box::new(collect_v1(pid)?)
    };
    containerd_shim::util::convert_to_any(msg).map_err(|source| Error::Shim {
        context: "encode metrics".into(),
        source,
    })
}

fn collect_v1(pid: u32) -> Result<v1::Metrics> {
    let mounts = v1_mounts();
    let dir = |s: &str| v1_dir(pid, s, &mounts);
    let mut m = v1::Metrics::new();
    if let Some(d) = dir("pids") {
        m.pids = MessageField::some(v1::PidsStat {
            current: num(&d.join("pids.current")),
            limit: num(&d.join("pids.max")),
            ..Default::default()
        });
    }
    let mut cpu = v1::CPUStat::new();
    if let Some(d) = dir("cpuacct") {
        let stat = keyed(&d.join("cpuacct.stat"));
        // cpuacct.stat counts USER_HZ ticks (100 a second).
        let ticks_ns = 1_000_000_000 / 100;
        let per_cpu = fs::read_to_string(d.join("cpuacct.usage_percpu")).unwrap_or_default();
        cpu.usage = MessageField::some(v1::CPUUsage {
            total: num(&d.join("cpuacct.usage")),
            user: stat.get("user").copied().unwrap_or(0) * ticks_ns,
            kernel: stat.get("system").copied().unwrap_or(0) * ticks_ns,
            per_cpu: per_cpu
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect(),
            ..Default::default()
        });
    }
    if let Some(d) = dir("cpu") {
        let stat = keyed(&d.join("cpu.stat"));
        let get = |k: &str| stat.get(k).copied().unwrap_or(0);
        cpu.throttling = MessageField::some(v1::Throttle {
            periods: get("nr_periods"),
            throttled_periods: get("nr_throttled"),
            throttled_time: get("throttled_time"),
            ..Default::default()
        });
    }
    m.cpu = MessageField::some(cpu);
    if let Some(d) = dir("memory") {
        let s = keyed(&d.join("memory.stat"));
        let g = |k: &str| s.get(k).copied().unwrap_or(0);
        let entry = |prefix: &str| {
            MessageField::some(v1::MemoryEntry {
                limit: num(&d.join(format!("{prefix}.limit_in_bytes"))),
                usage: num(&d.join(format!("{prefix}.usage_in_bytes"))),
                max: num(&d.join(format!("{prefix}.max_usage_in_bytes"))),
                failcnt: num(&d.join(format!("{prefix}.failcnt"))),
                ..Default::default()
            })
        };
        m.memory = MessageField::some(v1::MemoryStat {
            cache: g("cache"),
            rss: g("rss"),
            rss_huge: g("rss_huge"),
            mapped_file: g("mapped_file"),
            dirty: g("dirty"),
            writeback: g("writeback"),
            pg_pg_in: g("pgpgin"),
            pg_pg_out: g("pgpgout"),
            pg_fault: g("pgfault"),
            pg_maj_fault: g("pgmajfault"),
            inactive_anon: g("inactive_anon"),
            active_anon: g("active_anon"),
            inactive_file: g("inactive_file"),
            active_file: g("active_file"),
            unevictable: g("unevictable"),
            hierarchical_memory_limit: g("hierarchical_memory_limit"),
            hierarchical_swap_limit: g("hierarchical_memsw_limit"),
            total_cache: g("total_cache"),
            total_rss: g("total_rss"),
            total_rss_huge: g("total_rss_huge"),
            total_mapped_file: g("total_mapped_file"),
            total_dirty: g("total_dirty"),
            total_writeback: g("total_writeback"),
            total_pg_pg_in: g("total_pgpgin"),
            total_pg_pg_out: g("total_pgpgout"),
            total_pg_fault: g("total_pgfault"),
            total_pg_maj_fault: g("total_pgmajfault"),
            total_inactive_anon: g("total_inactive_anon"),
            total_active_anon: g("total_active_anon"),
            total_inactive_file: g("total_inactive_file"),
            total_active_file: g("total_active_file"),
            total_unevictable: g("total_unevictable"),
            usage: entry("memory"),
            swap: entry("memory.memsw"),
            kernel: entry("memory.kmem"),
            kernel_tcp: entry("memory.kmem.tcp"),
            ..Default::default()
        });
    }
    if let Some(d) = dir("blkio") {
        let read = |file: &str| -> Vec<v1::BlkIOEntry> {
            fs::read_to_string(d.join(file))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let (dev, op, value) = (f.first()?, f.get(1)?, f.get(2)?);
                    let (major, minor) = dev.split_once(':')?;
                    Some(v1::BlkIOEntry {
                        op: op.to_string(),
                        major: major.parse().ok()?,
                        minor: minor.parse().ok()?,
                        value: value.parse().ok()?,
                        ..Default::default()
                    })
                })
                .collect()
        };
        m.blkio = MessageField::some(v1::BlkIOStat {
            io_service_bytes_recursive: read("blkio.throttle.io_service_bytes"),
            io_serviced_recursive: read("blkio.throttle.io_serviced"),
            ..Default::default()
        });
    }
    Ok(m)
}

/// The directory of `pid`'s cgroup on a unified (v2) host.
fn v2_dir(pid: u32) -> Result<PathBuf> {
    let cg = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(io(format!("read /proc/{pid}/cgroup")))?;
    let rel = unified_path(&cg).unwrap_or("/").trim_start_matches('/');
    Ok(Path::new("/sys/fs/cgroup").join(rel))
}

/// Memory the cgroup of `pid` uses now, in bytes (0 when unknown).
pub fn memory_usage(pid: u32) -> u64 {
    if is_unified() {
        v2_dir(pid)
            .map(|d| num(&d.join("memory.current")))
            .unwrap_or(0)
    } else {
        v1_dir(pid, "memory", &v1_mounts()).map_or(0, |d| num(&d.join("memory.usage_in_bytes")))
    }
}

/// The cumulative CPU time and block I/O bytes (read + written) of `pid`'s cgroup: v1
/// `cpuacct.usage` and `blkio.throttle.io_service_bytes`' `Total`, v2 `cpu.stat` `usage_usec`
/// and the `rbytes` + `wbytes` of every device in `io.stat`. `None` when the cgroup cannot be
/// read (the process is gone).
pub fn activity(pid: u32) -> Option<(std::time::Duration, u64)> {
    if is_unified() {
        let d = v2_dir(pid).ok()?;
        let cpu = *keyed(&d.join("cpu.stat")).get("usage_usec")?;
        let io: u64 = fs::read_to_string(d.join("io.stat"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                matches!(k, "rbytes" | "wbytes").then(|| v.parse::<u64>().ok())?
            })
            .sum();
        Some((std::time::Duration::from_micros(cpu), io))
    } else {
        let mounts = v1_mounts();
        let cpu = fs::read_to_string(v1_dir(pid, "cpuacct", &mounts)?.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let io = v1_dir(pid, "blkio", &mounts)
            .and_then(|d| fs::read_to_string(d.join("blkio.throttle.io_service_bytes")).ok())
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("Total ")?.trim().parse().ok())
            })
            .unwrap_or(0);
        Some((std::time::Duration::from_nanos(cpu), io))
    }
}

fn collect_v2(pid: u32) -> Result<v2::Metrics> {
    let d = v2_dir(pid)?;
    let mut m = v2::Metrics::new();
    m.pids = MessageField::some(v2::PidsStat {
        current: num(&d.join("pids.current")),
        limit: num(&d.join("pids.max")),
        ..Default::default()
    });
    let c = keyed(&d.join("cpu.stat"));
    let g = |k: &str| c.get(k).copied().unwrap_or(0);
    m.cpu = MessageField::some(v2::CPUStat {
        usage_usec: g("usage_usec"),
        user_usec: g("user_usec"),
        system_usec: g("system_usec"),
        nr_periods: g("nr_periods"),
        nr_throttled: g("nr_throttled"),
        throttled_usec: g("throttled_usec"),
        ..Default::default()
    });
    let s = keyed(&d.join("memory.stat"));
    let g = |k: &str| s.get(k).copied().unwrap_or(0);
    m.memory = MessageField::some(v2::MemoryStat {
        anon: g("anon"),
        file: g("file"),
        kernel_stack: g("kernel_stack"),
        slab: g("slab"),
        sock: g("sock"),
        shmem: g("shmem"),
        file_mapped: g("file_mapped"),
        file_dirty: g("file_dirty"),
        file_writeback: g("file_writeback"),
        inactive_anon: g("inactive_anon"),
        active_anon: g("active_anon"),
        inactive_file: g("inactive_file"),
        active_file: g("active_file"),
        unevictable: g("unevictable"),
        pgfault: g("pgfault"),
        pgmajfault: g("pgmajfault"),
        usage: num(&d.join("memory.current")),
        usage_limit: num(&d.join("memory.max")),
        swap_usage: num(&d.join("memory.swap.current")),
        swap_limit: num(&d.join("memory.swap.max")),
        max_usage: num(&d.join("memory.peak")),
        ..Default::default()
    });
    Ok(m)
}

#[cfg(test)]
mod runc_path_tests {
    use super::runc_v2_path as path;

    #[test]
    fn cgroupfs_paths_are_runcs() {
        assert_eq!(
            path(Some("/default/c1"), "c1", false, "/").unwrap(),
            "/default/c1"
        );
        assert_eq!(
            path(Some("/a/../b//c1/"), "c1", false, "/").unwrap(),
            "/b/c1"
        );
        // Relative, or none: below the parent of runc's own cgroup.
        assert_eq!(
            path(None, "c1", false, "/user.slice/s.scope").unwrap(),
            "/user.slice/c1"
        );
        assert_eq!(path(Some("x/c1"), "c1", false, "/").unwrap(), "/x/c1");
        assert_eq!(path(Some(""), "c1", false, "/a/b").unwrap(), "/a/c1");
    }

    #[test]
    fn systemd_paths_are_runcs() {
        assert_eq!(
            path(Some("system.slice:docker:0123"), "x", true, "/").unwrap(),
            "/system.slice/docker-0123.scope"
        );
        assert_eq!(
            path(
                Some("kubepods-besteffort-pod1.slice:cri-containerd:ab"),
                "x",
                true,
                "/"
            )
            .unwrap(),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-ab.scope"
        );
        assert_eq!(
            path(Some(":p:n"), "x", true, "/").unwrap(),
            "/system.slice/p-n.scope"
        );
        assert_eq!(
            path(Some("-.slice:p:my.slice"), "x", true, "/").unwrap(),
            "/my.slice"
        );
        assert_eq!(
            path(None, "c1", true, "/").unwrap(),
            "/system.slice/runc-c1.scope"
        );
        for bad in [
            "a--b.slice:p:n",
            "noslice:p:n",
            "a/b.slice:p:n",
            "two:parts",
        ] {
            assert_eq!(path(Some(bad), "x", true, "/"), None, "{bad}");
        }
    }
}
