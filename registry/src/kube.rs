//! Kubernetes' checkpoint images: the archive the kubelet's checkpoint API (CRI
//! `CheckpointContainer`) writes, pushed as the OCI image KEP-2008's tooling makes of it
//! (`checkpointctl build`, buildah): one uncompressed layer holding the archive's contents, a
//! `linux` image config whose rootfs lists that layer's diff id, and checkpointctl's
//! `org.criu.checkpoint.*` annotations on the manifest. containerd's CRI restores a container
//! created from such an image (`checkIfCheckpointOCIImage`: the manifest carries
//! [`ANNOTATION_CONTAINER_NAME`]; the image is unpacked and its files copied into the new
//! container's restore dir), as it restores one from the archive's path.
//!
//! A checkpoint Belayer made goes up in the same form ([`export_image`]): the shim's export of it
//! (what containerd's `Task.Checkpoint` writes, and CRI puts in its archive's `checkpoint/`) with
//! the dumps CRI would have written beside it, made from containerd's own records of the
//! container ([`ContainerRecords`]).
//!
//! The archive is untrusted input. Its members are walked with [`crate::tar::Walker`] and
//! written again as canonical members (root, time 0, mode 0600 or 0700): only regular files and
//! dirs, each named once, below the archive's root, bounded in number and bytes. What the layer
//! holds is therefore exactly what was checked, whatever the archive's own headers said.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::checkpoint::{PushReport, changed_while_pushed, export_files, push_manifest_with_blobs};
use crate::client::Client;
use crate::digest::Digest;
use crate::error::{CriArchiveError, Error, io};
use crate::oci::{Descriptor, Manifest, OCI_MANIFEST};
use crate::reference::Reference;
use crate::tar::{self, Walker};

/// The layer's media type: an uncompressed OCI layer, which containerd unpacks.
pub const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
/// The config's media type: an OCI image config.
pub const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// checkpointctl's annotation of the engine that made the archive (`containerd`, `CRI-O`).
pub const ANNOTATION_ENGINE: &str = "org.criu.checkpoint.engine.name";
/// The container's name in its pod; containerd's CRI takes an image with it as a checkpoint.
pub const ANNOTATION_CONTAINER_NAME: &str = "org.criu.checkpoint.container.name";
/// The pod's name.
pub const ANNOTATION_POD: &str = "org.criu.checkpoint.pod.name";
/// The pod's namespace.
pub const ANNOTATION_NAMESPACE: &str = "org.criu.checkpoint.pod.namespace";
/// The base image as the user named it (config.dump `rootfsImage`).
pub const ANNOTATION_ROOTFS_IMAGE_USER_REQUESTED: &str =
    "org.criu.checkpoint.rootfsImageUserRequested";
/// The base image's name (config.dump `rootfsImageName`).
pub const ANNOTATION_ROOTFS_IMAGE_NAME: &str = "org.criu.checkpoint.rootfsImageName";
/// The base image's reference by digest (config.dump `rootfsImageRef`), which a restore pulls.
pub const ANNOTATION_ROOTFS_IMAGE_ID: &str = "org.criu.checkpoint.rootfsImageID";
/// The runtime the container ran on (config.dump `runtime`).
pub const ANNOTATION_RUNTIME_NAME: &str = "org.criu.checkpoint.runtime.name";

/// The dump files a restore reads (containerd's CRI reads all three; checkpointctl the first two).
const CONFIG_DUMP: &str = "config.dump";
const SPEC_DUMP: &str = "spec.dump";
const STATUS_DUMP: &str = "status.dump";
/// The CRIU images' dir.
const CHECKPOINT_DIR: &str = "checkpoint";

/// Bounds on a CRI checkpoint archive, checked while it is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CriArchiveLimits {
    /// The most members.
    pub max_members: usize,
    /// The most bytes of all members' data together.
    pub max_bytes: u64,
    /// The most bytes of each dump file read (`config.dump`, `spec.dump`).
    pub max_dump_bytes: u64,
}

impl Default for CriArchiveLimits {
    fn default() -> Self {
        Self {
            max_members: 65_536,
            max_bytes: 256 << 30,
            max_dump_bytes: 4 << 20,
        }
    }
}

/// A CRI checkpoint archive made into an image, ready to push.
#[derive(Clone, Debug)]
pub struct CheckpointImage {
    /// The layer: the archive's members, canonical (a file in the work dir).
    pub layer: PathBuf,
    /// The layer's digest, which is also its diff id (it is not compressed).
    pub layer_digest: Digest,
    /// Its size.
    pub layer_size: u64,
    /// The image config's bytes.
    pub config_bytes: Vec<u8>,
    /// checkpointctl's annotations, from the archive's `config.dump` and `spec.dump`.
    pub annotations: BTreeMap<String, String>,
}

impl CheckpointImage {
    /// The config's descriptor.
    pub fn config_descriptor(&self) -> Descriptor {
        Descriptor::of_bytes(CONFIG_TYPE, &self.config_bytes)
    }

    /// Pushes the image as `reference` (a tag, or a digest that must be the manifest's): its
    /// layer and config where the repository lacks them, then the manifest.
    pub async fn push(&self, client: &Client, reference: &Reference) -> Result<PushReport, Error> {
        push_manifest_with_blobs(
            client,
            reference,
            &[(&self.layer_digest, self.layer_size, self.layer.as_path())],
            &self.config_descriptor(),
            &self.config_bytes,
            &self.manifest(),
        )
        .await
    }

    /// The image manifest: the config, the one layer, the annotations.
    pub fn manifest(&self) -> Manifest {
        Manifest {
            schema_version: 2,
            media_type: OCI_MANIFEST.into(),
            artifact_type: None,
            config: self.config_descriptor(),
            layers: vec![Descriptor {
                media_type: LAYER_TYPE.into(),
                digest: self.layer_digest.clone(),
                size: self.layer_size,
                annotations: BTreeMap::new(),
            }],
            annotations: self.annotations.clone(),
        }
    }
}

/// What `config.dump` says (checkpointctl's `ContainerConfig`, as far as it is read here).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigDump {
    #[serde(default)]
    rootfs_image: String,
    #[serde(default)]
    rootfs_image_ref: String,
    #[serde(default)]
    rootfs_image_name: String,
    #[serde(default, rename = "runtime")]
    oci_runtime: String,
    #[serde(default, rename = "checkpointedTime")]
    checkpointed_at: Option<String>,
}

/// What `spec.dump` says: the OCI spec's annotations.
#[derive(Debug, Default, Deserialize)]
struct SpecDump {
    #[serde(default)]
    annotations: HashMap<String, String>,
}

/// The image's one layer while it is written into the work dir: canonical members (root, time
/// 0, files 0600, dirs 0700), hashed, and counted against the limits as they are written.
struct Layer<'a> {
    path: PathBuf,
    out: HashingWriter<BufWriter<File>>,
    limits: &'a CriArchiveLimits,
    /// What a bad input becomes (naming the archive or the export).
    bad: &'a dyn Fn(CriArchiveError) -> Error,
    members: usize,
    bytes: u64,
}

impl<'a> Layer<'a> {
    /// Creates `layer.tar` in `work` (it must not exist): it will hold a container's memory.
    fn create(
        work: &Path,
        limits: &'a CriArchiveLimits,
        bad: &'a dyn Fn(CriArchiveError) -> Error,
    ) -> Result<Self, Error> {
        let path = work.join("layer.tar");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io(format!("create {}", path.display())))?;
        Ok(Self {
            path,
            out: HashingWriter {
                inner: BufWriter::with_capacity(1 << 20, file),
                hasher: Sha256::new(),
                written: 0,
            },
            limits,
            bad,
            members: 0,
            bytes: 0,
        })
    }

    /// Counts a member of `size` bytes (written or not) against the limits.
    fn count(&mut self, size: u64) -> Result<(), Error> {
        self.members += 1;
        if self.members > self.limits.max_members {
            return Err((self.bad)(CriArchiveError::TooManyMembers {
                limit: self.limits.max_members,
            }));
        }
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > self.limits.max_bytes {
            return Err((self.bad)(CriArchiveError::OverLimit {
                limit: self.limits.max_bytes,
            }));
        }
        Ok(())
    }

    fn dir(&mut self, name: &str) -> Result<(), Error> {
        self.count(0)?;
        tar::write_dir(&mut self.out, name).map_err(write_error_of(&self.path))
    }

    /// A file member `name` of `size` bytes read from `data`; `read_error` names a failure.
    fn file(
        &mut self,
        name: &str,
        size: u64,
        data: &mut impl Read,
        read_error: impl FnOnce(std::io::Error) -> Error,
    ) -> Result<(), Error> {
        self.count(size)?;
        tar::write_file(&mut self.out, name, size, data).map_err(read_error)
    }

    /// Ends the layer and makes the image around it, its annotations from the dumps;
    /// `created_by` goes in the config's history.
    fn finish(
        mut self,
        config: &ConfigDump,
        spec: &SpecDump,
        created_by: &str,
    ) -> Result<CheckpointImage, Error> {
        let annotations = annotations(config, spec).map_err(self.bad)?;
        tar::write_end(&mut self.out).map_err(write_error_of(&self.path))?;
        self.out.inner.flush().map_err(write_error_of(&self.path))?;
        let layer_digest = Digest::from_hasher(self.out.hasher);
        let image_config = serde_json::json!({
            "created": config.checkpointed_at,
            "architecture": oci_architecture(),
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest.as_str()]},
            "history": [{
                "created": config.checkpointed_at,
                "created_by": created_by,
                "comment": "a CRI checkpoint archive's contents",
            }],
        });
        Ok(CheckpointImage {
            layer: self.path,
            layer_digest,
            layer_size: self.out.written,
            config_bytes: serde_json::to_vec(&image_config).expect("a config serializes"),
            annotations,
        })
    }
}

/// Parses dump `file` (`config.dump` or `spec.dump`) of `bytes`.
fn parse_dump<T: serde::de::DeserializeOwned>(
    file: &'static str,
    bytes: &[u8],
) -> Result<T, CriArchiveError> {
    serde_json::from_slice(bytes).map_err(|source| CriArchiveError::DumpJson { file, source })
}

/// Reads the CRI checkpoint archive `archive` and writes its image's layer into the dir `work`
/// (as `layer.tar`, which must not exist). Fails, naming the member or file at fault, on an archive that is
/// not an uncompressed tar of regular files and dirs below its root, each named once, with
/// `config.dump`, `spec.dump`, `status.dump` and `checkpoint/`, within `limits`.
pub fn checkpoint_image(
    archive: &Path,
    work: &Path,
    limits: &CriArchiveLimits,
) -> Result<CheckpointImage, Error> {
    let bad = |source| Error::CriArchive {
        path: archive.to_path_buf(),
        source,
    };
    let mut src = File::open(archive).map_err(io(format!("open {}", archive.display())))?;
    let mut magic = [0u8; 4];
    let n = src
        .read(&mut magic)
        .map_err(io(format!("read {}", archive.display())))?;
    if let Some(format) = compression(&magic[..n]) {
        return Err(bad(CriArchiveError::Compressed { format }));
    }
    let mut layer = Layer::create(work, limits, &bad)?;
    let mut seen: HashMap<String, bool> = HashMap::new();
    let (mut config, mut spec) = (None, None);
    // One handle walks the headers, the other reads the members' data.
    let mut headers = File::open(archive).map_err(io(format!("open {}", archive.display())))?;
    let mut walker = Walker::new(&mut headers, 0);
    while let Some(entry) = walker
        .next_entry()
        .map_err(|e| bad(CriArchiveError::Tar(e)))?
    {
        let member = || entry.name.clone();
        if entry.path.is_empty() || entry.path == "." {
            // The archive's root.
            if !entry.is_dir() {
                return Err(bad(CriArchiveError::NotFileOrDir {
                    member: member(),
                    kind: char::from(entry.kind),
                }));
            }
            layer.count(0)?;
            continue;
        }
        // Relative, each component a real name (a leading `/` makes an empty first one).
        if !entry.path.split('/').all(crate::checkpoint::is_component) {
            return Err(bad(CriArchiveError::Path { member: member() }));
        }
        if !(entry.is_file() || entry.is_dir()) {
            return Err(bad(CriArchiveError::NotFileOrDir {
                member: member(),
                kind: char::from(entry.kind),
            }));
        }
        if entry.sparse {
            return Err(bad(CriArchiveError::Sparse { member: member() }));
        }
        let mut parent = entry.path.as_str();
        while let Some((p, _)) = parent.rsplit_once('/') {
            if seen.get(p) == Some(&false) {
                return Err(bad(CriArchiveError::UnderFile {
                    member: member(),
                    file: p.into(),
                }));
            }
            parent = p;
        }
        if seen.insert(entry.path.clone(), entry.is_dir()).is_some() {
            return Err(bad(CriArchiveError::Twice { member: member() }));
        }
        if entry.is_dir() {
            layer.dir(&entry.path)?;
            continue;
        }
        if entry.path == CONFIG_DUMP || entry.path == SPEC_DUMP {
            let file = dump_name(&entry.path);
            check_dump_size(file, entry.size, limits).map_err(bad)?;
            let mut bytes = Vec::new();
            tar::copy_range(&mut src, entry.data_at, entry.size, &mut bytes)
                .map_err(io(format!("read {} in {}", entry.path, archive.display())))?;
            if entry.path == CONFIG_DUMP {
                config = Some(parse_dump::<ConfigDump>(file, &bytes).map_err(bad)?);
            } else {
                spec = Some(parse_dump::<SpecDump>(file, &bytes).map_err(bad)?);
            }
        }
        src.seek(SeekFrom::Start(entry.data_at))
            .map_err(io(format!("read {}", archive.display())))?;
        let read_error = io(format!(
            "copy {} of {} into {}",
            entry.path,
            archive.display(),
            layer.path.display()
        ));
        layer.file(&entry.path, entry.size, &mut src, read_error)?;
    }
    for required in [CONFIG_DUMP, SPEC_DUMP, STATUS_DUMP] {
        if seen.get(required) != Some(&false) {
            return Err(bad(CriArchiveError::Missing { file: required }));
        }
    }
    if !seen.keys().any(|p| {
        p.strip_prefix(CHECKPOINT_DIR)
            .is_some_and(|r| r.starts_with('/'))
    }) {
        return Err(bad(CriArchiveError::Missing {
            file: "checkpoint/",
        }));
    }
    let (config, spec) = (config.unwrap_or_default(), spec.unwrap_or_default());
    layer.finish(&config, &spec, "belayer push --cri-archive")
}

/// Writes the image of the shim's export in `export` (the newest CRIU images and the chain
/// archive, as containerd's `Task.Checkpoint` writes them) with `dumps` beside it, as CRI's
/// archive holds them: `checkpoint/` with the export's files, then `config.dump`, `spec.dump` and
/// `status.dump`. The layer goes into `work` as `layer.tar` (which must not exist). The dumps
/// get the checks an archive's get (bounded, JSON, the container's name and base image named).
pub fn export_image(
    export: &Path,
    dumps: &CriDumps,
    work: &Path,
    limits: &CriArchiveLimits,
) -> Result<CheckpointImage, Error> {
    let bad = |source| Error::KubeExport {
        path: export.to_path_buf(),
        source,
    };
    let (config, spec) = dumps.parse(limits).map_err(bad)?;
    let files = export_files(export)?;
    let mut layer = Layer::create(work, limits, &bad)?;
    layer.dir(CHECKPOINT_DIR)?;
    for (name, path, size) in files {
        let mut f = File::open(&path).map_err(io(format!("open {}", path.display())))?;
        layer.file(
            &format!("{CHECKPOINT_DIR}/{name}"),
            size,
            &mut f,
            changed_while_pushed(&path),
        )?;
    }
    let layer_path = layer.path.clone();
    for (name, bytes) in [
        (CONFIG_DUMP, &dumps.config),
        (SPEC_DUMP, &dumps.spec),
        (STATUS_DUMP, &dumps.status),
    ] {
        let write_error = write_error_of(&layer_path);
        layer.file(name, bytes.len() as u64, &mut bytes.as_bytes(), write_error)?;
    }
    layer.finish(&config, &spec, "belayer push --kube")
}

/// Refuses dump `file` of `size` bytes over the bound.
fn check_dump_size(
    file: &'static str,
    size: u64,
    limits: &CriArchiveLimits,
) -> Result<(), CriArchiveError> {
    if size > limits.max_dump_bytes {
        return Err(CriArchiveError::DumpOverLimit {
            file,
            limit: limits.max_dump_bytes,
        });
    }
    Ok(())
}

fn write_error_of(layer: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: format!("write {}", layer.display()),
        source,
    }
}

fn dump_name(path: &str) -> &'static str {
    if path == CONFIG_DUMP {
        CONFIG_DUMP
    } else {
        SPEC_DUMP
    }
}

/// checkpointctl's annotations (those `checkpointctl build` writes), from the dumps: the
/// engine from the spec's `io.container.manager` (CRI-O's, else containerd's), the container,
/// pod and namespace from the spec's annotations as that engine writes them, the images and the
/// runtime from `config.dump`.
fn annotations(
    config: &ConfigDump,
    spec: &SpecDump,
) -> Result<BTreeMap<String, String>, CriArchiveError> {
    let a = |k: &str| spec.annotations.get(k).cloned().unwrap_or_default();
    let (engine, (name, name_field), pod, namespace) =
        match spec.annotations.get("io.container.manager") {
            Some(m) if m == "cri-o" => {
                #[derive(Deserialize)]
                struct Metadata {
                    #[serde(default)]
                    name: String,
                }
                let metadata = a("io.kubernetes.cri-o.Metadata");
                let name = serde_json::from_str::<Metadata>(&metadata)
                    .map_err(|source| CriArchiveError::DumpJson {
                        file: SPEC_DUMP,
                        source,
                    })?
                    .name;
                (
                    "CRI-O",
                    (name, "name in the annotation io.kubernetes.cri-o.Metadata"),
                    a("io.kubernetes.pod.name"),
                    a("io.kubernetes.pod.namespace"),
                )
            }
            Some(m) if m == "libpod" => {
                return Err(CriArchiveError::Engine {
                    engine: "libpod".into(),
                });
            }
            _ => (
                "containerd",
                (
                    a("io.kubernetes.cri.container-name"),
                    "annotation io.kubernetes.cri.container-name",
                ),
                a("io.kubernetes.cri.sandbox-name"),
                a("io.kubernetes.cri.sandbox-namespace"),
            ),
        };
    let required = [
        (SPEC_DUMP, name_field, &name),
        (CONFIG_DUMP, "rootfsImageRef", &config.rootfs_image_ref),
        (CONFIG_DUMP, "rootfsImageName", &config.rootfs_image_name),
    ];
    for (file, field, value) in required {
        if value.is_empty() {
            return Err(CriArchiveError::NoValue { file, field });
        }
    }
    Ok([
        (ANNOTATION_ENGINE, engine.to_string()),
        (ANNOTATION_CONTAINER_NAME, name),
        (ANNOTATION_POD, pod),
        (ANNOTATION_NAMESPACE, namespace),
        (
            ANNOTATION_ROOTFS_IMAGE_USER_REQUESTED,
            config.rootfs_image.clone(),
        ),
        (
            ANNOTATION_ROOTFS_IMAGE_NAME,
            config.rootfs_image_name.clone(),
        ),
        (ANNOTATION_ROOTFS_IMAGE_ID, config.rootfs_image_ref.clone()),
        (ANNOTATION_RUNTIME_NAME, config.oci_runtime.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect())
}

/// The compression whose magic `head` starts with, if any.
fn compression(head: &[u8]) -> Option<&'static str> {
    [
        (&b"\x1f\x8b"[..], "gzip"),
        (&b"\x28\xb5\x2f\xfd"[..], "zstd"),
        (&b"BZh"[..], "bzip2"),
        (&b"\xfd7zX"[..], "xz"),
    ]
    .into_iter()
    .find(|(magic, _)| head.starts_with(magic))
    .map(|(_, name)| name)
}

/// This machine's architecture as OCI image configs name it (Go's `GOARCH`).
fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

/// A writer that hashes and counts what goes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Makes the CRI checkpoint archive `archive` into its image ([`checkpoint_image`], in a work
/// dir `work` that must not exist, created 0700 and removed afterwards) and pushes it as
/// `reference`.
pub async fn push_cri_archive(
    client: &Client,
    reference: &Reference,
    archive: &Path,
    work: &Path,
    limits: &CriArchiveLimits,
) -> Result<PushReport, Error> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(work)
        .map_err(io(format!("create {}", work.display())))?;
    let pushed = match checkpoint_image(archive, work, limits) {
        Ok(image) => image.push(client, reference).await,
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(work);
    pushed
}

mod records;

pub use records::{ContainerRecords, CriDumps, rfc3339};

#[cfg(test)]
mod tests;
