//! The CRIU configuration file of a Belayer container. On every checkpoint and restore runc hands
//! CRIU the file named by the container's `org.criu.config` annotation (without one,
//! `/etc/criu/runc.conf`). Belayer writes one into the bundle to choose CRIU's network lock:
//! CRIU's default locks a container's network namespace by running `iptables-restore` — twice
//! when a restore starts and four or five times when it ends, together about 60 % of a restore's
//! time on this kernel — while `nftables` takes the same lock through libnftables inside CRIU.
//!
//! On a cgroup v2 host whose runc is older than 1.2, the file also names the container's own
//! cgroup as CRIU's cgroup2 root ([`cgroup_v2_root`]), which such a runc does not.
//!
//! And it names `/` as a path CRIU may scan for the file of an inotify or fanotify watch: a
//! container's root filesystem is an overlay without `nfs_export`, whose file handles CRIU
//! cannot open, so without a path found by that scan a process watching a file of its container
//! (a file watcher, a dev server's reload) could not be checkpointed ("fsnotify: Can't dump that
//! handle"). The scan runs only for such a watch, in the frozen window (about 0.2 s for a Debian
//! image here), and needs Belayer's CRIU (`scripts/criu-patches/0002-irmap-scan-path-root.patch`:
//! CRIU 4.2 scans nothing from `/`).
//!
//! An operator's `/etc/criu/runc.conf` is copied into the file, and a `network-lock` or
//! `cgroup-root` it sets wins. A spec that names its own `org.criu.config` has that file copied
//! instead (the operator's is then not read, as runc would not read it either), and what it sets
//! wins the same way.

use std::path::Path;
use std::sync::OnceLock;

use crate::error::{Error, Result, io};
use crate::spec::Spec;

/// The annotation runc reads the CRIU configuration file from.
pub const ANNOTATION: &str = "org.criu.config";
/// The file runc uses when a container has no [`ANNOTATION`].
pub const RUNC_CONF: &str = "/etc/criu/runc.conf";
/// Belayer's file, in the bundle (it lives as long as the task).
const FILE: &str = "belayer-criu.conf";

/// The `network-lock` CRIU should use under the `network_lock` setting; `None` leaves CRIU's
/// default (iptables). `auto` asks CRIU once per shim whether nftables locking works here.
/// Blocks: call it off the async runtime.
pub fn network_lock(setting: &str, runc: &criu_bridge::runc::Runc) -> Option<&'static str> {
    static NFTABLES: OnceLock<bool> = OnceLock::new();
    match setting {
        "nftables" => Some("nftables"),
        "skip" => Some("skip"),
        "iptables" => None,
        _ => NFTABLES
            .get_or_init(|| criu_bridge::criu::supports_feature(runc, "network_lock_nftables"))
            .then_some("nftables"),
    }
}

/// The cgroup v2 root CRIU must restore container `id` into, when runc does not name it. Before
/// 1.2 (runc commit 3438ef30), runc hands CRIU no cgroup roots on a cgroup v2 host, and CRIU puts
/// the restored processes back in the cgroup they were dumped from: a fork would run in its
/// source container's cgroup, under that container's limits, and die with it. `None` on a v1
/// host, with a runc that names the root itself, and for a path runc would refuse. `systemd`:
/// runc runs with `--systemd-cgroup`.
pub fn cgroup_v2_root(
    spec: &Spec,
    id: &str,
    systemd: bool,
    runc: &criu_bridge::runc::Runc,
) -> Option<String> {
    static RUNC_NAMES_ROOT: OnceLock<bool> = OnceLock::new();
    if !crate::cgroup::is_unified()
        || *RUNC_NAMES_ROOT.get_or_init(|| runc.version().is_none_or(|v| v >= (1, 2)))
    {
        return None;
    }
    // runc runs as the shim's child, in the shim's cgroup.
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let own = crate::cgroup::unified_path(&own)?;
    let root = crate::cgroup::runc_v2_path(spec.cgroups_path(), id, systemd, own)?;
    log::info!("container {id}: CRIU restores it into cgroup v2 {root} (runc < 1.2 names none)");
    Some(root)
}

/// The file's text: the operator's runc.conf, then `network-lock LOCK` and the cgroup v2 root of
/// [`cgroup_v2_root`], each unless the operator sets that option, and [`IRMAP_ROOT`].
pub fn render(operator: Option<&str>, lock: Option<&str>, cgroup_root: Option<&str>) -> String {
    let operator = operator.unwrap_or("");
    let sets = |key: &str| {
        operator.lines().any(|l| {
            let word = l.split_whitespace().next().unwrap_or("");
            word.trim_start_matches('-') == key
        })
    };
    let mut ours = String::new();
    if let Some(lock) = lock.filter(|_| !sets("network-lock")) {
        ours.push_str("# Belayer (network_lock in /etc/belayer/config.toml)\n");
        ours.push_str(&format!("network-lock {lock}\n"));
    }
    // CRIU's config file splits on whitespace; runc's cgroup paths have none.
    let root = cgroup_root.filter(|r| !sets("cgroup-root") && !r.contains(char::is_whitespace));
    if let Some(root) = root {
        ours.push_str(
            "# Belayer: the container's own cgroup v2 cgroup (runc < 1.2 does not name it)\n",
        );
        // `:` with no controller before it: cgroup2's (CRIU's --cgroup-root [ctrl]:/path).
        ours.push_str(&format!("cgroup-root :{root}\n"));
    }
    ours.push_str(IRMAP_ROOT);
    let mut text = String::new();
    if !operator.is_empty() {
        text.push_str(operator);
        if !operator.ends_with('\n') {
            text.push('\n');
        }
    }
    text.push_str(&ours);
    text
}

/// Where CRIU looks for the file of a watch whose handle it cannot open: the whole root
/// filesystem (see the module's documentation).
pub const IRMAP_ROOT: &str =
    "# Belayer: the files of inotify/fanotify watches on the overlay root\nirmap-scan-path /\n";

/// Points `spec` (of `bundle`, container `id`) at a CRIU configuration file with the network
/// lock of `setting` and, where runc needs it, the container's cgroup v2 root, before runc
/// creates or restores the container. Blocks: call it off the async runtime.
pub fn apply(
    bundle: &Path,
    spec: &mut Spec,
    id: &str,
    systemd: bool,
    setting: &str,
    runc: &criu_bridge::runc::Runc,
) -> Result<()> {
    apply_with(
        bundle,
        spec,
        Path::new(RUNC_CONF),
        || network_lock(setting, runc),
        |spec| cgroup_v2_root(spec, id, systemd, runc),
    )
}

/// [`apply`] with the operator's file at `runc_conf`; `lock` and `cgroup_root` are asked only
/// when needed.
fn apply_with(
    bundle: &Path,
    spec: &mut Spec,
    runc_conf: &Path,
    lock: impl FnOnce() -> Option<&'static str>,
    cgroup_root: impl FnOnce(&Spec) -> Option<String>,
) -> Result<()> {
    // The file runc would hand CRIU: the spec's own, else the operator's.
    let chosen = spec.annotation(ANNOTATION).map(std::path::PathBuf::from);
    let runc_conf = chosen.as_deref().unwrap_or(runc_conf);
    let operator = match std::fs::read_to_string(runc_conf) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(Error::FailedPrecondition(format!(
                "cannot read {}: {e}",
                runc_conf.display()
            )));
        }
    };
    let root = cgroup_root(spec);
    let text = render(operator.as_deref(), lock(), root.as_deref());
    let conf = bundle.join(FILE);
    std::fs::write(&conf, text).map_err(io(format!("write {}", conf.display())))?;
    spec.set_annotation(ANNOTATION, &conf.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_lock_after_the_operators_settings() {
        assert_eq!(
            render(None, Some("nftables"), None),
            format!(
                "# Belayer (network_lock in /etc/belayer/config.toml)\nnetwork-lock nftables\n{IRMAP_ROOT}"
            )
        );
        let text = render(Some("tcp-close"), Some("nftables"), None);
        assert!(text.starts_with("tcp-close\n# Belayer"), "{text}");
        assert!(
            text.ends_with(&format!("network-lock nftables\n{IRMAP_ROOT}")),
            "{text}"
        );
    }

    #[test]
    fn an_operators_own_lock_wins_and_the_irmap_root_is_always_named() {
        assert_eq!(
            render(Some("network-lock skip\n"), Some("nftables"), None),
            format!("network-lock skip\n{IRMAP_ROOT}")
        );
        assert_eq!(
            render(Some("--network-lock iptables"), Some("nftables"), None),
            format!("--network-lock iptables\n{IRMAP_ROOT}")
        );
        assert_eq!(
            render(Some("tcp-close\n"), None, None),
            format!("tcp-close\n{IRMAP_ROOT}")
        );
        assert_eq!(render(None, None, None), IRMAP_ROOT);
    }

    #[test]
    fn names_the_cgroup2_root_unless_the_operator_does() {
        let text = render(None, None, Some("/default/fork-1"));
        assert!(text.contains("\ncgroup-root :/default/fork-1\n"), "{text}");
        let text = render(None, Some("nftables"), Some("/a"));
        assert!(text.contains("network-lock nftables\n#"), "{text}");
        assert!(
            text.ends_with(&format!("cgroup-root :/a\n{IRMAP_ROOT}")),
            "{text}"
        );
        assert!(!render(Some("cgroup-root /mine\n"), None, Some("/a")).contains(":/a"));
        assert!(!render(None, None, Some("/with space")).contains("cgroup-root"));
    }

    #[test]
    fn explicit_settings_need_no_probe() {
        let runc = criu_bridge::runc::Runc::new("/nonexistent");
        assert_eq!(network_lock("nftables", &runc), Some("nftables"));
        assert_eq!(network_lock("skip", &runc), Some("skip"));
        assert_eq!(network_lock("iptables", &runc), None);
    }

    #[test]
    fn apply_points_the_spec_at_the_file_and_keeps_a_users_choice() {
        // A private directory with a random name, not a predictable one in /tmp.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let operator = dir.join("runc.conf");
        std::fs::write(&operator, "tcp-close\n").unwrap();
        std::fs::write(dir.join("config.json"), r#"{"ociVersion":"1.0.2"}"#).unwrap();
        let mut spec = Spec::load(&dir).unwrap();
        apply_with(&dir, &mut spec, &operator, || Some("skip"), |_| None).unwrap();
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let conf = spec["annotations"][ANNOTATION]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(conf, dir.join(FILE).display().to_string());
        let text = std::fs::read_to_string(&conf).unwrap();
        assert!(text.starts_with("tcp-close\n"), "{text}");
        assert!(
            text.ends_with(&format!("network-lock skip\n{IRMAP_ROOT}")),
            "{text}"
        );
        assert_eq!(spec["ociVersion"], "1.0.2");

        // A spec's own file is copied in place of the operator's; what it sets wins.
        let mine = dir.join("mine.conf");
        std::fs::write(&mine, "network-lock iptables\nfile-locks\n").unwrap();
        let own = format!(
            r#"{{"annotations":{{"org.criu.config":"{}"}}}}"#,
            mine.display()
        );
        std::fs::write(dir.join("config.json"), &own).unwrap();
        let mut spec = Spec::load(&dir).unwrap();
        apply_with(
            &dir,
            &mut spec,
            &operator,
            || Some("nftables"),
            |_| Some("/default/fork-1".into()),
        )
        .unwrap();
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        assert!(
            text.starts_with("network-lock iptables\nfile-locks\n"),
            "{text}"
        );
        assert!(
            !text.contains("tcp-close") && !text.contains("nftables"),
            "{text}"
        );
        assert!(
            text.ends_with(&format!("cgroup-root :/default/fork-1\n{IRMAP_ROOT}")),
            "{text}"
        );
        assert_eq!(
            spec.annotation(ANNOTATION),
            Some(dir.join(FILE).display().to_string().as_str())
        );
        // Its own lock and no cgroup root to name: still Belayer's file, for the irmap root.
        std::fs::write(dir.join("config.json"), &own).unwrap();
        let mut spec = Spec::load(&dir).unwrap();
        apply_with(&dir, &mut spec, &operator, || Some("nftables"), |_| None).unwrap();
        let text = std::fs::read_to_string(dir.join(FILE)).unwrap();
        assert_eq!(
            text,
            format!("network-lock iptables\nfile-locks\n{IRMAP_ROOT}")
        );
        drop(tmp);
    }
}
