//! OCI image manifests and descriptors, as far as Belayer writes and reads them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::digest::Digest;

/// An OCI image manifest's media type.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// A content descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The content's media type.
    pub media_type: String,
    /// Its digest.
    pub digest: Digest,
    /// Its size in bytes.
    pub size: u64,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    /// The descriptor of `bytes` of `media_type`, without annotations.
    pub fn of_bytes(media_type: &str, bytes: &[u8]) -> Self {
        Self {
            media_type: media_type.into(),
            digest: Digest::of(bytes),
            size: bytes.len() as u64,
            annotations: BTreeMap::new(),
        }
    }
}

/// An OCI image manifest (`schemaVersion` 2) with an `artifactType`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`OCI_MANIFEST`].
    pub media_type: String,
    /// What the artifact is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layer blobs.
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    /// An image manifest of `artifact_type` with `config` and `layers`.
    pub fn new(artifact_type: &str, config: Descriptor, layers: Vec<Descriptor>) -> Self {
        Self {
            schema_version: 2,
            media_type: OCI_MANIFEST.into(),
            artifact_type: Some(artifact_type.into()),
            config,
            layers,
            annotations: BTreeMap::new(),
        }
    }

    /// Its canonical bytes (what is pushed and digested).
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest serializes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_serializes_as_the_image_spec_names_its_fields() {
        let d = |b: &[u8], t: &str| Descriptor {
            media_type: t.into(),
            digest: Digest::of(b),
            size: b.len() as u64,
            annotations: BTreeMap::new(),
        };
        let mut m = Manifest::new(
            "application/vnd.belayer.checkpoint.v1",
            d(b"{}", "application/x-config"),
            vec![d(b"layer", "application/x-layer")],
        );
        m.layers[0]
            .annotations
            .insert("org.opencontainers.image.title".into(), "l".into());
        let v: serde_json::Value = serde_json::from_slice(&m.to_bytes()).unwrap();
        assert_eq!(v["schemaVersion"], 2);
        assert_eq!(v["mediaType"], OCI_MANIFEST);
        assert_eq!(v["artifactType"], "application/vnd.belayer.checkpoint.v1");
        assert_eq!(v["config"]["size"], 2);
        assert_eq!(v["layers"][0]["digest"], Digest::of(b"layer").as_str());
        assert_eq!(
            v["layers"][0]["annotations"]["org.opencontainers.image.title"],
            "l"
        );
        assert!(v.get("annotations").is_none());
        let back: Manifest = serde_json::from_slice(&m.to_bytes()).unwrap();
        assert_eq!(back, m);
        // A descriptor with a digest that is no sha256 does not parse.
        let bad = String::from_utf8(m.to_bytes())
            .unwrap()
            .replace("sha256:", "md5:");
        assert!(serde_json::from_str::<Manifest>(&bad).is_err());
    }
}
