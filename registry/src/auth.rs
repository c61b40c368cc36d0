//! Credentials, read as docker and containerd's clients read them, and `WWW-Authenticate`
//! challenges (Basic, and Bearer's token flow).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::error::Error;

/// A user name and password (or token) for a registry.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub username: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"…")
            .finish()
    }
}

impl Credentials {
    /// `Basic <base64(user:password)>`.
    pub fn basic_header(&self) -> String {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", self.username, self.password))
        )
    }
}

/// Where docker's clients read their config: `$DOCKER_CONFIG/config.json`, else
/// `$HOME/.docker/config.json`.
pub fn docker_config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|d| !d.is_empty())
        .map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// The credentials for `registry` (`host[:port]`) in the docker config at the usual place
/// ([`docker_config_path`]); `None` when there is no config or no entry. Credential helpers
/// (`credsStore`, `credHelpers`) are not run.
pub fn credentials_for(registry: &str) -> Result<Option<Credentials>, Error> {
    match docker_config_path() {
        Some(p) if p.exists() => credentials_in(&p, registry),
        _ => Ok(None),
    }
}

/// The credentials for `registry` in the docker config file `path`: its `auths` entry whose key
/// is the registry (`host:port`, or a URL of it: `https://host:port/v1/`), with `auth` (base64
/// of `user:password`) or `username` and `password`.
pub fn credentials_in(path: &Path, registry: &str) -> Result<Option<Credentials>, Error> {
    let bad = |why: String| Error::Credentials {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    #[derive(serde::Deserialize)]
    struct Config {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    let config: Config =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a docker config: {e}")))?;
    let Some((key, entry)) = config
        .auths
        .iter()
        .find(|(k, _)| auth_key_host(k) == registry)
    else {
        return Ok(None);
    };
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|e| bad(format!("auths.{key}.auth is not base64: {e}")))?;
        let decoded = String::from_utf8(decoded)
            .map_err(|_| bad(format!("auths.{key}.auth is not UTF-8")))?;
        let (u, p) = decoded
            .split_once(':')
            .ok_or_else(|| bad(format!("auths.{key}.auth is not base64 of user:password")))?;
        return Ok(Some(Credentials {
            username: u.into(),
            password: p.into(),
        }));
    }
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) => Ok(Some(Credentials {
            username: u.clone(),
            password: p.clone(),
        })),
        _ => Err(bad(format!(
            "auths.{key} has neither auth nor username and password (credential helpers and \
             identity tokens are not supported)"
        ))),
    }
}

/// The `host[:port]` of an `auths` key: `host:port`, `http(s)://host:port/…`.
fn auth_key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or_default()
}

/// A `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm="…"`.
    Basic,
    /// `Bearer realm="…",service="…",scope="…"`: a token is to be fetched from `realm`.
    Bearer {
        /// The token endpoint.
        realm: String,
        /// The service, if named.
        service: Option<String>,
        /// The scope, if named.
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` header value: its scheme and its `key=value` parameters (values
/// quoted, with `\` escapes, or bare tokens). `None` for a scheme other than Basic or Bearer, or
/// a Bearer challenge without a realm.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, rest) = match header.find(char::is_whitespace) {
        Some(i) => (&header[..i], &header[i..]),
        None => (header, ""),
    };
    let params = parse_params(rest)?;
    match scheme.to_ascii_lowercase().as_str() {
        "basic" => Some(Challenge::Basic),
        "bearer" => Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        }),
        _ => None,
    }
}

fn parse_params(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        while i < b.len() && (b[i] == b',' || b[i].is_ascii_whitespace()) {
            i += 1;
        }
        if i == b.len() {
            return Some(out);
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && b[i] != b',' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = s[start..i].to_ascii_lowercase();
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == b.len() || b[i] != b'=' {
            return None;
        }
        i += 1;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = String::new();
        if i < b.len() && b[i] == b'"' {
            i += 1;
            let mut closed = false;
            let mut chars = s[i..].char_indices();
            while let Some((j, c)) = chars.next() {
                match c {
                    '\\' => {
                        if let Some((_, n)) = chars.next() {
                            value.push(n);
                        }
                    }
                    '"' => {
                        i += j + 1;
                        closed = true;
                        break;
                    }
                    c => value.push(c),
                }
            }
            if !closed {
                return None;
            }
        } else {
            let start = i;
            while i < b.len() && b[i] != b',' && !b[i].is_ascii_whitespace() {
                i += 1;
            }
            value.push_str(&s[start..i]);
        }
        out.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_and_basic_challenges_parse() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:samalba/my-app:pull,push""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:samalba/my-app:pull,push".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"bearer realm=http://127.0.0.1:1/t, error="insufficient_scope""#),
            Some(Challenge::Bearer {
                realm: "http://127.0.0.1:1/t".into(),
                service: None,
                scope: None,
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="basic-realm""#),
            Some(Challenge::Basic)
        );
        assert_eq!(
            parse_challenge(r#"Bearer realm="a\"b",scope="x""#),
            Some(Challenge::Bearer {
                realm: "a\"b".into(),
                service: None,
                scope: Some("x".into()),
            })
        );
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
        assert_eq!(parse_challenge(r#"Bearer realm="unclosed"#), None);
        assert_eq!(parse_challenge("Negotiate abc"), None);
    }

    #[test]
    fn credentials_are_read_as_docker_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"auths": {
                "127.0.0.1:5000": {"auth": "YWxpY2U6czNjcjN0OndpdGg6Y29sb25z"},
                "https://reg.example.com/v1/": {"username": "bob", "password": "pw"},
                "broken.example.com": {"auth": "!!!"},
                "helper.example.com": {}
            }, "credsStore": "desktop"}"#,
        )
        .unwrap();
        let c = credentials_in(&path, "127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "s3cr3t:with:colons")
        );
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let c = credentials_in(&path, "reg.example.com").unwrap().unwrap();
        assert_eq!(c.username, "bob");
        assert_eq!(credentials_in(&path, "other:1").unwrap(), None);
        let e = credentials_in(&path, "broken.example.com")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not base64"), "{e}");
        let e = credentials_in(&path, "helper.example.com")
            .unwrap_err()
            .to_string();
        assert!(e.contains("credential helpers"), "{e}");
        assert_eq!(
            c.basic_header(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("bob:pw")
            )
        );
    }
}
