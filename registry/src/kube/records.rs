//! The dumps CRI `CheckpointContainer` writes beside a checkpoint (`config.dump`, `spec.dump`,
//! `status.dump`), made the way containerd 2.1 makes them
//! (`internal/cri/server/container_checkpoint_linux.go`) from its records of the container, for
//! a checkpoint Belayer took itself; or, where there is no CRI to ask (the shim replicating a
//! checkpoint), from what the container's own OCI spec says of it ([`ContainerRecords::of_cri_spec`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    CONFIG_DUMP, ConfigDump, CriArchiveLimits, SPEC_DUMP, STATUS_DUMP, SpecDump, annotations,
    check_dump_size, parse_dump,
};
use crate::error::{CriArchiveError, CriSpecError};

/// The spec annotations containerd's CRI plugin gives a pod's container (and its sandbox).
const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
const CRI_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";
const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// The kind [`CRI_CONTAINER_TYPE`] names of a pod's container (a sandbox's is `sandbox`).
const CRI_KIND_CONTAINER: &str = "container";
/// CRI's `ContainerState` of a running container, as the proto numbers it.
const CONTAINER_RUNNING: i32 = 1;
/// The kubelet's annotations that containerd's restore (`CRImportCheckpoint`) takes from the
/// request creating the restored container when `status.dump` has them.
const KUBELET_RESTORE_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.container.hash",
    "io.kubernetes.container.restartCount",
];

/// The dumps of a checkpoint image: the JSON files CRI's archive holds beside `checkpoint/`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CriDumps {
    /// `config.dump`: checkpointctl's `ContainerConfig`.
    pub config: String,
    /// `spec.dump`: the container's OCI spec.
    pub spec: String,
    /// `status.dump`: CRI's `ContainerStatus` of the container.
    pub status: String,
}

impl CriDumps {
    /// The dumps parsed, with the checks an archive's get: each within the bound, JSON.
    pub(super) fn parse(
        &self,
        limits: &CriArchiveLimits,
    ) -> Result<(ConfigDump, SpecDump), CriArchiveError> {
        for (file, text) in [
            (CONFIG_DUMP, &self.config),
            (SPEC_DUMP, &self.spec),
            (STATUS_DUMP, &self.status),
        ] {
            check_dump_size(file, text.len() as u64, limits)?;
        }
        parse_dump::<serde_json::Value>(STATUS_DUMP, self.status.as_bytes())?;
        Ok((
            parse_dump(CONFIG_DUMP, self.config.as_bytes())?,
            parse_dump(SPEC_DUMP, self.spec.as_bytes())?,
        ))
    }

    /// checkpointctl's annotations that an image of these dumps carries, or why they can make
    /// none (no container name, no base image): what a push checks before it exports anything.
    pub fn annotations(
        &self,
        limits: &CriArchiveLimits,
    ) -> Result<BTreeMap<String, String>, CriArchiveError> {
        let (config, spec) = self.parse(limits)?;
        annotations(&config, &spec)
    }
}

/// What containerd records of a container that CRI's dumps are made from.
#[derive(Clone, Debug, Default)]
pub struct ContainerRecords {
    /// The container's id.
    pub id: String,
    /// containerd's container record: the runtime's name (`io.containerd.belayer.v1`).
    pub runtime: String,
    /// containerd's container record: when it was created, nanoseconds since the Unix epoch.
    pub created_unix_ns: i128,
    /// containerd's container record: the OCI spec (its `spec`'s value, JSON).
    pub spec: String,
    /// containerd's container record: the CRI plugin's metadata of it (the extension
    /// `io.cri-containerd.container.metadata`, JSON), if it has one.
    pub cri_metadata: Option<String>,
    /// CRI `ContainerStatus`'s status of it, as JSON with the CRI proto's field names (which
    /// are also the JSON names of containerd's Go types).
    pub status: serde_json::Value,
}

impl ContainerRecords {
    /// The dumps CRI `CheckpointContainer` writes for a checkpoint of this container taken at
    /// `checkpointed_unix_ms`:
    /// - `config.dump`: checkpointctl's `ContainerConfig` as containerd fills it: `id`; `name`,
    ///   the CRI plugin's name of the container (its metadata's `Name`; else the name in the
    ///   status's metadata); `rootfsImage` and `rootfsImageName`, the status's image; `rootfsImageRef`,
    ///   its `image_ref` (the base image by digest, which a restore pulls); `runtime`; the
    ///   creation and checkpoint times (RFC 3339, as Go writes a `time.Time`);
    /// - `spec.dump`: the spec as containerd holds it (what containerd's checkpoint blob holds);
    /// - `status.dump`: the status, without its null fields (Go leaves them out).
    pub fn dumps(&self, checkpointed_unix_ms: u64) -> CriDumps {
        let status = &self.status;
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
        let image = text(&status["image"]["image"]);
        let config = serde_json::json!({
            "id": self.id,
            "name": self.cri_name(),
            "rootfsImage": image,
            "rootfsImageRef": text(&status["image_ref"]),
            "rootfsImageName": image,
            "runtime": self.runtime,
            "createdTime": rfc3339(self.created_unix_ns),
            "checkpointedTime": rfc3339(i128::from(checkpointed_unix_ms) * 1_000_000),
            "restoredTime": rfc3339(GO_ZERO_TIME_UNIX_NS),
            "restored": false,
        });
        let mut status = status.clone();
        drop_nulls(&mut status);
        CriDumps {
            config: config.to_string(),
            spec: self.spec.clone(),
            status: status.to_string(),
        }
    }

    /// The records of container `id` made from its own OCI spec `spec` (JSON), for a node that
    /// has no CRI to ask: the shim, which knows the spec, its runtime `runtime` and when it
    /// created the container (`created_unix_ns`). What the CRI plugin records and the spec does
    /// not say is left out or taken from the spec's annotations:
    /// - the CRI name is the container's name in its pod (`io.kubernetes.cri.container-name`;
    ///   the CRI plugin's `<name>_<pod>_<namespace>_<uid>_<attempt>` is not in the spec);
    /// - the status holds `id`, `metadata.name` (that name), `state` running, `created_at`,
    ///   `image.image` and `image_ref`, both the image as CRI named it to the runtime
    ///   (`io.kubernetes.cri.image-name`: the pod's image as written, `NAME@sha256:…` when the
    ///   pod names it by digest, else by tag, which a restore then pulls as the tag is then),
    ///   and as annotations the kubelet's `io.kubernetes.container.hash` and `…restartCount`,
    ///   empty, so that containerd's restore takes the restoring kubelet's values of them; no
    ///   labels (the restore reads none).
    ///
    /// Refused, naming it: a spec that is not JSON, one without the CRI container type (a
    /// container CRI did not make), a pod's sandbox, and a container without its name or image.
    pub fn of_cri_spec(
        id: &str,
        runtime: &str,
        created_unix_ns: i128,
        spec: &str,
    ) -> Result<Self, CriSpecError> {
        let parsed: serde_json::Value = serde_json::from_str(spec).map_err(CriSpecError::Json)?;
        let annotation = |key: &str| {
            parsed["annotations"][key]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let kind = annotation(CRI_CONTAINER_TYPE).ok_or(CriSpecError::NotCri {
            annotation: CRI_CONTAINER_TYPE,
        })?;
        if kind != CRI_KIND_CONTAINER {
            return Err(CriSpecError::NotContainer {
                kind,
                annotation: CRI_CONTAINER_TYPE,
            });
        }
        let name = annotation(CRI_CONTAINER_NAME).ok_or(CriSpecError::Missing {
            annotation: CRI_CONTAINER_NAME,
            what: "the container's name in its pod",
        })?;
        let image = annotation(CRI_IMAGE_NAME).ok_or(CriSpecError::Missing {
            annotation: CRI_IMAGE_NAME,
            what: "the base image, which a restore pulls",
        })?;
        let annotations: serde_json::Map<String, serde_json::Value> = KUBELET_RESTORE_ANNOTATIONS
            .iter()
            .map(|k| (k.to_string(), serde_json::Value::String(String::new())))
            .collect();
        Ok(Self {
            id: id.to_string(),
            runtime: runtime.to_string(),
            created_unix_ns,
            spec: spec.to_string(),
            cri_metadata: None,
            status: serde_json::json!({
                "id": id,
                "metadata": {"name": name},
                "state": CONTAINER_RUNNING,
                "created_at": i64::try_from(created_unix_ns).unwrap_or_default(),
                "image": {"image": image},
                "image_ref": image,
                "annotations": annotations,
            }),
        })
    }

    /// A tag that names this pod's container by what its user knows of it, not by its id:
    /// `<namespace>_<pod>_<container>` and `suffix` (`_` is in no Kubernetes name, so the three
    /// are told apart), from the spec's CRI annotations. `None` when one of them is missing, or
    /// the tag would not be one (past 128 characters, or a character a tag cannot hold).
    pub fn pod_tag(&self, suffix: &str) -> Option<String> {
        let spec: serde_json::Value = serde_json::from_str(&self.spec).ok()?;
        let annotation = |key: &str| {
            spec["annotations"][key]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_string)
        };
        let tag = format!(
            "{}_{}_{}{suffix}",
            annotation(CRI_SANDBOX_NAMESPACE)?,
            annotation(CRI_SANDBOX_NAME)?,
            annotation(CRI_CONTAINER_NAME)?
        );
        crate::reference::valid_tag(&tag).then_some(tag)
    }

    /// The CRI plugin's name of the container (`<name>_<pod>_<namespace>_<uid>_<attempt>`),
    /// from its metadata; the name in the status's metadata without one.
    fn cri_name(&self) -> String {
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Versioned {
            version: String,
            metadata: Named,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Named {
            name: String,
        }
        self.cri_metadata
            .as_deref()
            .and_then(|m| serde_json::from_str::<Versioned>(m).ok())
            .filter(|v| v.version == "v1" && !v.metadata.name.is_empty())
            .map(|v| v.metadata.name)
            .unwrap_or_else(|| {
                self.status["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
    }
}

/// Go's zero `time.Time` (0001-01-01T00:00:00Z), which a `config.dump` holds as the restore time
/// of a container never restored.
const GO_ZERO_TIME_UNIX_NS: i128 = -62_135_596_800 * 1_000_000_000;

/// Removes the null fields of `v`'s objects, at every depth.
fn drop_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(fields) => {
            fields.retain(|_, f| !f.is_null());
            fields.values_mut().for_each(drop_nulls);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// `unix_ns` (nanoseconds since the Unix epoch) in UTC as RFC 3339 with the fraction Go's
/// `time.RFC3339Nano` writes: trailing zeros cut, none at all for a whole second.
pub fn rfc3339(unix_ns: i128) -> String {
    let secs = unix_ns.div_euclid(1_000_000_000);
    let nanos = unix_ns.rem_euclid(1_000_000_000);
    let (days, day_secs) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i128::from(month <= 2);
    let fraction = if nanos == 0 {
        String::new()
    } else {
        format!(".{nanos:09}").trim_end_matches('0').to_string()
    };
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}{fraction}Z",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60
    )
}
