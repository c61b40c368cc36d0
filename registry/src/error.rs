//! Errors, each naming the step that failed.

use std::path::PathBuf;

use crate::digest::Digest;

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
    #[error("{path}: {why}")]
    Archive {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
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

/// Maps an io error to [`Error::Io`] naming `what`.
pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}
