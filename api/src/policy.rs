//! What Belayer does for one container ([`ContainerPolicy`]), and what it reports after a restore
//! ([`Position`]) or an automatic recovery ([`Recovery`]).

use serde::{Deserialize, Serialize};

use crate::annotations::{
    ACTIONS_ANNOTATION, CHECKPOINT_ANNOTATION, KEEP_ANNOTATION, POLICY_ANNOTATION,
    RECOVER_ANNOTATION, REPLICATE_ANNOTATION,
};
use crate::control::RestoreInfo;
use crate::settings::Settings;

/// What Belayer does for one container, from its annotations and the node's settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerPolicy {
    /// Checkpoint automatically at action boundaries.
    pub auto: bool,
    /// Restore the newest checkpoint when init dies without a kill from containerd.
    pub recover: bool,
    /// After a restore, re-run the journalled actions the checkpoint does not reflect.
    pub replay: bool,
    /// Checkpoints kept by automatic checkpointing.
    pub keep: usize,
    /// Action boundaries come from the container's cgroup activity, not from its execs.
    #[serde(default)]
    pub activity: bool,
    /// The registry repository automatic checkpoints are pushed to, in the background.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicate: Option<String>,
}

impl ContainerPolicy {
    /// The policy of a container whose spec's annotation `key` is `annotation(key)`.
    pub fn from_annotations<'a>(
        annotation: impl Fn(&str) -> Option<&'a str>,
        settings: &Settings,
    ) -> Self {
        let get = |key: &str, default: &str| annotation(key).unwrap_or(default).to_string();
        Self {
            auto: get(CHECKPOINT_ANNOTATION, &settings.checkpoint) == "auto",
            recover: get(RECOVER_ANNOTATION, &settings.recover) == "auto",
            replay: get(POLICY_ANNOTATION, &settings.policy) == "replay",
            keep: get(KEEP_ANNOTATION, "")
                .parse()
                .unwrap_or(settings.keep)
                .max(1),
            activity: get(ACTIONS_ANNOTATION, &settings.actions) == "activity",
            replicate: Some(get(REPLICATE_ANNOTATION, &settings.replication.repository))
                .filter(|r| !r.is_empty() && r != "off"),
        }
    }
}

/// Which journalled actions the environment reflects after a restore.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Position {
    pub checkpoint: String,
    /// Actions 1..=k are reflected; later ones were undone.
    pub action: u64,
    pub reflects: String,
    pub policy: String,
    /// For `replay`: the actions re-run, and those whose exit code differed.
    pub replayed: u64,
    pub mismatches: Vec<String>,
}

/// One automatic recovery.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Recovery {
    pub at_unix_ms: u64,
    pub exit_status: u32,
    pub restore: RestoreInfo,
    pub position: Option<Position>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_override_the_node_settings() {
        let settings = Settings {
            keep: 4,
            ..Settings::default()
        };
        let none = ContainerPolicy::from_annotations(|_| None, &settings);
        assert_eq!(
            none,
            ContainerPolicy {
                auto: false,
                recover: false,
                replay: false,
                keep: 4,
                activity: false,
                replicate: None,
            }
        );
        let all = ContainerPolicy::from_annotations(
            |k| match k {
                CHECKPOINT_ANNOTATION | RECOVER_ANNOTATION => Some("auto"),
                POLICY_ANNOTATION => Some("replay"),
                KEEP_ANNOTATION => Some("0"),
                ACTIONS_ANNOTATION => Some("activity"),
                REPLICATE_ANNOTATION => Some("127.0.0.1:5000/sandboxes"),
                _ => None,
            },
            &settings,
        );
        // At least one checkpoint is kept.
        assert_eq!(
            all,
            ContainerPolicy {
                auto: true,
                recover: true,
                replay: true,
                keep: 1,
                activity: true,
                replicate: Some("127.0.0.1:5000/sandboxes".into()),
            }
        );
        // The node's repository, and `off` for one container.
        let node = Settings {
            replication: crate::settings::Replication {
                repository: "reg.example/belayer".into(),
                ..Default::default()
            },
            ..Settings::default()
        };
        let from_node = ContainerPolicy::from_annotations(|_| None, &node);
        assert_eq!(from_node.replicate.as_deref(), Some("reg.example/belayer"));
        let off = ContainerPolicy::from_annotations(
            |k| (k == REPLICATE_ANNOTATION).then_some("off"),
            &node,
        );
        assert_eq!(off.replicate, None);
        let bad_keep =
            ContainerPolicy::from_annotations(|k| (k == KEEP_ANNOTATION).then_some("x"), &settings);
        assert_eq!(bad_keep.keep, 4);
    }
}
