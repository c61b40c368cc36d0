//! Errors, each naming the step that failed.

use std::path::PathBuf;

use crate::checkpoint::CONFIG_FORMAT;
use crate::digest::{Digest, DigestError};
use crate::tar;

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A reference that does not parse.
    #[error("reference {reference:?}: {why}")]
    Reference {
        /// As written.
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// A reference whose digest (after `@`) does not parse.
    #[error("reference {reference:?}: {source}")]
    ReferenceDigest {
        /// As written.
        reference: String,
        /// What is wrong with its digest.
        #[source]
        source: DigestError,
    },
    /// A registry this client will not talk to (https, for now; a non-loopback host in plain
    /// HTTP unless allowed).
    #[error("registry {registry}: {why}")]
    Refused {
        /// `host[:port]`.
        registry: String,
        /// Why.
        why: String,
    },
    /// The docker config holding credentials cannot be read.
    #[error("credentials from {path}: {why}")]
    Credentials {
        /// The config file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// No answer from the registry (connection, protocol or timeout).
    #[error("{step} {url}: {why}")]
    Transport {
        /// The step ("push blob sha256:…", "get manifest …").
        step: String,
        /// The URL.
        url: String,
        /// The cause.
        why: String,
    },
    /// The registry refused the credentials, or none were found for it.
    #[error("{step}: the registry {registry} refused access ({status}): {why}")]
    Unauthorized {
        /// The step.
        step: String,
        /// `host[:port]`.
        registry: String,
        /// 401 or 403.
        status: u16,
        /// Which credentials were tried.
        why: String,
    },
    /// The token endpoint of a Bearer challenge failed.
    #[error("token for {scope} from {realm}: {why}")]
    Token {
        /// The challenge's realm.
        realm: String,
        /// The scope asked for.
        scope: String,
        /// Why.
        why: String,
    },
    /// `HEAD` of a blob answered neither 200 nor 404.
    #[error("check blob {digest}: the registry answered {status}")]
    HeadBlob {
        /// The blob.
        digest: Digest,
        /// HTTP status.
        status: u16,
    },
    /// An upload step of a blob failed.
    #[error("push blob {digest} ({step}): the registry answered {status}: {body}")]
    PushBlob {
        /// The blob.
        digest: Digest,
        /// `start upload`, `upload chunk`, `finish upload`.
        step: &'static str,
        /// HTTP status.
        status: u16,
        /// The start of the registry's error body.
        body: String,
    },
    /// `GET` of a blob failed.
    #[error("pull blob {digest}: the registry answered {status}")]
    PullBlob {
        /// The blob.
        digest: Digest,
        /// HTTP status.
        status: u16,
    },
    /// A pulled blob's bytes do not hash to its descriptor's digest.
    #[error("pull blob {digest}: its content hashes to {actual}: refused")]
    BlobDigest {
        /// The descriptor's digest.
        digest: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
    /// A pulled blob is not of its descriptor's size.
    #[error("pull blob {digest}: {got} bytes where its descriptor says {expected}: refused")]
    BlobSize {
        /// The descriptor's digest.
        digest: Digest,
        /// The descriptor's size.
        expected: u64,
        /// Bytes the registry sent or announced (at least).
        got: u64,
    },
    /// `PUT` of a manifest failed.
    #[error("push manifest {reference}: the registry answered {status}: {body}")]
    PushManifest {
        /// The reference.
        reference: String,
        /// HTTP status.
        status: u16,
        /// The start of the registry's error body.
        body: String,
    },
    /// `GET` of a manifest failed.
    #[error("pull manifest {reference}: the registry answered {status}")]
    PullManifest {
        /// The reference.
        reference: String,
        /// HTTP status.
        status: u16,
    },
    /// A pulled manifest that is not a Belayer checkpoint, or not a well-formed one.
    #[error("manifest {reference}: {why}")]
    BadManifest {
        /// The reference.
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// A Belayer checkpoint's manifest whose layers are not as its config says.
    #[error("manifest {reference}: {source}")]
    Layout {
        /// The reference.
        reference: String,
        /// What is out of place.
        #[source]
        source: LayoutError,
    },
    /// A bound of a pull is passed.
    #[error("{what} is over {limit}, the pull bound ({setting})")]
    OverLimit {
        /// What passed it.
        what: String,
        /// The bound.
        limit: u64,
        /// The field of [`crate::PullLimits`].
        setting: &'static str,
    },
    /// An archive (an export, a pulled layer) that is not as Belayer writes it.
    #[error("{path}: {source}")]
    Archive {
        /// The file (for a pulled blob: `<reference> blob <digest>`).
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: ArchiveError,
    },
    /// A CRI checkpoint archive (what the kubelet's checkpoint API writes) that cannot be made
    /// into a checkpoint image.
    #[error("CRI checkpoint archive {path}: {source}")]
    CriArchive {
        /// The archive.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: CriArchiveError,
    },
    /// A checkpoint export and its dumps (`belayer push --kube`) that cannot be made into a
    /// checkpoint image.
    #[error("checkpoint export {path} as a Kubernetes checkpoint image: {source}")]
    KubeExport {
        /// The export.
        path: PathBuf,
        /// What is wrong with it or its dumps.
        #[source]
        source: CriArchiveError,
    },
    /// A local file operation.
    #[error("{what}")]
    Io {
        /// The operation and path.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Why an export, or a blob of a pulled checkpoint, is not as Belayer writes it.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// Its tar members cannot be walked.
    #[error(transparent)]
    Tar(#[from] tar::ReadError),
    /// A member outside any checkpoint dir.
    #[error("member {member:?} is not under checkpoints/<namespace>/<container>/<seq>/")]
    NotInCheckpoint {
        /// The member.
        member: String,
    },
    /// A member whose checkpoint dir is not named by a number.
    #[error("member {member:?}: {seq:?} is no checkpoint id")]
    NoCheckpointId {
        /// The member.
        member: String,
        /// Its checkpoint dir's name.
        seq: String,
    },
    /// Checkpoints of two containers in one export.
    #[error("it holds checkpoints of {first} and of {second}")]
    TwoContainers {
        /// `<namespace>/<container>` of the first member.
        first: String,
        /// That of a later member.
        second: String,
    },
    /// A checkpoint's members split by another's.
    #[error("the members of checkpoint {seq} are not together")]
    Scattered {
        /// The checkpoint.
        seq: u64,
    },
    /// No member at all.
    #[error("it holds no checkpoint")]
    NoCheckpoint,
    /// A checkpoint's `manifest.json` names a CRIU dir that is not one component.
    #[error("checkpoint {seq}'s criu_dir {criu_dir:?} is not a dir of its own")]
    CriuDir {
        /// The checkpoint.
        seq: u64,
        /// As its manifest names it.
        criu_dir: String,
    },
    /// The newest checkpoint's images inside the chain archive.
    #[error("it holds the CRIU images of checkpoint {seq}, the newest: they belong beside it")]
    NewestImagesInside {
        /// The newest checkpoint.
        seq: u64,
    },
    /// Something but a regular file beside the chain archive.
    #[error("not a regular file with a UTF-8 name: an export holds only those")]
    NotRegularFile,
    /// A checkpoint dir without its `manifest.json`.
    #[error("checkpoint dir {prefix} has no manifest.json")]
    NoManifest {
        /// The checkpoint dir.
        prefix: String,
    },
    /// A checkpoint's `manifest.json` past the bound read (or sparse).
    #[error("{name} is over {limit} bytes")]
    ManifestOverLimit {
        /// The member.
        name: String,
        /// The bound.
        limit: u64,
    },
    /// A checkpoint's `manifest.json` cannot be read.
    #[error("read {name}: {source}")]
    ReadManifest {
        /// The member.
        name: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint's `manifest.json` is not JSON.
    #[error("{name} is not JSON: {source}")]
    ManifestJson {
        /// The member.
        name: String,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A member of a pulled blob ends past the blob.
    #[error("member {member:?} runs past the blob's end")]
    PastBlobEnd {
        /// The member.
        member: String,
    },
    /// A member of a pulled blob outside its checkpoint's dir.
    #[error("member {member:?} lies outside {prefix}")]
    Outside {
        /// The member.
        member: String,
        /// The checkpoint's dir.
        prefix: String,
    },
    /// A pulled blob without its end-of-archive block.
    #[error("it has no end-of-archive block")]
    NoEnd,
    /// The bytes after a pulled blob's end-of-archive block cannot be read.
    #[error("{step} after its end-of-archive block: {source}")]
    Trailer {
        /// `seek` or `read`.
        step: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Something but zeros after a pulled blob's end-of-archive block.
    #[error("it holds data after its end-of-archive block")]
    DataAfterEnd,
    /// The pulled blob's file cannot be looked at.
    #[error("stat: {0}")]
    Stat(#[source] std::io::Error),
    /// A pulled images blob that is empty.
    #[error("it holds no CRIU image dir")]
    NoImageDir,
    /// A pulled images blob that does not start with its CRIU dir.
    #[error("its first member {member:?} is not a dir in {prefix}")]
    FirstNotDir {
        /// The member.
        member: String,
        /// The checkpoint's dir.
        prefix: String,
    },
    /// A member of a pulled images blob not directly in its CRIU dir, or of a reserved name.
    #[error("member {member:?} is not an image in {dir}")]
    NotImage {
        /// The member.
        member: String,
        /// The CRIU dir.
        dir: String,
    },
    /// A member of a pulled images blob that is not a contiguous regular file.
    #[error("member {member:?} is not a plain file")]
    NotPlainFile {
        /// The member.
        member: String,
    },
    /// An image twice in a pulled images blob.
    #[error("member {member:?} comes twice")]
    Twice {
        /// The member.
        member: String,
    },
    /// An image file of a pull cannot be created.
    #[error("create {path}: {source}")]
    CreateImage {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An image file of a pull cannot be written.
    #[error("write {path}: {source}")]
    WriteImage {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Why a CRI checkpoint archive cannot be made into a checkpoint image.
#[derive(Debug, thiserror::Error)]
pub enum CriArchiveError {
    /// A compressed archive: the kubelet writes an uncompressed tar.
    #[error("it is {format}-compressed; a CRI checkpoint archive is an uncompressed tar")]
    Compressed {
        /// The compression.
        format: &'static str,
    },
    /// Its tar members cannot be walked.
    #[error(transparent)]
    Tar(#[from] tar::ReadError),
    /// More members than the bound.
    #[error("it holds more than {limit} members")]
    TooManyMembers {
        /// The bound.
        limit: usize,
    },
    /// More data than the bound.
    #[error("its members hold more than {limit} bytes")]
    OverLimit {
        /// The bound.
        limit: u64,
    },
    /// A member that is neither a regular file nor a dir (a link, a device, a fifo).
    #[error(
        "member {member:?} is of tar type {kind:?}: a checkpoint archive holds only regular files and dirs"
    )]
    NotFileOrDir {
        /// The member.
        member: String,
        /// Its tar type flag.
        kind: char,
    },
    /// A sparse member (the CRI writes none).
    #[error("member {member:?} is a sparse file: a CRI checkpoint archive holds none")]
    Sparse {
        /// The member.
        member: String,
    },
    /// A member named outside the archive's root, or with an empty, `.` or `..` component.
    #[error("member {member:?} is not a plain relative path below the archive's root")]
    Path {
        /// The member.
        member: String,
    },
    /// A member named twice.
    #[error("member {member:?} comes twice")]
    Twice {
        /// The member.
        member: String,
    },
    /// A member below a regular file.
    #[error("member {member:?} lies below the file {file:?}")]
    UnderFile {
        /// The member.
        member: String,
        /// The file.
        file: String,
    },
    /// A file a restore needs that the archive lacks (or holds as a dir).
    #[error("it has no {file} (a restore reads it): not a CRI checkpoint archive")]
    Missing {
        /// The file.
        file: &'static str,
    },
    /// A dump file past the bound read.
    #[error("its {file} is over {limit} bytes")]
    DumpOverLimit {
        /// The file.
        file: &'static str,
        /// The bound.
        limit: u64,
    },
    /// A dump file that is not the JSON expected.
    #[error("its {file} does not parse: {source}")]
    DumpJson {
        /// The file.
        file: &'static str,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A dump file without a value a restore needs.
    #[error("its {file} names no {field}")]
    NoValue {
        /// The file.
        file: &'static str,
        /// What it lacks.
        field: &'static str,
    },
    /// An archive of an engine that is not Kubernetes'.
    #[error("it was made by {engine}, not by a Kubernetes (CRI) engine")]
    Engine {
        /// `io.container.manager` in its spec.dump.
        engine: String,
    },
}

/// Why a container's own OCI spec (the shim's, with no CRI to ask) makes no records of a
/// Kubernetes container ([`crate::kube::ContainerRecords::of_cri_spec`]).
#[derive(Debug, thiserror::Error)]
pub enum CriSpecError {
    /// A spec that is not JSON.
    #[error("its spec does not parse")]
    Json(#[source] serde_json::Error),
    /// No CRI container type: a container that containerd's CRI plugin did not make.
    #[error("its spec has no annotation {annotation}: not a Kubernetes (CRI) container")]
    NotCri {
        /// The annotation looked for.
        annotation: &'static str,
    },
    /// A CRI container of another kind than `container` (a pod's sandbox).
    #[error(
        "it is a pod's {kind} (annotation {annotation}), not a container a pod restores from an image"
    )]
    NotContainer {
        /// Its kind.
        kind: String,
        /// The annotation.
        annotation: &'static str,
    },
    /// A CRI container's spec without an annotation the image needs.
    #[error("its spec has no annotation {annotation} ({what})")]
    Missing {
        /// The annotation.
        annotation: &'static str,
        /// What it names.
        what: &'static str,
    },
}

/// Why a checkpoint's manifest does not list, per member of its config, its layer then its
/// images.
#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    /// A config of another format.
    #[error("config format {format} (this client reads {CONFIG_FORMAT})")]
    Format {
        /// The config's format.
        format: u32,
    },
    /// A config whose namespace or container is not one path component.
    #[error("the config names no namespace or container")]
    NoOwner,
    /// A config whose member list is not a chain ending in its newest.
    #[error("the config's members are repeated, or the newest is not the greatest")]
    Members,
    /// A member's layer missing or out of order.
    #[error("checkpoint {seq}'s layer is not where it belongs")]
    Misplaced {
        /// The member.
        seq: u64,
    },
    /// The newest member without its images.
    #[error("checkpoint {seq}, the newest, has no CRIU images")]
    NoNewestImages {
        /// The newest member.
        seq: u64,
    },
    /// Layers past the config's members.
    #[error("it lists layers of no member")]
    Extra,
}

/// Maps an io error to [`Error::Io`] naming `what`.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
