//! `sha256:<hex>` content digests.

use std::fmt;
use std::io::Read;
use std::path::Path;

use sha2::{Digest as _, Sha256};

/// A `sha256:` digest (the only algorithm Belayer writes or accepts).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lower-case hex>`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| format!("{s:?}: only sha256 digests are accepted"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "{s:?}: a sha256 digest is 64 lower-case hex digits"
            ));
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
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse(&d.as_str().to_uppercase().replace("SHA256", "sha256")).is_err());
        assert!(Digest::parse("sha256:abc").is_err());
        let tmp = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(tmp.path(), b"abc").unwrap();
        assert_eq!(
            Digest::of_file(tmp.path()).unwrap(),
            (Digest::of(b"abc"), 3)
        );
    }
}
