//! The CRIU configuration file of a Belayer container. On every checkpoint and restore runc hands
//! CRIU the file named by the container's `org.criu.config` annotation (without one,
//! `/etc/criu/runc.conf`). Belayer writes one into the bundle to choose CRIU's network lock:
//! CRIU's default locks a container's network namespace by running `iptables-restore` — twice
//! when a restore starts and four or five times when it ends, together about 60 % of a restore's
//! time on this kernel — while `nftables` takes the same lock through libnftables inside CRIU.
//!
//! An operator's `/etc/criu/runc.conf` is copied into the file, and a `network-lock` it sets
//! wins. A spec that names its own `org.criu.config` is left alone.

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

/// The file's text: the operator's runc.conf, then `network-lock LOCK` unless it sets a lock of
/// its own. `None` when there is nothing to add, so runc's default file serves unchanged.
pub fn render(operator: Option<&str>, lock: Option<&str>) -> Option<String> {
    let lock = lock?;
    let operator = operator.unwrap_or("");
    let sets_lock = operator.lines().any(|l| {
        let word = l.split_whitespace().next().unwrap_or("");
        word.trim_start_matches('-') == "network-lock"
    });
    if sets_lock {
        return None;
    }
    let mut text = String::new();
    if !operator.is_empty() {
        text.push_str(operator);
        if !operator.ends_with('\n') {
            text.push('\n');
        }
    }
    text.push_str("# Belayer (network_lock in /etc/belayer/config.toml)\n");
    text.push_str(&format!("network-lock {lock}\n"));
    Some(text)
}

/// Points `spec` (of `bundle`) at a CRIU configuration file with the network lock of `setting`,
/// before runc creates or restores the container. Blocks: call it off the async runtime.
pub fn apply(
    bundle: &Path,
    spec: &mut Spec,
    setting: &str,
    runc: &criu_bridge::runc::Runc,
) -> Result<()> {
    apply_with(bundle, spec, Path::new(RUNC_CONF), || {
        network_lock(setting, runc)
    })
}

/// [`apply`] with the operator's file at `runc_conf`; `lock` is asked only when needed.
fn apply_with(
    bundle: &Path,
    spec: &mut Spec,
    runc_conf: &Path,
    lock: impl FnOnce() -> Option<&'static str>,
) -> Result<()> {
    if spec.annotation(ANNOTATION).is_some() {
        return Ok(());
    }
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
    let Some(text) = render(operator.as_deref(), lock()) else {
        return Ok(());
    };
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
            render(None, Some("nftables")).unwrap(),
            "# Belayer (network_lock in /etc/belayer/config.toml)\nnetwork-lock nftables\n"
        );
        let text = render(Some("tcp-close"), Some("nftables")).unwrap();
        assert!(text.starts_with("tcp-close\n# Belayer"), "{text}");
        assert!(text.ends_with("network-lock nftables\n"), "{text}");
    }

    #[test]
    fn an_operators_own_lock_wins_and_no_lock_means_no_file() {
        assert_eq!(render(Some("network-lock skip\n"), Some("nftables")), None);
        assert_eq!(
            render(Some("--network-lock iptables"), Some("nftables")),
            None
        );
        assert_eq!(render(Some("tcp-close\n"), None), None);
        assert_eq!(render(None, None), None);
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
        let dir = std::env::temp_dir().join(format!("belayer-criu-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let operator = dir.join("runc.conf");
        std::fs::write(&operator, "tcp-close\n").unwrap();
        std::fs::write(dir.join("config.json"), r#"{"ociVersion":"1.0.2"}"#).unwrap();
        let mut spec = Spec::load(&dir).unwrap();
        apply_with(&dir, &mut spec, &operator, || Some("skip")).unwrap();
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let conf = spec["annotations"][ANNOTATION]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(conf, dir.join(FILE).display().to_string());
        let text = std::fs::read_to_string(&conf).unwrap();
        assert!(text.starts_with("tcp-close\n"), "{text}");
        assert!(text.ends_with("network-lock skip\n"), "{text}");
        assert_eq!(spec["ociVersion"], "1.0.2");

        let own = r#"{"annotations":{"org.criu.config":"/etc/mine.conf"}}"#;
        std::fs::write(dir.join("config.json"), own).unwrap();
        let mut spec = Spec::load(&dir).unwrap();
        apply_with(&dir, &mut spec, &operator, || {
            panic!("not asked: the spec chose")
        })
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.join("config.json")).unwrap(),
            own
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
