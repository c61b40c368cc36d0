//! A bundle's OCI spec (`config.json`), read once when a task is created and handed to what
//! needs it: the CRIU configuration (which adds an annotation and writes the spec back), the
//! restore options, the container's policy and the rootfs path.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result, io};

/// The parsed spec of one bundle.
#[derive(Debug, Clone)]
pub struct Spec {
    path: PathBuf,
    value: serde_json::Value,
}

impl Spec {
    /// Reads `<bundle>/config.json`.
    pub fn load(bundle: &Path) -> Result<Self> {
        let path = bundle.join("config.json");
        let raw = std::fs::read(&path).map_err(io(format!("read {}", path.display())))?;
        let value = serde_json::from_slice(&raw).map_err(|source| Error::Spec {
            path: path.clone(),
            source,
        })?;
        Ok(Self { path, value })
    }

    /// The annotation `key`, if the spec has it as a string.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.value["annotations"][key].as_str()
    }

    /// Sets annotation `key` and writes the spec back (a temporary file renamed over it), before
    /// runc reads it.
    pub fn set_annotation(&mut self, key: &str, value: &str) -> Result<()> {
        if !self.value["annotations"].is_object() {
            self.value["annotations"] = serde_json::json!({});
        }
        self.value["annotations"][key] = serde_json::Value::String(value.to_string());
        self.save()
    }

    /// Whether runc creates the container's network namespace (`linux.namespaces` has a
    /// `network` entry without a `path`), rather than joining one (docker's, a pod's).
    pub fn owns_netns(&self) -> bool {
        self.value["linux"]["namespaces"]
            .as_array()
            .is_some_and(|all| {
                all.iter().any(|ns| {
                    ns["type"] == "network" && ns["path"].as_str().is_none_or(str::is_empty)
                })
            })
    }

    /// Appends a `createRuntime` hook running `path` with `args` (argv, `args[0]` first), unless
    /// the spec already has one with those args, and writes the spec back. runc runs these hooks
    /// when it creates the container and, on a restore, when CRIU has created its namespaces
    /// (CRIU's `setup-namespaces` notification), before any process state is restored.
    pub fn add_create_runtime_hook(&mut self, path: &str, args: &[&str]) -> Result<()> {
        if !self.value["hooks"].is_object() {
            self.value["hooks"] = serde_json::json!({});
        }
        let hooks = &mut self.value["hooks"]["createRuntime"];
        if !hooks.is_array() {
            *hooks = serde_json::json!([]);
        }
        let list = hooks.as_array_mut().expect("made an array above");
        if !list.iter().any(|h| h["args"] == serde_json::json!(args)) {
            list.push(serde_json::json!({ "path": path, "args": args }));
        }
        self.save()
    }

    /// Writes the spec back (a temporary file renamed over it), before runc reads it.
    fn save(&self) -> Result<()> {
        let bytes = serde_json::to_vec(&self.value).map_err(|source| Error::Spec {
            path: self.path.clone(),
            source,
        })?;
        let tmp = self.path.with_extension("json.belayer-tmp");
        std::fs::write(&tmp, bytes).map_err(io(format!("write {}", tmp.display())))?;
        std::fs::rename(&tmp, &self.path).map_err(io(format!("replace {}", self.path.display())))
    }

    /// Whether the spec's process runs on a terminal (`process.terminal`). runc then needs a
    /// console socket to create or restore it, whatever containerd's request says.
    pub fn terminal(&self) -> bool {
        self.value["process"]["terminal"].as_bool().unwrap_or(false)
    }

    /// `linux.cgroupsPath`, if the spec sets one.
    pub fn cgroups_path(&self) -> Option<&str> {
        self.value["linux"]["cgroupsPath"].as_str()
    }

    /// Whether `linux.cgroupsPath` is in systemd's `slice:prefix:name` form, which runc reads
    /// only with `--systemd-cgroup` (without it the path names a cgroupfs directory, colons and
    /// all, outside the slice). docker's systemd driver (`system.slice:docker:ID`) and CRI for a
    /// pod in a systemd slice (`…pod….slice:cri-containerd:ID`) write it this way, and neither
    /// can hand a runtime other than runc its `SystemdCgroup` option.
    pub fn systemd_cgroups_path(&self) -> bool {
        self.cgroups_path().is_some_and(is_systemd_cgroups_path)
    }

    /// The rootfs path the spec names (relative to `bundle` unless absolute).
    pub fn root(&self, bundle: &Path) -> PathBuf {
        let root = self.value["root"]["path"].as_str().unwrap_or("rootfs");
        if Path::new(root).is_absolute() {
            PathBuf::from(root)
        } else {
            bundle.join(root)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_terminal_flag() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"process":{"terminal":true,"args":["sh"]}}"#,
        )
        .unwrap();
        assert!(Spec::load(dir.path()).unwrap().terminal());
    }

    #[test]
    fn adds_a_create_runtime_hook_once_and_tells_an_own_netns() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(
            &cfg,
            r#"{"hooks":{"prestart":[{"path":"/x"}]},"linux":{"namespaces":[{"type":"pid"},{"type":"network"}]}}"#,
        )
        .unwrap();
        let mut spec = Spec::load(dir.path()).unwrap();
        assert!(spec.owns_netns());
        spec.add_create_runtime_hook("/bin/shim", &["shim", "hook"])
            .unwrap();
        spec.add_create_runtime_hook("/bin/shim", &["shim", "hook"])
            .unwrap();
        let again = Spec::load(dir.path()).unwrap();
        assert_eq!(
            again.value["hooks"]["createRuntime"],
            serde_json::json!([{"path": "/bin/shim", "args": ["shim", "hook"]}])
        );
        assert_eq!(again.value["hooks"]["prestart"][0]["path"], "/x");
        for joined in [
            r#"{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/x"}]}}"#,
            r#"{"linux":{"namespaces":[{"type":"pid"}]}}"#,
            r#"{}"#,
        ] {
            std::fs::write(&cfg, joined).unwrap();
            assert!(!Spec::load(dir.path()).unwrap().owns_netns(), "{joined}");
        }
    }

    #[test]
    fn reads_annotations_and_root_and_writes_annotations_back() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#,
        )
        .unwrap();
        let mut spec = Spec::load(dir.path()).unwrap();
        assert_eq!(spec.annotation("a"), None);
        assert!(!spec.terminal());
        assert_eq!(spec.root(dir.path()), dir.path().join("rootfs"));
        spec.set_annotation("a", "b").unwrap();
        let again = Spec::load(dir.path()).unwrap();
        assert_eq!(again.annotation("a"), Some("b"));
        assert_eq!(again.value["ociVersion"], "1.0.2");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"root":{"path":"/abs/root"}}"#,
        )
        .unwrap();
        assert_eq!(
            Spec::load(dir.path()).unwrap().root(dir.path()),
            PathBuf::from("/abs/root")
        );
        std::fs::write(dir.path().join("config.json"), "{").unwrap();
        let err = Spec::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
    }
}

/// `slice:prefix:name` with the slice empty (runc's default) or a `.slice` unit.
fn is_systemd_cgroups_path(path: &str) -> bool {
    let parts: Vec<&str> = path.split(':').collect();
    parts.len() == 3
        && (parts[0].is_empty() || parts[0].ends_with(".slice"))
        && !parts[0].contains('/')
        && !parts[2].is_empty()
}

#[cfg(test)]
mod cgroups_path_tests {
    use super::is_systemd_cgroups_path as systemd;

    #[test]
    fn systemd_form_is_told_from_a_cgroupfs_path() {
        assert!(systemd("system.slice:docker:0123abcd"));
        assert!(systemd(
            "kubepods-besteffort-pod1234.slice:cri-containerd:0123abcd"
        ));
        assert!(systemd(":belayer:sb1"));
        assert!(!systemd("/default/sb1"));
        assert!(!systemd("/kubepods/besteffort/pod1234/0123abcd"));
        assert!(!systemd("default/sb1:x"));
        assert!(!systemd("/a.slice:b:c"));
        assert!(!systemd("system.slice:docker:"));
        assert!(!systemd(""));
    }
}
