//! Belayer checkpoints through a real registry: the CNCF distribution registry (Debian's
//! `docker-registry`) on loopback, with htpasswd authentication, credentials read from a docker
//! config. Pushes two checkpoints of one chain (the second uploads only its own blobs), pulls
//! the newest back into the export the import takes, and refuses a tampered blob and wrong
//! credentials.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use belayer_registry::auth::Credentials;
use belayer_registry::checkpoint::{
    self, CHAIN_ARCHIVE, CRIU_TYPE, LAYER_TYPE, PullLimits, archive_parts,
};
use belayer_registry::{Client, ClientOptions, Error, Reference};

mod common;
use common::{PASSWORD, Registry, USER, base64_of, export};

/// A store tree: checkpoint `seq` of `default/sandbox` with an fs layer and CRIU images.
fn plant(store: &Path, seq: u64, chain: &[u64]) {
    let dir = store.join(format!("checkpoints/default/sandbox/{seq}"));
    std::fs::create_dir_all(dir.join("fs/etc")).unwrap();
    std::fs::create_dir_all(dir.join("criu")).unwrap();
    std::fs::write(
        dir.join(format!("fs/etc/layer-{seq}")),
        format!("layer {seq}"),
    )
    .unwrap();
    std::os::unix::fs::symlink("layer", dir.join("fs/etc/link")).unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_vec(&serde_json::json!({
            "format_version": 1, "namespace": "default", "container": "sandbox", "seq": seq,
            "fs_chain": chain, "criu_dir": "criu", "fs_dir": "fs",
        }))
        .unwrap(),
    )
    .unwrap();
    // Memory pages large enough to go up in several chunks.
    let pages: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seq as u32) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("criu/pages-1.img"), pages).unwrap();
    std::fs::write(dir.join("criu/inventory.img"), format!("inventory {seq}")).unwrap();
    std::fs::write(dir.join("criu/core-1.img"), b"core").unwrap();
}

/// Every file, dir and symlink under `dir`: its kind, mode and content.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let meta = p.symlink_metadata().unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.file_type().is_symlink() {
                format!("link {}", std::fs::read_link(&p).unwrap().display())
            } else if meta.is_dir() {
                stack.push(p.clone());
                format!("dir {mode:o}")
            } else {
                let data = std::fs::read(&p).unwrap();
                format!(
                    "file {} {}",
                    data.len(),
                    belayer_registry::Digest::of(&data)
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

fn untar(archive: &Path, into: &Path) -> BTreeMap<String, String> {
    common::unpack(archive, into);
    tree(into)
}

#[test]
fn checkpoints_go_through_a_real_registry() {
    let registry = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let docker = tmp.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(
        docker.join("config.json"),
        serde_json::to_vec(&serde_json::json!({"auths": {
            registry.addr.clone(): {"auth": base64_of(&format!("{USER}:{PASSWORD}"))}
        }}))
        .unwrap(),
    )
    .unwrap();
    // SAFETY: set before this test starts a thread; it is the only test of this binary.
    unsafe { std::env::set_var("DOCKER_CONFIG", &docker) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(&registry, tmp.path()));
}

async fn run(registry: &Registry, tmp: &Path) {
    let store = tmp.join("store");
    plant(&store, 1, &[1]);
    let e1 = tmp.join("export-1");
    export(&store, "default/sandbox", 1, &[1], &e1);
    // Time passes and the store is read again: new access and change times on every member.
    std::thread::sleep(Duration::from_millis(20));
    let touched = Command::new("find")
        .arg(&store)
        .args(["-exec", "touch", "-a", "-h", "{}", "+"])
        .status()
        .unwrap();
    assert!(touched.success());
    plant(&store, 2, &[2, 1]);
    let e2 = tmp.join("export-2");
    export(&store, "default/sandbox", 2, &[2, 1], &e2);

    // Small chunks: the larger blobs go up in PATCHes.
    let client = Client::new(
        &registry.addr,
        ClientOptions {
            chunk_size: 64 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let r1 = Reference::parse(&format!("{}/belayer/sandbox:cp-1", registry.addr)).unwrap();
    let r2 = Reference::parse(&format!("{}/belayer/sandbox:cp-2", registry.addr)).unwrap();

    let p1 = archive_parts(&e1, &tmp.join("work-1")).unwrap();
    let pushed1 = checkpoint::push_archive_parts(&client, &r1, &p1)
        .await
        .unwrap();
    // Its layer, its images, its config.
    assert_eq!(pushed1.uploaded.len(), 3, "{pushed1:?}");
    assert!(pushed1.skipped.is_empty(), "{pushed1:?}");
    assert_eq!(registry.finished_uploads(), 3);

    let p2 = archive_parts(&e2, &tmp.join("work-2")).unwrap();
    let pushed2 = checkpoint::push_archive_parts(&client, &r2, &p2)
        .await
        .unwrap();
    // Checkpoint 1's layer and images are the same blobs in both exports, though GNU tar wrote
    // other access and change times: only checkpoint 2's layer, images and config go up.
    let of = |p: &checkpoint::ArchiveParts, seq: u64, media: &str| {
        p.manifest()
            .layers
            .iter()
            .find(|d| {
                d.media_type == media
                    && d.annotations.get(checkpoint::ANNOTATION_SEQ) == Some(&seq.to_string())
            })
            .unwrap()
            .digest
            .clone()
    };
    assert_eq!(of(&p1, 1, LAYER_TYPE), of(&p2, 1, LAYER_TYPE));
    assert_eq!(of(&p1, 1, CRIU_TYPE), of(&p2, 1, CRIU_TYPE));
    assert_eq!(
        pushed2.skipped,
        vec![of(&p2, 1, LAYER_TYPE), of(&p2, 1, CRIU_TYPE)],
        "{pushed2:?}"
    );
    assert_eq!(
        pushed2.uploaded,
        vec![
            of(&p2, 2, LAYER_TYPE),
            of(&p2, 2, CRIU_TYPE),
            p2.config_descriptor().digest
        ]
    );
    assert_eq!(
        registry.finished_uploads(),
        6,
        "the registry saw other uploads"
    );
    // Pushing the same checkpoint again uploads nothing.
    let again = checkpoint::push_archive_parts(&client, &r2, &p2)
        .await
        .unwrap();
    assert!(again.uploaded.is_empty(), "{again:?}");
    assert_eq!(again.digest, pushed2.digest);

    // Pulled by digest on "another node": the export the import takes, the same tree.
    let fresh = Client::new(&registry.addr, ClientOptions::default()).unwrap();
    let dest = tmp.join("pulled");
    let pinned = Reference::parse(&format!(
        "{}/belayer/sandbox@{}",
        registry.addr, pushed2.digest
    ))
    .unwrap();
    let pulled = checkpoint::pull_to_archive(&fresh, &pinned, &dest, &PullLimits::default())
        .await
        .unwrap();
    assert_eq!(pulled.config.newest, 2);
    assert_eq!(pulled.config.members, [2, 1]);
    assert_eq!(pulled.config.manifest["criu_dir"], "criu");
    let names = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&dest), names(&e2));
    for n in names(&e2) {
        if n != CHAIN_ARCHIVE {
            assert_eq!(
                std::fs::read(dest.join(&n)).unwrap(),
                std::fs::read(e2.join(&n)).unwrap(),
                "{n}"
            );
        }
    }
    let theirs = untar(&e2.join(CHAIN_ARCHIVE), &tmp.join("x-export"));
    let ours = untar(&dest.join(CHAIN_ARCHIVE), &tmp.join("x-pulled"));
    // The same members and contents; only the modes of checkpoint 1's CRIU files and dir are
    // canonical (root, 0600, 0700).
    let strip = |t: &BTreeMap<String, String>| {
        t.iter()
            .filter(|(k, _)| !k.ends_with("/1/criu"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(strip(&ours), strip(&theirs));
    assert!(ours.contains_key("checkpoints/default/sandbox/1/criu/pages-1.img"));
    // Pulled by tag too.
    let by_tag = tmp.join("pulled-by-tag");
    checkpoint::pull_to_archive(&fresh, &r1, &by_tag, &PullLimits::default())
        .await
        .unwrap();
    assert_eq!(names(&by_tag), names(&e1));

    // A blob changed in the registry's storage: the pull refuses it and leaves nothing.
    let victim = registry.blob_file(&of(&p2, 2, LAYER_TYPE));
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[700] ^= 0x20;
    std::fs::write(&victim, &bytes).unwrap();
    let dest = tmp.join("tampered");
    let e = checkpoint::pull_to_archive(&fresh, &pinned, &dest, &PullLimits::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::BlobDigest { .. }), "{e}");
    assert!(e.to_string().contains("hashes to"), "{e}");
    assert!(!dest.exists());

    // A manifest over the bound is not read.
    let e = checkpoint::pull_to_archive(
        &fresh,
        &r1,
        &tmp.join("small"),
        &PullLimits {
            max_manifest_bytes: 100,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("max_manifest_bytes"), "{e}");

    // Wrong credentials, and none: refused by name.
    let wrong = Client::new(
        &registry.addr,
        ClientOptions {
            credentials: Some(Credentials {
                username: USER.into(),
                password: "wrong".into(),
            }),
            ..Default::default()
        },
    )
    .unwrap();
    let e = checkpoint::pull_to_archive(&wrong, &r1, &tmp.join("w"), &PullLimits::default())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { status: 401, .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("refused access") && msg.contains(&registry.addr) && msg.contains(USER),
        "{msg}"
    );
    let e = checkpoint::push_archive_parts(&wrong, &r2, &p2)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Unauthorized { .. }), "{e}");
    let empty = tmp.join("empty-docker");
    std::fs::create_dir_all(&empty).unwrap();
    // SAFETY: no other thread reads the environment now (the runtime's workers are idle, and
    // nothing of this crate reads it but Client::new, here).
    unsafe { std::env::set_var("DOCKER_CONFIG", &empty) };
    let anonymous = Client::new(&registry.addr, ClientOptions::default()).unwrap();
    let e = checkpoint::pull_to_archive(&anonymous, &r1, &tmp.join("a"), &PullLimits::default())
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no credentials"), "{e}");

    paced(registry, tmp).await;
    bearer(tmp, &p1).await;
}

/// A bounded upload rate (`max_bytes_per_s`): a 2 MiB blob at 4 MiB/s goes up in pieces of a
/// quarter second's worth, and not sooner than its bytes are due; the registry has it whole.
async fn paced(registry: &Registry, tmp: &Path) {
    let blob: Vec<u8> = (0..2u32 << 20)
        .map(|i| (i.wrapping_mul(31) >> 7) as u8)
        .collect();
    let path = tmp.join("paced.bin");
    std::fs::write(&path, &blob).unwrap();
    let digest = belayer_registry::Digest::of(&blob);
    let client = Client::new(
        &registry.addr,
        ClientOptions {
            credentials: Some(common::credentials()),
            max_bytes_per_s: 4 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    let started = std::time::Instant::now();
    client
        .push_blob_file("belayer/paced", &digest, blob.len() as u64, &path)
        .await
        .unwrap();
    let took = started.elapsed();
    // 2 MiB at 4 MiB/s: due at 0.5 s; the last piece's wait ends no sooner.
    assert!(took >= Duration::from_millis(490), "{took:?}");
    assert_eq!(client.sent().bytes, 2 << 20);
    assert_eq!(
        std::fs::read(registry.blob_file(&digest)).unwrap(),
        blob,
        "the registry's copy"
    );
}

/// A registry with token authentication: the client follows its Bearer challenge to the token
/// server, with Basic credentials there, and uses the token it gets for the scope.
async fn bearer(tmp: &Path, parts: &checkpoint::ArchiveParts) {
    let keys = tmp.join("token-keys");
    std::fs::create_dir_all(&keys).unwrap();
    let tokens = TokenServer::start(&keys);
    let registry = Registry::start_with(|_| {
        format!(
            "auth:\n  token:\n    realm: http://{}/token\n    service: {SERVICE}\n    \
             issuer: {ISSUER}\n    rootcertbundle: {}\n",
            tokens.addr,
            keys.join("token.crt").display()
        )
    });
    let with = |password: &str| {
        Client::new(
            &registry.addr,
            ClientOptions {
                credentials: Some(Credentials {
                    username: USER.into(),
                    password: password.into(),
                }),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let client = with(PASSWORD);
    let r = Reference::parse(&format!("{}/belayer/bearer:cp-1", registry.addr)).unwrap();
    let pushed = checkpoint::push_archive_parts(&client, &r, parts)
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", registry.log_text()));
    assert_eq!(pushed.uploaded.len(), parts.parts.len() + 1);
    // One token for the push's scope, reused for every request of the push.
    assert_eq!(tokens.issued.load(Ordering::SeqCst), 1);
    let dest = tmp.join("pulled-bearer");
    let pulled = checkpoint::pull_to_archive(&client, &r, &dest, &PullLimits::default())
        .await
        .unwrap();
    assert_eq!(pulled.config.newest, parts.config.newest);
    assert!(dest.join(CHAIN_ARCHIVE).is_file());
    // The push's token serves the same client's pull; another client asks for its own.
    assert_eq!(tokens.issued.load(Ordering::SeqCst), 1);
    checkpoint::pull_to_archive(
        &with(PASSWORD),
        &r,
        &tmp.join("pulled-bearer-2"),
        &PullLimits::default(),
    )
    .await
    .unwrap();
    assert_eq!(tokens.issued.load(Ordering::SeqCst), 2);

    // The token server refuses a wrong password: so does the client, by name.
    let e =
        checkpoint::pull_to_archive(&with("wrong"), &r, &tmp.join("wb"), &PullLimits::default())
            .await
            .unwrap_err();
    assert!(
        matches!(&e, Error::Unauthorized { status: 401, step, .. } if step.contains("token")),
        "{e}"
    );
    assert_eq!(tokens.refused.load(Ordering::SeqCst), 1);
}

const SERVICE: &str = "belayer-registry";
const ISSUER: &str = "belayer-test-issuer";

/// A token server for the registry's `token` auth: Basic credentials in, a JWT out, signed
/// (RS256) by a key the `openssl` command made, its self-signed certificate in `x5c` and in the
/// registry's root bundle.
struct TokenServer {
    addr: String,
    issued: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

fn openssl(args: &[&str], dir: &Path, stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("openssl cannot run ({e}): install Debian's openssl package"));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn b64url(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8(out).unwrap()
}

impl TokenServer {
    fn start(dir: &Path) -> Self {
        openssl(
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "token.key",
                "-out",
                "token.crt",
                "-subj",
                "/CN=belayer-test-token",
                "-days",
                "2",
            ],
            dir,
            b"",
        );
        use base64::Engine as _;
        let x5c = base64::engine::general_purpose::STANDARD.encode(openssl(
            &["x509", "-in", "token.crt", "-outform", "DER"],
            dir,
            b"",
        ));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let issued = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        let (dir, i, r) = (dir.to_path_buf(), issued.clone(), refused.clone());
        std::thread::spawn(move || {
            for mut c in listener.incoming().flatten() {
                Self::answer(&mut c, &dir, &x5c, &i, &r);
            }
        });
        Self {
            addr,
            issued,
            refused,
        }
    }

    fn answer(
        c: &mut TcpStream,
        dir: &Path,
        x5c: &str,
        issued: &AtomicUsize,
        refused: &AtomicUsize,
    ) {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if c.read(&mut byte).unwrap_or(0) == 0 || head.len() > 65536 {
                return;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let target = head
            .lines()
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .unwrap_or_default();
        let query = target.split_once('?').map(|q| q.1).unwrap_or_default();
        let expected = format!("Basic {}", base64_of(&format!("{USER}:{PASSWORD}")));
        let authorized = head.lines().any(|l| {
            l.split_once(':').is_some_and(|(k, v)| {
                k.eq_ignore_ascii_case("authorization") && v.trim() == expected
            })
        });
        let reply = |c: &mut TcpStream, status: &str, body: String| {
            let _ = write!(
                c,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        };
        if !authorized {
            refused.fetch_add(1, Ordering::SeqCst);
            reply(
                c,
                "401 Unauthorized",
                r#"{"details":"wrong credentials"}"#.into(),
            );
            return;
        }
        let access: Vec<serde_json::Value> = query
            .split('&')
            .filter_map(|kv| kv.strip_prefix("scope="))
            .map(percent_decode)
            .filter_map(|scope| {
                let mut it = scope.splitn(3, ':');
                let (kind, name, actions) = (it.next()?, it.next()?, it.next()?);
                Some(serde_json::json!({
                    "type": kind, "name": name,
                    "actions": actions.split(',').collect::<Vec<_>>(),
                }))
            })
            .collect();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let n = issued.fetch_add(1, Ordering::SeqCst);
        let header = serde_json::json!({"typ": "JWT", "alg": "RS256", "x5c": [x5c]});
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": USER, "aud": SERVICE, "exp": now + 600, "nbf": now - 60,
            "iat": now, "jti": format!("{now}-{n}"), "access": access,
        });
        let input = format!(
            "{}.{}",
            b64url(header.to_string().as_bytes()),
            b64url(claims.to_string().as_bytes())
        );
        let signature = openssl(
            &["dgst", "-sha256", "-sign", "token.key"],
            dir,
            input.as_bytes(),
        );
        let token = format!("{input}.{}", b64url(&signature));
        reply(
            c,
            "200 OK",
            serde_json::json!({"token": token, "expires_in": 600}).to_string(),
        );
    }
}
