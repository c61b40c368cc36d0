//! References to content in a registry: `host[:port]/repository[:tag][@sha256:<hex>]`.

use std::fmt;

use crate::digest::Digest;
use crate::error::Error;

/// A parsed reference. The registry host is required: Belayer never guesses one (no implied
/// `docker.io`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`, as written (IPv6 hosts in brackets).
    pub registry: String,
    /// The repository name (`team/sandbox`), lower case per the distribution spec.
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// The digest, if pinned; it wins over the tag.
    pub digest: Option<Digest>,
}

impl Reference {
    /// Parses `host[:port]/repo[:tag][@sha256:…]`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::Reference {
            reference: s.to_string(),
            why: why.to_string(),
        };
        if s.contains("://") {
            return Err(bad(
                "write it without a scheme: host[:port]/repository[:tag|@sha256:…]",
            ));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let digest = Digest::parse(d).map_err(|source| Error::ReferenceDigest {
                    reference: s.to_string(),
                    source,
                })?;
                (r, Some(digest))
            }
            None => (s, None),
        };
        let (registry, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no registry host: write host[:port]/repository"))?;
        if !valid_host(registry) {
            return Err(bad(&format!(
                "{registry:?} is no registry host[:port]: Belayer needs the host named"
            )));
        }
        // A tag is after the last ':' of the last path component.
        let last = path.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match path[last..].rfind(':') {
            Some(i) => (&path[..last + i], Some(&path[last + i + 1..])),
            None => (path, None),
        };
        if !valid_repository(repository) {
            return Err(bad(&format!(
                "{repository:?} is no repository name (lower-case letters, digits, separators \
                 . _ __ -, components joined by /)"
            )));
        }
        if let Some(tag) = tag
            && !valid_tag(tag)
        {
            return Err(bad(&format!(
                "{tag:?} is no tag ([A-Za-z0-9_][A-Za-z0-9._-]{{0,127}})"
            )));
        }
        if tag.is_none() && digest.is_none() {
            return Err(bad("name a tag (:tag) or a digest (@sha256:…)"));
        }
        Ok(Self {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// What the manifest endpoint is addressed by: the digest if pinned, else the tag.
    pub fn manifest_reference(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// The registry's host without the port (for loopback checks and credentials).
    pub fn host(&self) -> &str {
        host_of(&self.registry)
    }

    /// This reference pinned to `digest` (the tag kept for display).
    pub fn with_digest(&self, digest: Digest) -> Self {
        Self {
            digest: Some(digest),
            ..self.clone()
        }
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// The host of `host[:port]` (brackets of an IPv6 literal removed).
pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    registry.split(':').next().unwrap_or_default()
}

fn valid_host(s: &str) -> bool {
    if s.is_empty() {
        return false;
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((h, after)) = rest.split_once(']') else {
            return false;
        };
        if h.is_empty()
            || !h
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return false;
        }
        match after.strip_prefix(':') {
            Some(p) => (h, Some(p)),
            None if after.is_empty() => (h, None),
            None => return false,
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err())
    {
        return false;
    }
    if s.starts_with('[') {
        return true;
    }
    // A registry host is a DNS name or address: a dot, a port or `localhost` sets it apart from
    // a repository's first component.
    let dns = host
        .split('.')
        .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
    dns && (host.contains('.') || port.is_some() || host == "localhost")
}

/// The distribution spec's repository name grammar.
fn valid_repository(s: &str) -> bool {
    if s.is_empty() || s.len() > 255 {
        return false;
    }
    s.split('/').all(|component| {
        let b = component.as_bytes();
        if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
            return false;
        }
        let mut i = 0;
        while i < b.len() {
            if alnum(b[i]) {
                i += 1;
                continue;
            }
            // A separator: `.`, `_`, `__` or a run of `-`, between alphanumerics.
            let start = i;
            while i < b.len() && !alnum(b[i]) {
                i += 1;
            }
            let sep = &component[start..i];
            if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-')) {
                return false;
            }
        }
        true
    })
}

fn alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

pub(crate) fn valid_tag(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || c == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn references_parse_host_repository_tag_and_digest() {
        let r = Reference::parse("127.0.0.1:5000/team/sandbox:cp-3").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.host(), "127.0.0.1");
        assert_eq!(r.repository, "team/sandbox");
        assert_eq!(r.tag.as_deref(), Some("cp-3"));
        assert_eq!(r.manifest_reference(), "cp-3");
        assert_eq!(r.to_string(), "127.0.0.1:5000/team/sandbox:cp-3");

        let r = Reference::parse(&format!("registry.example.com/a/b-c.d__e@sha256:{HEX}")).unwrap();
        assert_eq!(r.registry, "registry.example.com");
        assert_eq!(r.repository, "a/b-c.d__e");
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_reference(), format!("sha256:{HEX}"));

        let r = Reference::parse(&format!("localhost/x:t@sha256:{HEX}")).unwrap();
        assert_eq!(r.tag.as_deref(), Some("t"));
        assert_eq!(r.manifest_reference(), format!("sha256:{HEX}"));

        let r = Reference::parse("[::1]:5000/x:t").unwrap();
        assert_eq!(r.host(), "::1");
    }

    #[test]
    fn bad_references_are_refused_with_the_reason() {
        for (s, why) in [
            ("sandbox:latest", "no registry host"),
            ("ubuntu/sandbox:latest", "no registry host"),
            ("http://127.0.0.1:5000/x:t", "without a scheme"),
            ("127.0.0.1:5000/Upper:t", "no repository name"),
            ("127.0.0.1:5000/a//b:t", "no repository name"),
            ("127.0.0.1:5000/a-:t", "no repository name"),
            ("127.0.0.1:5000/a:-t", "no tag"),
            ("127.0.0.1:5000/a", "name a tag"),
            ("127.0.0.1:99999/a:t", "no registry host"),
            ("127.0.0.1:5000/a@sha256:abc", "64"),
            ("127.0.0.1:5000/a@md5:abc", "sha256"),
        ] {
            let e = Reference::parse(s).expect_err(s).to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }
}
