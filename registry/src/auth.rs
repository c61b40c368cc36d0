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
/// ([`docker_config_path`]); `None` when there is no config or no entry. A credential helper
/// the config names is run as docker runs it ([`credentials_in`]).
pub fn credentials_for(registry: &str) -> Result<Option<Credentials>, Error> {
    match docker_config_path() {
        Some(p) if p.exists() => credentials_in(&p, registry),
        _ => Ok(None),
    }
}

/// The credentials for `registry` in the docker config file `path`, looked up as docker's
/// clients do: a helper named for the registry in `credHelpers`, else the `credsStore` helper,
/// decides alone (`docker-credential-<name> get`, found on `$PATH`; [`helper_credentials`]);
/// without one, the `auths` entry whose key is the registry (`host:port`, or a URL of it:
/// `https://host:port/v1/`), with `auth` (base64 of `user:password`) or `username` and
/// `password`.
pub fn credentials_in(path: &Path, registry: &str) -> Result<Option<Credentials>, Error> {
    credentials_in_searching(path, registry, std::env::var_os("PATH").as_deref())
}

/// [`credentials_in`], looking for credential helpers in the directories of `search` (a
/// `$PATH`-style list) instead of `$PATH`.
pub fn credentials_in_searching(
    path: &Path,
    registry: &str,
    search: Option<&std::ffi::OsStr>,
) -> Result<Option<Credentials>, Error> {
    let bad = |why: String| Error::Credentials {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Config {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
        #[serde(default)]
        creds_store: String,
        #[serde(default)]
        cred_helpers: BTreeMap<String, String>,
    }
    #[derive(serde::Deserialize)]
    struct Entry {
        auth: Option<String>,
        username: Option<String>,
        password: Option<String>,
    }
    let config: Config =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a docker config: {e}")))?;
    let helper = config
        .cred_helpers
        .iter()
        .find(|(k, _)| auth_key_host(k) == registry)
        .map(|(k, h)| (format!("credHelpers.{k}"), h))
        .or_else(|| {
            Some(("credsStore".to_string(), &config.creds_store)).filter(|(_, h)| !h.is_empty())
        });
    if let Some((setting, helper)) = helper {
        return helper_credentials(helper, registry, search)
            .map_err(|why| bad(format!("{setting} {helper:?}: {why}")));
    }
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
            "auths.{key} has neither auth nor username and password (identity tokens are not \
             supported)"
        ))),
    }
}

/// How long a credential helper may take to answer.
const HELPER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// The most a credential helper may print.
const HELPER_MAX_OUTPUT: u64 = 64 << 10;

/// Runs docker's credential helper `docker-credential-<helper> get` (the first executable of
/// that name in `search`, a `$PATH`-style list), `registry` on its standard input, and reads
/// its answer, `{"ServerURL", "Username", "Secret"}`. A helper that exits non-zero saying the
/// credentials are not found means none (`Ok(None)`), as for docker; any other failure, a
/// helper name that is not a plain name, no such helper, more than 30 s or 64 KiB of answer,
/// or an identity token (user `<token>`, which needs an OAuth2 flow not implemented here) is
/// an error naming what happened.
pub fn helper_credentials(
    helper: &str,
    registry: &str,
    search: Option<&std::ffi::OsStr>,
) -> Result<Option<Credentials>, String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    if helper.is_empty()
        || !helper
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err("not a credential helper name (letters, digits, '.', '_', '-')".into());
    }
    let program = format!("docker-credential-{helper}");
    let exe = search
        .map(std::env::split_paths)
        .into_iter()
        .flatten()
        .filter(|d| d.is_absolute())
        .map(|d| d.join(&program))
        .find(|p| is_executable(p))
        .ok_or_else(|| format!("{program} is not an executable on PATH"))?;
    let mut child = Command::new(&exe)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} cannot run: {e}", exe.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        // A helper that exits without reading its input is judged by its exit and output.
        let _ = stdin.write_all(registry.as_bytes());
    }
    // Both pipes are drained as the helper writes (a full pipe would stall it).
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let start = std::time::Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < HELPER_TIMEOUT => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} gave no answer in {HELPER_TIMEOUT:?}",
                    exe.display()
                ));
            }
            Err(e) => return Err(format!("waiting for {}: {e}", exe.display())),
        }
    };
    // What the helper printed is read once it has exited; a process it left behind holding
    // the pipes open is given a second, not waited for.
    let rest = |rx: std::sync::mpsc::Receiver<Vec<u8>>| {
        rx.recv_timeout(std::time::Duration::from_secs(1))
            .unwrap_or_default()
    };
    let (out, err) = (rest(out), rest(err));
    if out.len() as u64 > HELPER_MAX_OUTPUT {
        return Err(format!(
            "{} printed over {HELPER_MAX_OUTPUT} bytes",
            exe.display()
        ));
    }
    let said = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    if !status.success() {
        let text = format!("{} {}", said(&out), said(&err));
        if text.contains("credentials not found") {
            return Ok(None);
        }
        return Err(format!(
            "{} get failed ({status}): {}",
            exe.display(),
            text.trim()
        ));
    }
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(rename = "Username")]
        username: String,
        #[serde(rename = "Secret")]
        secret: String,
    }
    let a: Answer = serde_json::from_slice(&out).map_err(|e| {
        format!(
            "{} get printed no {{Username, Secret}} answer: {e}",
            exe.display()
        )
    })?;
    if a.username == "<token>" {
        return Err(format!(
            "{} holds an identity token for {registry}: the OAuth2 token flow is not implemented",
            exe.display()
        ));
    }
    Ok(Some(Credentials {
        username: a.username,
        password: a.secret,
    }))
}

/// Reads `pipe` on a thread of its own, at most one byte over [`HELPER_MAX_OUTPUT`]; what it
/// read arrives on the receiver once the pipe ends.
fn drain<R: std::io::Read + Send + 'static>(pipe: Option<R>) -> std::sync::mpsc::Receiver<Vec<u8>> {
    use std::io::Read as _;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = pipe {
            let _ = p.take(HELPER_MAX_OUTPUT + 1).read_to_end(&mut buf);
        }
        let _ = tx.send(buf);
    });
    rx
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
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
            }}"#,
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
        assert!(e.contains("neither auth nor username"), "{e}");
        assert_eq!(
            c.basic_header(),
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode("bob:pw")
            )
        );
    }

    /// Real helper processes (shell scripts speaking docker's credential helper protocol), found
    /// in a directory given as the search path.
    #[test]
    fn credential_helpers_are_run_as_docker_runs_them() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let helper = |name: &str, body: &str| {
            let p = bin.join(format!("docker-credential-{name}"));
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        // The store answers for 127.0.0.1:5000 only, and checks it was asked `get`.
        helper(
            "store",
            r#"[ "$1" = get ] || exit 3
read -r server
case "$server" in
  127.0.0.1:5000) printf '{"ServerURL":"%s","Username":"carol","Secret":"fr0m-store"}' "$server" ;;
  *) echo "credentials not found in native keychain"; exit 1 ;;
esac"#,
        );
        helper(
            "one",
            r#"read -r server; printf '{"Username":"dave","Secret":"for-%s"}' "$server""#,
        );
        helper("broken", "echo 'keychain locked' >&2; exit 2");
        helper(
            "token",
            r#"printf '{"Username":"<token>","Secret":"refresh"}'"#,
        );
        helper("garbled", "echo not json");
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            r#"{"auths": {"127.0.0.1:5000": {"auth": "aWdub3JlZDppZ25vcmVk"},
                          "other.example.com": {"auth": "aWdub3JlZDppZ25vcmVk"}},
                "credsStore": "store",
                "credHelpers": {"one.example.com:7": "one", "https://broken.example.com": "broken",
                                "token.example.com": "token", "garbled.example.com": "garbled",
                                "missing.example.com": "absent", "bad.example.com": "../store"}}"#,
        )
        .unwrap();
        let search = Some(bin.as_os_str());
        let get = |registry: &str| credentials_in_searching(&path, registry, search);
        // The store decides alone: its answer, not the inline `auths` entry.
        let c = get("127.0.0.1:5000").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("carol", "fr0m-store")
        );
        assert_eq!(get("other.example.com").unwrap(), None);
        // credHelpers wins over credsStore for its registry.
        let c = get("one.example.com:7").unwrap().unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("dave", "for-one.example.com:7")
        );
        let err = |registry: &str| get(registry).unwrap_err().to_string();
        let e = err("broken.example.com");
        assert!(
            e.contains("keychain locked") && e.contains("credHelpers.https://broken"),
            "{e}"
        );
        assert!(err("token.example.com").contains("identity token"));
        assert!(err("garbled.example.com").contains("no {Username, Secret} answer"));
        let e = err("missing.example.com");
        assert!(
            e.contains("docker-credential-absent is not an executable on PATH"),
            "{e}"
        );
        assert!(err("bad.example.com").contains("not a credential helper name"));
    }
}
