//! A Belayer checkpoint export as an OCI artifact, and back.
//!
//! An export (the shim's `export.rs`: what containerd's `Task.Checkpoint` writes and a create
//! from a checkpoint imports) is a flat directory: the newest checkpoint's CRIU images, and
//! [`CHAIN_ARCHIVE`], a GNU tar of the chain's checkpoint dirs (`checkpoints/<namespace>/
//! <container>/<seq>/`, every member but the newest one's CRIU images). On push it is split
//! into one blob per chain member and part:
//! - a layer ([`LAYER_TYPE`]): the member's entries of the chain archive but its CRIU dir, as
//!   GNU tar wrote them, with only the pax access and change times dropped (they change whenever
//!   the store is read): the same member's layer is the same bytes in every export;
//! - its CRIU images ([`CRIU_TYPE`]): a tar of canonical members (root, mode 0600, time 0,
//!   sorted), written from the flat images for the newest checkpoint and from the chain archive
//!   for the others, so that a checkpoint's images are the same blob whether it is the newest
//!   of an export or an older member of a later one.
//!
//! A later checkpoint of the same chain therefore uploads only its own layer, its images and the
//! config: every other blob is in the registry already (`HEAD` first). On pull, each blob is
//! checked against its descriptor, its members confined to its checkpoint dir, and the export
//! rebuilt: the layers and older members' images concatenated (their end-of-archive blocks
//! dropped) into [`CHAIN_ARCHIVE`], the newest checkpoint's images written flat beside it. The
//! directory is then exactly what the import takes, and goes through all of its checks.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::AsyncSeekExt;

use crate::client::{Access, Client};
use crate::digest::Digest;
use crate::error::{ArchiveError, Error, LayoutError, io};
use crate::oci::{Descriptor, Manifest, OCI_MANIFEST};
use crate::reference::Reference;
use crate::tar::{self, Entry, Walker};

/// The artifact type of a Belayer checkpoint.
pub const ARTIFACT_TYPE: &str = "application/vnd.belayer.checkpoint.v1";
/// The config blob's media type: [`CheckpointConfig`] as JSON.
pub const CONFIG_TYPE: &str = "application/vnd.belayer.checkpoint.config.v1+json";
/// A chain member's layer: its checkpoint dir but its CRIU images, a tar.
pub const LAYER_TYPE: &str = "application/vnd.belayer.checkpoint.layer.v1.tar";
/// A chain member's CRIU images, a tar of canonical members.
pub const CRIU_TYPE: &str = "application/vnd.belayer.checkpoint.criu.v1.tar";
/// The chain archive of an export (the shim's `export::CHAIN_ARCHIVE`).
pub const CHAIN_ARCHIVE: &str = "belayer-chain.tar";
/// The annotation naming a layer's checkpoint.
pub const ANNOTATION_SEQ: &str = "io.belayer.checkpoint.seq";
/// The annotation naming a layer's part: `layer` or `criu`.
pub const ANNOTATION_PART: &str = "io.belayer.checkpoint.part";
/// The format of [`CheckpointConfig`] this crate writes and reads.
pub const CONFIG_FORMAT: u32 = 1;

/// The most bytes of a member's `manifest.json` read on push.
const MAX_CHECKPOINT_MANIFEST: u64 = 16 << 20;
/// The prefix of the temporary file of the newest images' blob in a pull's directory.
const PULL_TMP: &str = ".belayer-pull-";

/// The config blob.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckpointConfig {
    /// [`CONFIG_FORMAT`].
    pub format: u32,
    /// The namespace the checkpoints were taken in (an import files them under its own).
    pub namespace: String,
    /// The container they were taken of (likewise).
    pub container: String,
    /// The newest checkpoint: the one the export restores.
    pub newest: u64,
    /// The chain's checkpoints, in the chain archive's order (the layers' order).
    pub members: Vec<u64>,
    /// The newest checkpoint's `manifest.json` (Belayer's checkpoint manifest).
    pub manifest: serde_json::Value,
    /// Actions (execs) the container had completed at the newest checkpoint's instant, from
    /// its action journal: what the agent loop is told after a pull restores it. Absent when
    /// the pushing node's journal has no position for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_position: Option<u64>,
}

/// Which part of a chain member a blob holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// Its checkpoint dir but its CRIU images ([`LAYER_TYPE`]).
    Layer,
    /// Its CRIU images ([`CRIU_TYPE`]).
    Criu,
}

impl Part {
    fn media_type(self) -> &'static str {
        match self {
            Part::Layer => LAYER_TYPE,
            Part::Criu => CRIU_TYPE,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Part::Layer => "layer",
            Part::Criu => "criu",
        }
    }
}

/// A blob of an export, written to a work directory.
#[derive(Clone, Debug)]
pub struct PartFile {
    /// Its checkpoint.
    pub seq: u64,
    /// Its part.
    pub part: Part,
    /// The file.
    pub path: PathBuf,
    /// Its digest.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
}

impl PartFile {
    fn descriptor(&self) -> Descriptor {
        Descriptor {
            media_type: self.part.media_type().into(),
            digest: self.digest.clone(),
            size: self.size,
            annotations: BTreeMap::from([
                (ANNOTATION_SEQ.to_string(), self.seq.to_string()),
                (ANNOTATION_PART.to_string(), self.part.name().to_string()),
            ]),
        }
    }
}

/// An export split into the blobs of its artifact ([`archive_parts`]).
#[derive(Clone, Debug)]
pub struct ArchiveParts {
    /// The config.
    pub config: CheckpointConfig,
    /// The config blob's bytes.
    pub config_bytes: Vec<u8>,
    /// The blobs, in the manifest's order: per member, its layer then its images.
    pub parts: Vec<PartFile>,
}

impl ArchiveParts {
    /// Records the journal position of the newest checkpoint in the config (which an export
    /// does not carry: the journal lives beside the store).
    pub fn set_journal_position(&mut self, position: Option<u64>) {
        self.config.journal_position = position;
        self.config_bytes = serde_json::to_vec(&self.config).expect("a config serializes");
    }

    /// The config blob's descriptor.
    pub fn config_descriptor(&self) -> Descriptor {
        Descriptor::of_bytes(CONFIG_TYPE, &self.config_bytes)
    }

    /// The artifact's manifest.
    pub fn manifest(&self) -> Manifest {
        let mut m = Manifest::new(
            ARTIFACT_TYPE,
            self.config_descriptor(),
            self.parts.iter().map(PartFile::descriptor).collect(),
        );
        m.annotations.insert(
            "org.opencontainers.image.title".into(),
            format!(
                "{}/{} checkpoint {}",
                self.config.namespace, self.config.container, self.config.newest
            ),
        );
        m
    }
}

/// One path component: not empty, `.` or `..`, with no `/` and no NUL (which would end the name
/// early for a C reader: another name than the one checked).
pub(crate) fn is_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\0')
}

/// Splits the export in directory `export` into its artifact's blobs, written under `work`
/// (created if need be; the caller removes it after the push). Refuses an export that is not as
/// the shim writes one.
pub fn archive_parts(export: &Path, work: &Path) -> Result<ArchiveParts, Error> {
    let chain_path = export.join(CHAIN_ARCHIVE);
    let bad = |source: ArchiveError| Error::Archive {
        path: chain_path.clone(),
        source,
    };
    let mut chain =
        File::open(&chain_path).map_err(io(format!("open {}", chain_path.display())))?;
    let mut entries = Vec::new();
    {
        let mut w = Walker::new(&mut chain, 0);
        while let Some(e) = w.next_entry().map_err(|e| bad(e.into()))? {
            entries.push(e);
        }
    }
    // Group the members by checkpoint, in the archive's order.
    let mut owner: Option<(String, String)> = None;
    let mut members: Vec<(u64, Vec<Entry>)> = Vec::new();
    for e in entries {
        let parts: Vec<&str> = e.path.split('/').collect();
        if parts.len() < 4 || parts[0] != "checkpoints" {
            return Err(bad(ArchiveError::NotInCheckpoint { member: e.path }));
        }
        let seq: u64 = parts[3].parse().map_err(|_| {
            bad(ArchiveError::NoCheckpointId {
                member: e.path.clone(),
                seq: parts[3].to_string(),
            })
        })?;
        let who = (parts[1].to_string(), parts[2].to_string());
        match &owner {
            None => owner = Some(who),
            Some(o) if *o != who => {
                return Err(bad(ArchiveError::TwoContainers {
                    first: format!("{}/{}", o.0, o.1),
                    second: format!("{}/{}", who.0, who.1),
                }));
            }
            Some(_) => {}
        }
        match members.last_mut() {
            Some((s, v)) if *s == seq => v.push(e),
            _ => {
                if members.iter().any(|(s, _)| *s == seq) {
                    return Err(bad(ArchiveError::Scattered { seq }));
                }
                members.push((seq, vec![e]));
            }
        }
    }
    let (namespace, container) = owner.ok_or_else(|| bad(ArchiveError::NoCheckpoint))?;
    let newest = members.iter().map(|(s, _)| *s).max().unwrap_or_default();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(work)
        .map_err(io(format!("create {}", work.display())))?;

    let mut parts = Vec::new();
    let mut newest_manifest = None;
    for (i, (seq, entries)) in members.iter().enumerate() {
        let prefix = format!("checkpoints/{namespace}/{container}/{seq}");
        let manifest = member_manifest(&mut chain, entries, &prefix).map_err(&bad)?;
        let criu_dir = manifest
            .get("criu_dir")
            .and_then(|v| v.as_str())
            .unwrap_or("criu")
            .to_string();
        if !is_component(&criu_dir) {
            return Err(bad(ArchiveError::CriuDir {
                seq: *seq,
                criu_dir,
            }));
        }
        let criu_prefix = format!("{prefix}/{criu_dir}");
        let in_criu = |e: &Entry| {
            e.path == criu_prefix
                || e.path
                    .strip_prefix(&criu_prefix)
                    .is_some_and(|r| r.starts_with('/'))
        };
        let (criu, layer): (Vec<&Entry>, Vec<&Entry>) = entries.iter().partition(|e| in_criu(e));

        let path = work.join(format!("{i}-{seq}-layer.tar"));
        let mut out = create_private(&path)?;
        for e in &layer {
            tar::copy_normalized(&mut chain, e, &mut out)
                .map_err(io(format!("write {}", path.display())))?;
        }
        finish(out, &path)?;
        parts.push(part_file(*seq, Part::Layer, path)?);

        let path = work.join(format!("{i}-{seq}-criu.tar"));
        if *seq == newest {
            if !criu.is_empty() {
                return Err(bad(ArchiveError::NewestImagesInside { seq: *seq }));
            }
            let mut out = create_private(&path)?;
            flat_images(export, &criu_prefix, &mut out)?;
            finish(out, &path)?;
            newest_manifest = Some(manifest);
        } else if criu.is_empty() {
            continue;
        } else {
            let mut out = create_private(&path)?;
            match canonical_images(&criu, &criu_prefix) {
                Some(files) => {
                    tar::write_dir(&mut out, &criu_prefix)
                        .map_err(io(format!("write {}", path.display())))?;
                    for e in files {
                        chain
                            .seek(SeekFrom::Start(e.data_at))
                            .map_err(io(format!("read {}", chain_path.display())))?;
                        tar::write_file(&mut out, &e.path, e.size, &mut (&mut chain).take(e.size))
                            .map_err(io(format!("write {}", path.display())))?;
                    }
                }
                // Not a flat dir of plain files (a sparse image): kept as GNU tar wrote it.
                None => {
                    for e in &criu {
                        tar::copy_normalized(&mut chain, e, &mut out)
                            .map_err(io(format!("write {}", path.display())))?;
                    }
                }
            }
            finish(out, &path)?;
        }
        parts.push(part_file(*seq, Part::Criu, path)?);
    }
    let config = CheckpointConfig {
        format: CONFIG_FORMAT,
        namespace,
        container,
        newest,
        members: members.iter().map(|(s, _)| *s).collect(),
        manifest: newest_manifest.unwrap_or_default(),
        journal_position: None,
    };
    let config_bytes = serde_json::to_vec(&config).expect("a config serializes");
    Ok(ArchiveParts {
        config,
        config_bytes,
        parts,
    })
}

fn create_private(path: &Path) -> Result<BufWriter<File>, Error> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map(|f| BufWriter::with_capacity(1 << 20, f))
        .map_err(io(format!("create {}", path.display())))
}

fn finish(mut out: BufWriter<File>, path: &Path) -> Result<(), Error> {
    tar::write_end(&mut out)
        .and_then(|()| out.flush())
        .map_err(io(format!("write {}", path.display())))
}

fn part_file(seq: u64, part: Part, path: PathBuf) -> Result<PartFile, Error> {
    let (digest, size) = Digest::of_file(&path).map_err(io(format!("read {}", path.display())))?;
    Ok(PartFile {
        seq,
        part,
        path,
        digest,
        size,
    })
}

/// The JSON of `prefix/manifest.json` among `entries`.
fn member_manifest(
    chain: &mut File,
    entries: &[Entry],
    prefix: &str,
) -> Result<serde_json::Value, ArchiveError> {
    let name = format!("{prefix}/manifest.json");
    let e = entries
        .iter()
        .find(|e| e.path == name && e.is_file())
        .ok_or_else(|| ArchiveError::NoManifest {
            prefix: prefix.to_string(),
        })?;
    if e.size > MAX_CHECKPOINT_MANIFEST || e.sparse {
        return Err(ArchiveError::ManifestOverLimit {
            name,
            limit: MAX_CHECKPOINT_MANIFEST,
        });
    }
    let mut data = vec![0u8; e.size as usize];
    if let Err(source) = chain
        .seek(SeekFrom::Start(e.data_at))
        .and_then(|_| chain.read_exact(&mut data))
    {
        return Err(ArchiveError::ReadManifest { name, source });
    }
    serde_json::from_slice(&data).map_err(|source| ArchiveError::ManifestJson { name, source })
}

/// The files of a CRIU dir's members, sorted by name, if they are its dir then plain files
/// directly in it.
fn canonical_images<'a>(criu: &[&'a Entry], criu_prefix: &str) -> Option<Vec<&'a Entry>> {
    let (dir, files) = criu.split_first()?;
    if !dir.is_dir() || dir.path != criu_prefix {
        return None;
    }
    let mut out = Vec::new();
    for e in files {
        let name = e.path.strip_prefix(criu_prefix)?.strip_prefix('/')?;
        if !e.is_file() || e.sparse || !is_component(name) {
            return None;
        }
        out.push(*e);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Some(out)
}

/// Writes the newest checkpoint's images, the regular files of `export` but the chain archive,
/// as canonical members under `criu_prefix`.
fn flat_images(export: &Path, criu_prefix: &str, out: &mut impl Write) -> Result<(), Error> {
    let w = |e| io(format!("write the images of {criu_prefix}"))(e);
    tar::write_dir(out, criu_prefix).map_err(w)?;
    for (name, path, size) in export_files(export)? {
        if name == CHAIN_ARCHIVE {
            continue;
        }
        let mut f = File::open(&path).map_err(io(format!("open {}", path.display())))?;
        tar::write_file(out, &format!("{criu_prefix}/{name}"), size, &mut f)
            .map_err(changed_while_pushed(&path))?;
    }
    Ok(())
}

/// The files of the export in `export` (the newest images and [`CHAIN_ARCHIVE`]) as (name,
/// path, size), sorted by name. Anything but a regular file named by a plain component is an
/// error, for an export holds nothing else.
pub(crate) fn export_files(export: &Path) -> Result<Vec<(String, PathBuf, u64)>, Error> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(export).map_err(io(format!("read {}", export.display())))? {
        let e = e.map_err(io(format!("read {}", export.display())))?;
        let meta = e
            .path()
            .symlink_metadata()
            .map_err(io(format!("stat {}", e.path().display())))?;
        let name = e.file_name().into_string().ok().filter(|n| is_component(n));
        match name {
            Some(n) if meta.is_file() => files.push((n, e.path(), meta.len())),
            _ => {
                return Err(Error::Archive {
                    path: e.path(),
                    source: ArchiveError::NotRegularFile,
                });
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The error of a copy from the export's file `path` that did not read what it was sized at.
pub(crate) fn changed_while_pushed(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        what: format!("read {} (changed while pushed?)", path.display()),
        source,
    }
}

/// What a push did.
#[derive(Clone, Debug)]
pub struct PushReport {
    /// The reference pushed, pinned to the manifest's digest.
    pub reference: Reference,
    /// The manifest's digest.
    pub digest: Digest,
    /// Blobs uploaded (the config included).
    pub uploaded: Vec<Digest>,
    /// Blobs the registry had already.
    pub skipped: Vec<Digest>,
    /// Blob bytes uploaded.
    pub uploaded_bytes: u64,
    /// Blob bytes the registry had already (not sent again).
    pub skipped_bytes: u64,
}

/// Pushes `parts` as `reference` (a tag, or a digest that must be the manifest's): each blob
/// the repository lacks is uploaded (`HEAD` first), then the manifest.
pub async fn push_archive_parts(
    client: &Client,
    reference: &Reference,
    parts: &ArchiveParts,
) -> Result<PushReport, Error> {
    let blobs: Vec<(&Digest, u64, &Path)> = parts
        .parts
        .iter()
        .map(|p| (&p.digest, p.size, p.path.as_path()))
        .collect();
    push_manifest_with_blobs(
        client,
        reference,
        &blobs,
        &parts.config_descriptor(),
        &parts.config_bytes,
        &parts.manifest(),
    )
    .await
}

/// Pushes `manifest` as `reference` (a tag, or a digest that must be the manifest's): first each
/// of `blobs` (digest, size, file) and the config (`config`, its bytes `config_bytes`) that the
/// repository lacks (`HEAD` first; a digest listed twice goes once), then the manifest.
pub(crate) async fn push_manifest_with_blobs(
    client: &Client,
    reference: &Reference,
    blobs: &[(&Digest, u64, &Path)],
    config: &Descriptor,
    config_bytes: &[u8],
    manifest: &Manifest,
) -> Result<PushReport, Error> {
    if client.registry() != reference.registry {
        return Err(Error::Refused {
            registry: reference.registry.clone(),
            why: format!("the client is {}'s", client.registry()),
        });
    }
    let repo = &reference.repository;
    let mut report = PushReport {
        reference: reference.clone(),
        digest: Digest::of(b""),
        uploaded: Vec::new(),
        skipped: Vec::new(),
        uploaded_bytes: 0,
        skipped_bytes: 0,
    };
    let mut seen = BTreeSet::new();
    for &(digest, size, path) in blobs {
        if !seen.insert(digest.clone()) {
            continue;
        }
        if client
            .head_blob(repo, digest, Access::Push)
            .await?
            .is_some()
        {
            report.skipped.push(digest.clone());
            report.skipped_bytes += size;
            continue;
        }
        client.push_blob_file(repo, digest, size, path).await?;
        report.uploaded.push(digest.clone());
        report.uploaded_bytes += size;
    }
    if client
        .head_blob(repo, &config.digest, Access::Push)
        .await?
        .is_some()
    {
        report.skipped.push(config.digest.clone());
        report.skipped_bytes += config.size;
    } else {
        client
            .push_blob_bytes(repo, &config.digest, config_bytes.to_vec().into())
            .await?;
        report.uploaded.push(config.digest.clone());
        report.uploaded_bytes += config.size;
    }
    let manifest = manifest.to_bytes();
    let digest = Digest::of(&manifest);
    if let Some(pinned) = &reference.digest
        && *pinned != digest
    {
        return Err(Error::BadManifest {
            reference: reference.to_string(),
            why: format!("the pushed manifest is {digest}, not the digest named"),
        });
    }
    let at = reference.tag.clone().unwrap_or_else(|| digest.to_string());
    client
        .push_manifest(repo, &at, OCI_MANIFEST, manifest)
        .await?;
    report.reference = reference.with_digest(digest.clone());
    report.digest = digest;
    Ok(report)
}

/// Splits the export in `export` ([`archive_parts`], in a work dir under `work` removed after)
/// and pushes it as `reference`.
pub async fn push_export(
    client: &Client,
    reference: &Reference,
    export: &Path,
    work: &Path,
) -> Result<PushReport, Error> {
    let pushed = match archive_parts(export, work) {
        Ok(p) => push_archive_parts(client, reference, &p).await,
        Err(e) => Err(e),
    };
    let _ = std::fs::remove_dir_all(work);
    pushed
}

/// Bounds on a pull, checked before the content they bound is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullLimits {
    /// The most bytes of the manifest.
    pub max_manifest_bytes: u64,
    /// The most bytes of the config blob.
    pub max_config_bytes: u64,
    /// The most layers.
    pub max_layers: usize,
    /// The most bytes of all the blobs together (the import bounds the archive again).
    pub max_bytes: u64,
}

impl Default for PullLimits {
    fn default() -> Self {
        Self {
            max_manifest_bytes: 4 << 20,
            max_config_bytes: 16 << 20,
            max_layers: 10_000,
            max_bytes: 256 << 30,
        }
    }
}

/// A checkpoint pulled into an export directory.
#[derive(Clone, Debug)]
pub struct PulledCheckpoint {
    /// The reference, pinned to the manifest's digest.
    pub reference: Reference,
    /// The config.
    pub config: CheckpointConfig,
    /// The export directory: the newest checkpoint's images and [`CHAIN_ARCHIVE`].
    pub dir: PathBuf,
}

/// What a well-formed artifact's manifest lists: per member, its layer then its images (the
/// newest member's required).
fn check_layout(m: &Manifest, config: &CheckpointConfig) -> Result<Vec<(u64, Part)>, LayoutError> {
    if config.format != CONFIG_FORMAT {
        return Err(LayoutError::Format {
            format: config.format,
        });
    }
    if !is_component(&config.namespace) || !is_component(&config.container) {
        return Err(LayoutError::NoOwner);
    }
    let unique: BTreeSet<u64> = config.members.iter().copied().collect();
    if unique.len() != config.members.len() || unique.last() != Some(&config.newest) {
        return Err(LayoutError::Members);
    }
    let mut out = Vec::new();
    let mut layers = m.layers.iter().peekable();
    let tagged = |d: &Descriptor, seq: u64, part: Part| {
        d.media_type == part.media_type()
            && d.annotations.get(ANNOTATION_SEQ) == Some(&seq.to_string())
            && d.annotations.get(ANNOTATION_PART).map(String::as_str) == Some(part.name())
    };
    for &seq in &config.members {
        match layers.next() {
            Some(d) if tagged(d, seq, Part::Layer) => out.push((seq, Part::Layer)),
            _ => return Err(LayoutError::Misplaced { seq }),
        }
        if layers.peek().is_some_and(|d| tagged(d, seq, Part::Criu)) {
            layers.next();
            out.push((seq, Part::Criu));
        } else if seq == config.newest {
            return Err(LayoutError::NoNewestImages { seq });
        }
    }
    if layers.next().is_some() {
        return Err(LayoutError::Extra);
    }
    Ok(out)
}

/// Pulls `reference` into `dest` (which must not exist; removed again on an error) as the
/// export the import takes ([`CHAIN_ARCHIVE`] and the newest checkpoint's images beside it).
/// Every blob is bounded by its descriptor's size and checked against its digest, every member
/// confined to its checkpoint's dir; the import checks the archive again, whole.
pub async fn pull_to_archive(
    client: &Client,
    reference: &Reference,
    dest: &Path,
    limits: &PullLimits,
) -> Result<PulledCheckpoint, Error> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dest)
        .map_err(io(format!("create {}", dest.display())))?;
    let pulled = pull_into(client, reference, dest, limits).await;
    if pulled.is_err() {
        let _ = std::fs::remove_dir_all(dest);
    }
    pulled
}

async fn pull_into(
    client: &Client,
    reference: &Reference,
    dest: &Path,
    limits: &PullLimits,
) -> Result<PulledCheckpoint, Error> {
    if client.registry() != reference.registry {
        return Err(Error::Refused {
            registry: reference.registry.clone(),
            why: format!("the client is {}'s", client.registry()),
        });
    }
    let repo = &reference.repository;
    let (bytes, digest) = client
        .pull_manifest(
            repo,
            &reference.manifest_reference(),
            OCI_MANIFEST,
            limits.max_manifest_bytes,
        )
        .await?;
    let bad = |why: String| Error::BadManifest {
        reference: reference.to_string(),
        why,
    };
    let m: Manifest = serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("not an OCI image manifest: {e}")))?;
    if m.schema_version != 2 || m.media_type != OCI_MANIFEST {
        return Err(bad(format!(
            "schemaVersion {} mediaType {:?}: not an OCI image manifest",
            m.schema_version, m.media_type
        )));
    }
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) || m.config.media_type != CONFIG_TYPE {
        return Err(bad(format!(
            "not a Belayer checkpoint: artifactType {:?}, config {:?}",
            m.artifact_type, m.config.media_type
        )));
    }
    if m.config.size > limits.max_config_bytes {
        return Err(Error::OverLimit {
            what: format!("{reference}'s config, {} bytes,", m.config.size),
            limit: limits.max_config_bytes,
            setting: "max_config_bytes",
        });
    }
    if m.layers.len() > limits.max_layers {
        return Err(Error::OverLimit {
            what: format!("{reference}'s layer count, {},", m.layers.len()),
            limit: limits.max_layers as u64,
            setting: "max_layers",
        });
    }
    let total = m
        .layers
        .iter()
        .try_fold(m.config.size, |n, d| n.checked_add(d.size))
        .unwrap_or(u64::MAX);
    if total > limits.max_bytes {
        return Err(Error::OverLimit {
            what: format!("{reference}'s blobs, {total} bytes,"),
            limit: limits.max_bytes,
            setting: "max_bytes",
        });
    }
    let config_bytes = client.pull_blob_bytes(repo, &m.config).await?;
    let config: CheckpointConfig = serde_json::from_slice(&config_bytes)
        .map_err(|e| bad(format!("its config is not a Belayer checkpoint's: {e}")))?;
    let layout = check_layout(&m, &config).map_err(|source| Error::Layout {
        reference: reference.to_string(),
        source,
    })?;

    let chain_path = dest.join(CHAIN_ARCHIVE);
    let chain = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&chain_path)
        .map_err(io(format!("create {}", chain_path.display())))?;
    let mut at = 0u64;
    for (d, (seq, part)) in m.layers.iter().zip(layout) {
        let prefix = format!(
            "checkpoints/{}/{}/{seq}",
            config.namespace, config.container
        );
        let blob_err = |source: ArchiveError| Error::Archive {
            path: PathBuf::from(format!("{reference} blob {}", d.digest)),
            source,
        };
        if seq == config.newest && part == Part::Criu {
            let tmp = dest.join(format!("{PULL_TMP}{}", d.digest.hex()));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(io(format!("create {}", tmp.display())))?;
            let mut w = tokio::io::BufWriter::new(tokio::fs::File::from_std(
                file.try_clone().map_err(io("dup"))?,
            ));
            client.pull_blob(repo, d, &mut w).await?;
            drop(w);
            let mut file = file;
            let written = write_flat_images(&mut file, &prefix, dest).map_err(&blob_err);
            let _ = std::fs::remove_file(&tmp);
            written?;
            continue;
        }
        let mut w = tokio::fs::File::from_std(chain.try_clone().map_err(io("dup"))?);
        w.seek(SeekFrom::Start(at))
            .await
            .map_err(io(format!("seek {}", chain_path.display())))?;
        let mut w = tokio::io::BufWriter::new(w);
        client.pull_blob(repo, d, &mut w).await?;
        drop(w);
        let mut file = chain.try_clone().map_err(io("dup"))?;
        let end = fragment_end(&mut file, at, d.size, &prefix).map_err(&blob_err)?;
        file.set_len(end)
            .map_err(io(format!("truncate {}", chain_path.display())))?;
        at = end;
    }
    let mut file = chain;
    file.seek(SeekFrom::Start(at))
        .and_then(|_| tar::write_end(&mut file))
        .and_then(|()| file.sync_all())
        .map_err(io(format!("write {}", chain_path.display())))?;
    Ok(PulledCheckpoint {
        reference: reference.with_digest(digest),
        config,
        dir: dest.to_path_buf(),
    })
}

/// Where the members of the blob of `size` bytes at `at` in `file` end: each lies in `prefix`
/// (its checkpoint dir), and nothing but zeros follows the end-of-archive block.
fn fragment_end(file: &mut File, at: u64, size: u64, prefix: &str) -> Result<u64, ArchiveError> {
    let end = {
        let mut w = Walker::new(file, at);
        while let Some(e) = w.next_entry()? {
            if e.end > at + size {
                return Err(ArchiveError::PastBlobEnd { member: e.path });
            }
            let inside = e.path == prefix
                || e.path
                    .strip_prefix(&format!("{prefix}/"))
                    .is_some_and(|rest| rest.split('/').all(is_component));
            if !inside {
                return Err(ArchiveError::Outside {
                    member: e.path,
                    prefix: prefix.to_string(),
                });
            }
        }
        w.end.unwrap_or(at + size)
    };
    if end + tar::BLOCK > at + size {
        return Err(ArchiveError::NoEnd);
    }
    file.seek(SeekFrom::Start(end))
        .map_err(|source| ArchiveError::Trailer {
            step: "seek",
            source,
        })?;
    let mut rest = file.take(at + size - end);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = rest
            .read(&mut buf)
            .map_err(|source| ArchiveError::Trailer {
                step: "read",
                source,
            })?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|b| *b != 0) {
            return Err(ArchiveError::DataAfterEnd);
        }
    }
    Ok(end)
}

/// Writes the images in the blob `file` flat into `dest`: the blob must hold a dir directly in
/// `prefix` and then only plain files directly in that dir.
fn write_flat_images(file: &mut File, prefix: &str, dest: &Path) -> Result<(), ArchiveError> {
    let len = file.metadata().map_err(ArchiveError::Stat)?.len();
    fragment_end(file, 0, len, prefix)?;
    let mut entries = Vec::new();
    let mut w = Walker::new(file, 0);
    while let Some(e) = w.next_entry()? {
        entries.push(e);
    }
    let (dir, files) = entries.split_first().ok_or(ArchiveError::NoImageDir)?;
    let criu_dir = dir
        .path
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('/'))
        .filter(|r| is_component(r) && dir.is_dir())
        .ok_or_else(|| ArchiveError::FirstNotDir {
            member: dir.path.clone(),
            prefix: prefix.to_string(),
        })?;
    let mut names = BTreeSet::new();
    for e in files {
        let name = e
            .path
            .strip_prefix(&format!("{prefix}/{criu_dir}/"))
            .filter(|n| is_component(n) && *n != CHAIN_ARCHIVE && !n.starts_with(PULL_TMP))
            .ok_or_else(|| ArchiveError::NotImage {
                member: e.path.clone(),
                dir: format!("{prefix}/{criu_dir}"),
            })?;
        if !e.is_file() || e.sparse {
            return Err(ArchiveError::NotPlainFile {
                member: e.path.clone(),
            });
        }
        if !names.insert(name.to_string()) {
            return Err(ArchiveError::Twice {
                member: e.path.clone(),
            });
        }
        let to = dest.join(name);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&to)
            .map_err(|source| ArchiveError::CreateImage {
                path: to.clone(),
                source,
            })?;
        tar::copy_range(file, e.data_at, e.size, &mut out)
            .map_err(|source| ArchiveError::WriteImage { path: to, source })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
