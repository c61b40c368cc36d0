//! `sha256:<hex>` content digests.

use std::fmt;
use std::io::Read;
use std::path::Path;

use sha2::{Digest as _, Sha256};

/// Why a digest does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// Not a `sha256:` digest.
    #[error("{digest:?}: only sha256 digests are accepted")]
    Algorithm {
        /// As written.
        digest: String,
    },
    /// `sha256:` but not followed by 64 lower-case hex digits.
    #[error("{digest:?}: a sha256 digest is 64 lower-case hex digits")]
    Hex {
        /// As written.
        digest: String,
    },
}

/// A `sha256:` digest (the only algorithm Belayer writes or accepts).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`.
    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let Some(hex) = s.strip_prefix("sha256:") else {
            return Err(DigestError::Algorithm { digest: s.into() });
        };
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Hex { digest: s.into() });
        }
        Ok(Self(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a finished hasher holds.
    pub fn from_hasher(h: Sha256) -> Self {
        Self(format!("sha256:{:x}", h.finalize()))
    }

    /// The digest and size of the file at `path`.
    pub fn of_file(path: &Path) -> std::io::Result<(Self, u64)> {
        let mut f = std::fs::File::open(path)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let got = f.read(&mut buf)?;
            if got == 0 {
                break;
            }
            h.update(&buf[..got]);
            n += got as u64;
        }
        Ok((Self::from_hasher(h), n))
    }

    /// The hex part.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_hex_and_checked() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        assert!(matches!(
            Digest::parse("sha512:00"),
            Err(DigestError::Algorithm { .. })
        ));
        let upper = d.as_str().to_uppercase().replace("SHA256", "sha256");
        assert!(matches!(
            Digest::parse(&upper),
            Err(DigestError::Hex { .. })
        ));
        assert!(
            Digest::parse("sha256:abc")
                .unwrap_err()
                .to_string()
                .contains("64 lower-case hex")
        );
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), b"abc").unwrap();
        assert_eq!(
            Digest::of_file(tmp.path()).unwrap(),
            (Digest::of(b"abc"), 3)
        );
    }
}
