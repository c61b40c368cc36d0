//! Belayer's node settings, shared by the shim and the CLI: where checkpoints live, which CRIU to
//! use. Read from `$BELAYER_CONFIG` (default `/etc/belayer/config.toml`) when it exists;
//! `$BELAYER_STORE` overrides the store (the test suites give each containerd its own).

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The default checkpoint store.
pub const DEFAULT_STORE: &str = "/var/lib/belayer";
const DEFAULT_CONFIG: &str = "/etc/belayer/config.toml";

/// The runc root (`runc --root`) of the shims' containers in `namespace`: their runc state.
pub fn runc_root(namespace: &str) -> PathBuf {
    PathBuf::from("/run/belayer/runc").join(namespace)
}

/// The bounds of `frozen_limit_ms`: a dump needs some time; a container frozen for minutes is
/// already lost to its agent.
const FROZEN_LIMIT_MS_MIN: u64 = 100;
const FROZEN_LIMIT_MS_MAX: u64 = 600_000;

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Root of the checkpoint store (root-only, 0700).
    pub store: PathBuf,
    /// The CRIU binary runc runs.
    pub criu: PathBuf,
    /// Checkpoints kept per container by automatic checkpointing (older ones are compacted away).
    pub keep: usize,
    /// Default of the `io.belayer.checkpoint` annotation: `auto` or `off`.
    pub checkpoint: String,
    /// Default of the `io.belayer.recover` annotation: `auto` or `off`.
    pub recover: String,
    /// Default of the `io.belayer.policy` annotation after a restore: `rewind` or `replay`.
    pub policy: String,
    /// Default of the `io.belayer.actions` annotation: where automatic checkpointing finds action
    /// boundaries: `exec` (each exec is an action) or `activity` (the container's cgroup CPU and
    /// I/O: for agent servers that run their tools in their own processes, with no exec).
    pub actions: String,
    /// Restore memory lazily (`criu lazy-pages` through userfaultfd): `auto` (when the kernel and
    /// CRIU support it), `on`, `off`.
    pub lazy_restore: String,
    /// How CRIU keeps packets out of a network namespace while it is dumped or restored:
    /// `auto` (nftables when CRIU and the kernel support it, else CRIU's default), `nftables`,
    /// `iptables` (CRIU's default: several `iptables-restore` runs per restore) or `skip`.
    pub network_lock: String,
    /// The longest a checkpoint keeps its container frozen for CRIU's dump, in milliseconds:
    /// past it CRIU is ended and the container thawed (the checkpoint fails, naming the task CRIU
    /// waited on), whatever CRIU or the kernel is doing.
    pub frozen_limit_ms: u64,
    /// The checkpoint scheduler's settings (see scheduler/README.md).
    pub scheduler: scheduler::SchedulerConfig,
    /// Bounds on an imported checkpoint (`[import]`).
    pub import: ImportLimits,
    /// Automatic checkpoints pushed to a registry in the background (`[replication]`).
    pub replication: Replication,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            store: PathBuf::from(DEFAULT_STORE),
            criu: PathBuf::from("criu"),
            keep: 3,
            checkpoint: "off".into(),
            recover: "off".into(),
            policy: "rewind".into(),
            actions: "exec".into(),
            lazy_restore: "auto".into(),
            network_lock: "auto".into(),
            frozen_limit_ms: criu_bridge::DEFAULT_FROZEN_LIMIT.as_millis() as u64,
            scheduler: scheduler::SchedulerConfig::default(),
            import: ImportLimits::default(),
            replication: Replication::default(),
        }
    }
}

impl Settings {
    /// Loads the settings; a config file that exists but does not parse is an error.
    pub fn load() -> Result<Self, SettingsError> {
        let path = std::env::var_os("BELAYER_CONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG));
        let mut s = match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&path, &text)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::default(),
            Err(source) => return Err(SettingsError::Read { path, source }),
        };
        if let Some(store) = std::env::var_os("BELAYER_STORE") {
            s.store = PathBuf::from(store);
        }
        Ok(s)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, SettingsError> {
        let invalid = |why: String| SettingsError::Invalid {
            path: path.to_path_buf(),
            why,
        };
        let s: Self = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        s.scheduler.validate().map_err(|e| invalid(e.to_string()))?;
        if !matches!(s.lazy_restore.as_str(), "auto" | "on" | "off") {
            return Err(invalid(format!(
                "lazy_restore = {:?}: use \"auto\", \"on\" or \"off\"",
                s.lazy_restore
            )));
        }
        if !matches!(s.actions.as_str(), "exec" | "activity") {
            return Err(invalid(format!(
                "actions = {:?}: use \"exec\" or \"activity\"",
                s.actions
            )));
        }
        if !matches!(
            s.network_lock.as_str(),
            "auto" | "nftables" | "iptables" | "skip"
        ) {
            return Err(invalid(format!(
                "network_lock = {:?}: use \"auto\", \"nftables\", \"iptables\" or \"skip\"",
                s.network_lock
            )));
        }
        if s.replication.max_in_flight == 0 {
            return Err(invalid(
                "replication.max_in_flight = 0: use 1 or more".into(),
            ));
        }
        if !(FROZEN_LIMIT_MS_MIN..=FROZEN_LIMIT_MS_MAX).contains(&s.frozen_limit_ms) {
            return Err(invalid(format!(
                "frozen_limit_ms = {}: use {FROZEN_LIMIT_MS_MIN}..={FROZEN_LIMIT_MS_MAX}",
                s.frozen_limit_ms
            )));
        }
        Ok(s)
    }

    /// [`Settings::frozen_limit_ms`] as a duration.
    pub fn frozen_limit(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.frozen_limit_ms)
    }

    /// The action journals.
    pub fn journals(&self, namespace: &str) -> PathBuf {
        self.store.join("journal").join(namespace)
    }

    pub fn store(&self) -> criu_bridge::Store {
        criu_bridge::Store::new(&self.store)
    }

    /// Belayer-owned writable layers of restored containers.
    pub fn uppers(&self, namespace: &str, id: &str) -> PathBuf {
        self.store.join("uppers").join(namespace).join(id)
    }

    /// Scratch space of restores (CRIU's restore.log, stats) for a task whose bundle has no
    /// `work` dir from containerd.
    pub fn work(&self, namespace: &str, id: &str) -> PathBuf {
        self.store.join("work").join(namespace).join(id)
    }
}

/// Why the node settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse, or a value is out of its range; `why` names the key.
    #[error("invalid {}: {why}", path.display())]
    Invalid { path: PathBuf, why: String },
}

/// Bounds on an imported checkpoint (the `[import]` table of the node settings).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ImportLimits {
    /// The most bytes of an export: the chain archive and the CRIU images beside it.
    pub max_archive_bytes: u64,
    /// The most bytes the chain archive unpacks to, each sparse member at its apparent size.
    pub max_unpacked_bytes: u64,
    /// The most members of the chain archive.
    pub max_files: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        Self {
            max_archive_bytes: 256 << 30,
            max_unpacked_bytes: 256 << 30,
            max_files: 1_000_000,
        }
    }
}

/// Automatic checkpoints pushed to a registry (the `[replication]` table of the node settings).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct Replication {
    /// Default of the `io.belayer.replicate` annotation: a repository (`host[:port]/path`), or
    /// empty for none.
    pub repository: String,
    /// The docker config (`config.json`) whose `auths` hold the registry's credentials; empty:
    /// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json` of the shim's user.
    pub docker_config: PathBuf,
    /// Pushes running at once on this node (each container's own go one at a time).
    pub max_in_flight: usize,
    /// The most bytes per second one push uploads; 0: no bound.
    pub max_bytes_per_s: u64,
    /// Plain HTTP to a registry that is not on loopback (TLS is not implemented yet).
    pub plain_http: bool,
    /// A pod's container (CRI made it) also goes up as a Kubernetes checkpoint image, which a
    /// pod restores from: one layer holding the whole chain, uploaded whole each time.
    pub kube_images: bool,
}

impl Default for Replication {
    fn default() -> Self {
        Self {
            repository: String::new(),
            docker_config: PathBuf::new(),
            max_in_flight: 2,
            max_bytes_per_s: 64 << 20,
            plain_http: false,
            kube_images: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_sample_is_valid_and_says_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/belayer.toml");
        let s = Settings::parse(&path, &std::fs::read_to_string(&path).unwrap()).unwrap();
        let d = Settings::default();
        assert_eq!((s.store, s.criu, s.keep), (d.store, d.criu, d.keep));
        assert_eq!(s.replication, d.replication);
        assert_eq!(
            (
                s.checkpoint,
                s.recover,
                s.policy,
                s.lazy_restore,
                s.network_lock,
                s.frozen_limit_ms
            ),
            (
                d.checkpoint,
                d.recover,
                d.policy,
                d.lazy_restore,
                d.network_lock,
                d.frozen_limit_ms
            )
        );
    }

    #[test]
    fn parses_and_rejects_unknown_keys() {
        let s = Settings::parse(Path::new("x"), "store = \"/tmp/s\"\nkeep = 5\n").unwrap();
        assert_eq!((s.store, s.keep), (PathBuf::from("/tmp/s"), 5));
        assert!(
            Settings::parse(Path::new("x"), "stroe = 1")
                .unwrap_err()
                .to_string()
                .contains("stroe")
        );
        assert!(
            Settings::parse(Path::new("x"), "lazy_restore = \"maybe\"")
                .unwrap_err()
                .to_string()
                .contains("lazy_restore")
        );
        assert!(
            Settings::parse(Path::new("x"), "network_lock = \"nft\"")
                .unwrap_err()
                .to_string()
                .contains("network_lock")
        );
        assert!(
            Settings::parse(Path::new("x"), "frozen_limit_ms = 0")
                .unwrap_err()
                .to_string()
                .contains("frozen_limit_ms")
        );
        let s = Settings::parse(Path::new("x"), "frozen_limit_ms = 1500").unwrap();
        assert_eq!(s.frozen_limit(), std::time::Duration::from_millis(1500));
    }

    #[test]
    fn limits_are_configurable_and_checked_by_name() {
        let l: ImportLimits = toml::from_str("max_files = 5").unwrap();
        assert_eq!(
            l,
            ImportLimits {
                max_files: 5,
                ..Default::default()
            }
        );
        assert!(toml::from_str::<ImportLimits>("max_file = 5").is_err());
    }
}
