//! containerd's own checkpoint path: `Task.Checkpoint` writes a self-contained Belayer checkpoint
//! (processes and filesystem, the whole layer chain) into the directory containerd names, and a
//! task created with `checkpoint` set imports such a directory and restores it.
//!
//! The export is flat, regular files only, because Kubernetes' checkpoint (CRI
//! `CheckpointContainer`) unpacks containerd's checkpoint blob into one directory and creates
//! every entry as a file:
//! - the CRIU images of the checkpoint, where runc's export has them;
//! - [`CHAIN_ARCHIVE`]: the rest of the chain as a store (`checkpoints/<namespace>/<container>/
//!   <seq>/`, every member but the newest one's CRIU images), a tar that keeps owners, modes,
//!   xattrs (overlay's `trusted.*` too), whiteouts, hardlinks and sparse files.
//!
//! To restore from a checkpoint image, containerd unpacks it into a fresh `ctrd-checkpoint*`
//! directory under its temporary directory and never removes it (runc's restores leave theirs
//! too). The import moves the images out of such a directory instead of copying them, and
//! removes what is left: otherwise every restore through containerd leaves a copy of the
//! checkpoint behind, memory pages included. CRI unpacks its archive into the container's
//! `ctrd-restore/checkpoint` and removes that itself after the start: its files are hardlinked.
//! Any other directory is only read, and copied from.
//!
//! An imported checkpoint is untrusted input (docs/security.md): its archive is bounded
//! ([`crate::archive`]) and its members confined before it is unpacked, it lands under the
//! namespace and id of the container being created, whatever names it carries, and stacks on
//! that container's image snapshot, never on lower dirs its manifests name.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use criu_bridge::runc::Spawner;
use criu_bridge::store::StoreError;

use crate::error::ExportError;
use crate::error::{Error, Result, io};
use belayer_api::RestoreOptions;

/// The archive of the chain in an export.
pub const CHAIN_ARCHIVE: &str = "belayer-chain.tar";

/// GNU tar's options for a store tree, on both ends: every xattr namespace (overlay's opaque
/// dirs and redirects are `trusted.*`), numeric owners, holes kept.
const TAR_OPTIONS: [&str; 4] = [
    "--xattrs",
    "--xattrs-include=*",
    "--numeric-owner",
    "--sparse",
];

/// Runs `cmd` (the shim's is [`crate::reaper::ReaperSpawner`]); `what` names it in the error.
fn run(spawner: &dyn Spawner, what: &str, mut cmd: Command) -> Result<()> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = spawner.output(cmd).map_err(io(format!("run {what}")))?;
    if !out.status.success() {
        return Err(ExportError::Tool {
            what: what.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        }
        .into());
    }
    Ok(())
}

/// How the files of a directory may be put elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placing {
    /// Moved: the directory is containerd's to discard, and nobody else's.
    Take,
    /// Hardlinked: the directory is read and removed, never written.
    Link,
    /// Copied: the directory is someone's; what is done to it later must not reach the store.
    Copy,
}

/// How the files of the checkpoint directory a create names may be placed:
/// - [`Placing::Take`]: `ctrd-checkpoint*` directly under `$XDG_RUNTIME_DIR`, or the temporary
///   directory without it (containerd's `os.MkdirTemp(os.Getenv("XDG_RUNTIME_DIR"),
///   "ctrd-checkpoint")`; the shim runs in containerd's environment), never removed;
/// - [`Placing::Link`]: CRI's `…/ctrd-restore/checkpoint`, removed by CRI after the start, and
///   `belayer pull`'s `export` in its staging dir directly in the store root `store_root`,
///   removed by the CLI after the create;
/// - [`Placing::Copy`]: any other.
pub fn placing_for(path: &Path, store_root: &Path) -> Placing {
    let tmp = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(std::env::temp_dir, PathBuf::from);
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string()
    };
    let cri_restore = name(Some(path)) == "checkpoint" && name(path.parent()) == "ctrd-restore";
    let pull = name(Some(path)) == "export"
        && name(path.parent()).starts_with(belayer_api::PULL_STAGING_PREFIX)
        && path.parent().and_then(Path::parent) == Some(store_root);
    if path.parent() == Some(tmp.as_path()) && name(Some(path)).starts_with("ctrd-checkpoint") {
        Placing::Take
    } else if cri_restore || pull {
        Placing::Link
    } else {
        Placing::Copy
    }
}

/// Puts file `from` at `to` as `how` says; a copy where a rename or link cannot cross
/// filesystems.
fn place_file(from: &Path, to: &Path, how: Placing) -> Result<()> {
    let placed = match how {
        Placing::Take => std::fs::rename(from, to),
        Placing::Link => std::fs::hard_link(from, to),
        Placing::Copy => std::fs::copy(from, to).map(drop),
    };
    match placed {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => std::fs::copy(from, to)
            .map(drop)
            .map_err(io(format!("copy {} to {}", from.display(), to.display()))),
        Err(source) => Err(ExportError::Place {
            how: match how {
                Placing::Take => "move",
                Placing::Link => "link",
                Placing::Copy => "copy",
            },
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            source,
        }
        .into()),
    }
}

/// The regular files directly in `dir`, but [`CHAIN_ARCHIVE`]; anything else is an error, for
/// an export holds nothing else.
fn flat_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io(format!("read {}", dir.display())))? {
        let e = e.map_err(io(format!("read {}", dir.display())))?;
        if e.file_name() == CHAIN_ARCHIVE {
            continue;
        }
        let kind = e
            .file_type()
            .map_err(io(format!("stat {}", e.path().display())))?;
        if !kind.is_file() {
            return Err(ExportError::NotAFile(e.path()).into());
        }
        files.push(e.path());
    }
    Ok(files)
}

/// Writes checkpoint `seq` of `namespace/container` in `store`, with its whole chain, to `dest`
/// as a flat export (module doc). The CRIU images are placed as `how` says: hardlinked into
/// containerd's own temporary directory, which it only reads (into its content store) and
/// removes; copied into a directory the user named, for an edit there must not reach the store.
pub fn export(
    store: &criu_bridge::Store,
    namespace: &str,
    container: &str,
    seq: u64,
    dest: &Path,
    how: Placing,
    spawner: &dyn Spawner,
) -> Result<()> {
    let cp = store.load(namespace, container, seq)?;
    // Retention or a `belayer rm` must not take a member while it is being read.
    let _lease = store.lease(&cp, (namespace, container))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dest)
        .map_err(io(format!("create {}", dest.display())))?;
    let criu = cp.criu_dir();
    for file in flat_files(&criu)? {
        let to = dest.join(file.file_name().unwrap_or_default());
        place_file(&file, &to, how)?;
        private_file(&to)?;
    }
    // Created root-only before tar writes the older checkpoints' memory pages into it.
    let chain = dest.join(CHAIN_ARCHIVE);
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&chain)
        .map_err(io(format!("create {}", chain.display())))?;
    private_file(&chain)?;
    let relative = |p: &Path| p.strip_prefix(store.root()).map(Path::to_path_buf);
    let skip = relative(&criu).map_err(|_| ExportError::OutsideStore(criu.clone()))?;
    let mut tar = Command::new("tar");
    tar.arg("--create")
        .arg("--format=posix")
        .args(TAR_OPTIONS)
        .arg("--file")
        .arg(&chain)
        .arg("--directory")
        .arg(store.root())
        .arg("--anchored")
        .arg(format!("--exclude={}", skip.display()));
    for member in &cp.manifest.fs_chain {
        let dir = store.load(namespace, container, *member)?.dir;
        tar.arg(relative(&dir).map_err(|_| ExportError::OutsideStore(dir.clone()))?);
    }
    run(
        spawner,
        &format!("archive the chain into {}", dest.display()),
        tar,
    )
}

/// Makes `path` readable by root only (0600), whatever mode it was created or copied with.
fn private_file(path: &Path) -> Result<()> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io(format!("chmod {}", path.display())))
}

/// The prefix of an import's staging directory in the store root; the shim's pid follows.
const IMPORT_PREFIX: &str = ".tmp-import-";

/// The staging directories in the store root that a process names by its pid after the
/// prefix: an import's (a shim), a push's export (a shim), a pull's (the CLI).
const STAGING_PREFIXES: [&str; 3] = [
    IMPORT_PREFIX,
    belayer_api::PUSH_STAGING_PREFIX,
    belayer_api::PULL_STAGING_PREFIX,
];

/// Removes the staging directories (imports, pushes, pulls) whose process is gone (it died
/// midway).
pub fn remove_dead_staging(root: &Path) {
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = STAGING_PREFIXES
            .iter()
            .find_map(|p| name.strip_prefix(p))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && !Path::new(&format!("/proc/{pid}")).exists()
        {
            log::info!(
                "removing {}, left by an import, push or pull that died",
                e.path().display()
            );
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// What a checkpoint directory that a create names holds.
#[derive(Debug)]
pub enum Imported {
    /// A Belayer export, now in this node's store: the checkpoint to restore.
    Belayer(RestoreOptions),
    /// runc's checkpoint (`ctr task checkpoint` or Kubernetes' checkpoint of a container on
    /// runc): CRIU images alone, the filesystem being containerd's to bring (CRI unpacks its
    /// `rootfs-diff.tar` into the task's rootfs).
    Runc(RuncImages),
}

/// A directory of runc's CRIU images that a create names. When it is containerd's to discard
/// (`ctr`'s unpacked `ctrd-checkpoint*`, which containerd itself never removes) it goes when this
/// is dropped: after the restore, or with a create or start that failed before it.
#[derive(Debug)]
pub struct RuncImages {
    pub dir: PathBuf,
    remove: bool,
}

impl Drop for RuncImages {
    fn drop(&mut self) {
        if self.remove
            && let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            log::warn!(
                "remove {}, containerd's unpacked checkpoint: {e}",
                self.dir.display()
            );
        }
    }
}

/// CRIU's first image, in every dump.
const CRIU_INVENTORY: &str = "inventory.img";

/// The container an import is for: it owns whatever it imports.
#[derive(Clone, Debug)]
pub struct Owner {
    /// Its namespace.
    pub namespace: String,
    /// Its id.
    pub container: String,
    /// The lower dirs of its image snapshot, newest first; `None` when its rootfs is not an
    /// overlay (nothing to stack a Belayer checkpoint on).
    pub image_lowers: Option<Vec<PathBuf>>,
    /// The bounds of an import.
    pub limits: crate::archive::ImportLimits,
}

/// Imports the export at `path` (module doc) into `store` as `owner`'s checkpoints, unless they
/// are there already, and names its newest checkpoint. Before anything is unpacked the archive is
/// bounded and its members confined; before anything is created or moved every path its
/// manifests name is confined to its checkpoint ([`criu_bridge::Store::claim`]). The export's
/// files are placed as `how` says. runc's images (no [`CHAIN_ARCHIVE`]) are left where they are.
pub fn import(
    store: &criu_bridge::Store,
    path: &Path,
    how: Placing,
    spawner: &dyn Spawner,
    owner: &Owner,
) -> Result<Imported> {
    let archive = path.join(CHAIN_ARCHIVE);
    if !archive.is_file() {
        if path.join(CRIU_INVENTORY).is_file() {
            // Regular files only: a symlink would feed a host file to CRIU as an image.
            flat_files(path)?;
            return Ok(Imported::Runc(RuncImages {
                dir: path.to_path_buf(),
                remove: how == Placing::Take,
            }));
        }
        return Err(ExportError::NoCheckpoint {
            path: path.to_path_buf(),
            archive: CHAIN_ARCHIVE,
            inventory: CRIU_INVENTORY,
        }
        .into());
    }
    let images = flat_files(path)?;
    let image_lowers = owner
        .image_lowers
        .as_ref()
        .ok_or_else(|| ExportError::NoSnapshot {
            path: path.to_path_buf(),
            container: owner.container.clone(),
        })?;
    let mut beside = 0u64;
    for image in &images {
        let len = std::fs::metadata(image)
            .map_err(io(format!("stat {}", image.display())))?
            .len();
        beside = beside.saturating_add(len);
    }
    store.secure()?;
    crate::archive::check(&archive, beside, &owner.limits, store.root()).map_err(|source| {
        ExportError::Archive {
            path: path.to_path_buf(),
            source,
        }
    })?;
    // Unpacked beside the store's checkpoints, so that they move into place by rename.
    remove_dead_staging(store.root());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let staging = store
        .root()
        .join(format!("{IMPORT_PREFIX}{}-{stamp}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(io(format!("create {}", staging.display())))?;
    let _remove = criu_bridge::store::RemoveOnDrop(staging.clone());
    let mut tar = Command::new("tar");
    tar.arg("--extract")
        .args(TAR_OPTIONS)
        .arg("--same-owner")
        .arg("--preserve-permissions")
        .arg("--file")
        .arg(&archive)
        .arg("--directory")
        .arg(&staging);
    run(spawner, &format!("unpack {}", archive.display()), tar)?;

    let exported = criu_bridge::Store::new(&staging);
    // The importer's, whatever the archive names: confined, ids in range, on its own image.
    let (namespace, container) = (&owner.namespace, &owner.container);
    exported
        .claim(namespace, container, image_lowers)
        .map_err(|source| ExportError::Refused {
            path: path.to_path_buf(),
            source,
        })?;
    // Never restore ours in place of theirs: a clash is refused before anything moves (and
    // again at the move, for a number this store took meanwhile).
    let clash = |e: StoreError| -> Error {
        match e {
            e @ StoreError::Clash { .. } => ExportError::Clash {
                archive: archive.clone(),
                source: e,
            }
            .into(),
            e => e.into(),
        }
    };
    let adoption = store
        .adoption(&exported, namespace, container)
        .map_err(clash)?
        .ok_or_else(|| ExportError::NotOurs {
            archive: archive.clone(),
            namespace: namespace.clone(),
            container: container.clone(),
        })?;
    let found = Imported::Belayer(RestoreOptions {
        namespace: namespace.clone(),
        container: container.clone(),
        checkpoint: adoption.newest,
    });
    if let Some(cp) = adoption
        .missing
        .iter()
        .find(|cp| cp.manifest.seq == adoption.newest)
    {
        let criu = cp.criu_dir();
        std::fs::create_dir_all(&criu).map_err(io(format!("create {}", criu.display())))?;
        for image in &images {
            place_file(
                image,
                &criu.join(image.file_name().unwrap_or_default()),
                how,
            )?;
        }
    }
    store.adopt(&adoption).map_err(clash)?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_s_own_directories_are_taken_or_linked_others_copied() {
        let tmp = std::env::var_os("XDG_RUNTIME_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(std::env::temp_dir, PathBuf::from);
        let store = Path::new("/var/lib/belayer");
        assert_eq!(
            placing_for(&tmp.join("ctrd-checkpoint123"), store),
            Placing::Take
        );
        assert_eq!(
            placing_for(&tmp.join("sub/ctrd-checkpoint123"), store),
            Placing::Copy
        );
        assert_eq!(
            placing_for(
                Path::new(
                    "/var/lib/containerd/io.containerd.grpc.v1.cri/containers/abc/ctrd-restore/checkpoint"
                ),
                store
            ),
            Placing::Link
        );
        assert_eq!(
            placing_for(Path::new("/home/me/ctrd-restore/checkpoints"), store),
            Placing::Copy
        );
        assert_eq!(placing_for(Path::new("/srv/export"), store), Placing::Copy);
        // A pull's staging dir in this store, and only there.
        let pulled = store.join(format!("{}1-2/export", belayer_api::PULL_STAGING_PREFIX));
        assert_eq!(placing_for(&pulled, store), Placing::Link);
        assert_eq!(placing_for(&pulled, Path::new("/other")), Placing::Copy);
        assert_eq!(
            placing_for(&store.join(".tmp-import-1-2/export"), store),
            Placing::Copy
        );
    }

    /// The container importing in the tests: `default/importer` on the image `lowers`.
    fn owner(lowers: &[PathBuf]) -> Owner {
        Owner {
            namespace: "default".into(),
            container: "importer".into(),
            image_lowers: Some(lowers.to_vec()),
            limits: Default::default(),
        }
    }

    fn import_as(store: &criu_bridge::Store, export: &Path, owner: &Owner) -> Result<Imported> {
        import(
            store,
            export,
            Placing::Copy,
            &criu_bridge::runc::StdSpawner,
            owner,
        )
    }

    /// Why `owner`'s import of `export` into `store` is refused.
    fn refusal(store: &criu_bridge::Store, export: &Path, owner: &Owner) -> String {
        import_as(store, export, owner)
            .expect_err("imported")
            .message()
    }

    fn import_error(export: &Path) -> String {
        let store = tempfile::tempdir().unwrap();
        let store = criu_bridge::Store::new(store.path());
        let e = import_as(&store, export, &owner(&[]))
            .expect_err("a bad export imported")
            .message();
        let leftovers: Vec<_> = std::fs::read_dir(store.root())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(leftovers.is_empty(), "the import left {leftovers:?} ({e})");
        e
    }

    #[test]
    fn runc_s_images_stay_where_they_are_for_the_start_and_go_only_when_containerd_s() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CRIU_INVENTORY), b"criu").unwrap();
        let store = tempfile::tempdir().unwrap();
        let store = criu_bridge::Store::new(store.path());
        // CRI's directory (linked) and any other (copied) stay after the images are dropped;
        // ctr's own (taken) goes with them.
        for (how, remove) in [
            (Placing::Link, false),
            (Placing::Copy, false),
            (Placing::Take, true),
        ] {
            let found = import(
                &store,
                dir.path(),
                how,
                &criu_bridge::runc::StdSpawner,
                &owner(&[]),
            )
            .unwrap();
            assert!(
                matches!(&found, Imported::Runc(images)
                    if images.dir == dir.path() && images.remove == remove),
                "{how:?}: {found:?}"
            );
            assert!(dir.path().join(CRIU_INVENTORY).is_file(), "{how:?}");
            drop(found);
            assert_eq!(dir.path().exists(), !remove, "{how:?}");
        }
        assert_eq!(std::fs::read_dir(store.root()).unwrap().count(), 0);
    }

    /// runc's images (a runc-made CRI archive) with a symlink to a host file among them: refused,
    /// for CRIU would read that file as an image.
    #[test]
    fn runc_s_images_are_regular_files_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CRIU_INVENTORY), b"criu").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.path().join("pages-1.img")).unwrap();
        let e = import_error(dir.path());
        assert!(e.contains("pages-1.img is not a regular file"), "{e}");
    }

    #[test]
    fn a_bad_export_is_refused_by_name_and_leaves_the_store_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let e = import_error(dir.path());
        assert!(
            e.contains("holds no checkpoint") && e.contains(CHAIN_ARCHIVE),
            "{e}"
        );

        // A chain archive cut short (a tar of one file, truncated inside that file).
        let export = forged_export(|src| {
            std::fs::create_dir_all(src.join("checkpoints/ns/c/1")).unwrap();
            std::fs::write(
                src.join("checkpoints/ns/c/1/manifest.json"),
                vec![b'x'; 20_000],
            )
            .unwrap();
        });
        let tar = export.path().join(CHAIN_ARCHIVE);
        let bytes = std::fs::read(&tar).unwrap();
        std::fs::write(&tar, &bytes[..bytes.len() / 3]).unwrap();
        let e = import_error(export.path());
        // Its headers are read before it is unpacked.
        assert!(
            e.contains("is not a whole tar archive") && e.contains(CHAIN_ARCHIVE),
            "{e}"
        );

        // A staging directory of an import, push or pull that died is cleared by the next one.
        let store = tempfile::tempdir().unwrap();
        for prefix in STAGING_PREFIXES {
            let dead = store.path().join(format!("{prefix}{}-1", u32::MAX));
            let live = store
                .path()
                .join(format!("{prefix}{}-1", std::process::id()));
            std::fs::create_dir_all(&dead).unwrap();
            std::fs::create_dir_all(&live).unwrap();
            remove_dead_staging(store.path());
            assert!(!dead.exists() && live.exists(), "{prefix}");
        }

        // Something other than files beside it.
        std::fs::create_dir(export.path().join("sub")).unwrap();
        let e = import_error(export.path());
        assert!(e.contains("is not a regular file"), "{e}");
    }

    use criu_bridge::store::Manifest;

    /// A checkpoint's manifest as an archive's author writes it (no files recorded: an import
    /// does not verify, the restore after it does).
    fn manifest(namespace: &str, container: &str, seq: u64, lowers: &[PathBuf]) -> Manifest {
        Manifest {
            format_version: criu_bridge::store::FORMAT_VERSION,
            namespace: namespace.into(),
            container: container.into(),
            seq,
            parent: None,
            created_unix_ms: 1,
            spec_digest: "sha256:0".into(),
            image_lowers: lowers.to_vec(),
            rootfs_shared: false,
            fs_chain: vec![seq],
            criu_dir: "criu".into(),
            fs_dir: "fs".into(),
            leave_running: true,
            uncaptured_execs: Vec::new(),
            criu_options: Default::default(),
            sizes: Default::default(),
            timings: Default::default(),
            criu_stats: None,
            capture: Default::default(),
            files: Vec::new(),
        }
    }

    /// Writes `m`'s checkpoint dir into the store tree `root`: an fs layer of one file, its
    /// manifest; returns the dir.
    fn plant(root: &Path, m: &Manifest) -> PathBuf {
        let dir = root.join(format!(
            "checkpoints/{}/{}/{}",
            m.namespace, m.container, m.seq
        ));
        std::fs::create_dir_all(dir.join("fs")).unwrap();
        std::fs::write(dir.join("fs/file"), b"x").unwrap();
        std::fs::write(dir.join("manifest.json"), m.to_bytes()).unwrap();
        dir
    }

    /// An export as its author packs it: the store tree `build` writes into a fresh dir, as
    /// [`CHAIN_ARCHIVE`] (GNU tar, holes kept), beside a CRIU inventory.
    fn forged_export(build: impl FnOnce(&Path)) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("checkpoints")).unwrap();
        build(&src);
        let made = Command::new("tar")
            .args(["--create", "--format=posix", "--sparse", "--file"])
            .arg(dir.path().join(CHAIN_ARCHIVE))
            .arg("--directory")
            .arg(&src)
            .arg("checkpoints")
            .status()
            .unwrap();
        assert!(made.success());
        std::fs::remove_dir_all(&src).unwrap();
        std::fs::write(dir.path().join(CRIU_INVENTORY), b"criu").unwrap();
        dir
    }

    /// A store whose `default/victim` has checkpoint 1, and a snapshot dir for the importer.
    fn victim_store() -> (tempfile::TempDir, criu_bridge::Store, Vec<PathBuf>) {
        let tmp = tempfile::tempdir().unwrap();
        let store = criu_bridge::Store::new(tmp.path().join("store"));
        let snapshot = vec![tmp.path().join("snapshot")];
        std::fs::create_dir_all(&snapshot[0]).unwrap();
        plant(store.root(), &manifest("default", "victim", 1, &snapshot));
        (tmp, store, snapshot)
    }

    /// An archive's manifest naming an absolute `criu_dir` (a stand-in for /etc/cron.d) or one
    /// that climbs out with `..`: refused, and nothing is created or copied there.
    #[test]
    fn a_criu_dir_outside_the_checkpoint_is_refused_before_anything_is_written() {
        let (tmp, store, lowers) = victim_store();
        let cron = tmp.path().join("cron.d");
        for criu_dir in [
            cron.display().to_string(),
            "../../../../../../cron.d".into(),
        ] {
            let export = forged_export(|src| {
                let mut m = manifest("default", "c", 1, &lowers);
                m.criu_dir = criu_dir.clone();
                plant(src, &m);
            });
            let e = refusal(&store, export.path(), &owner(&lowers));
            assert!(e.contains("criu_dir"), "{criu_dir}: {e}");
            assert!(
                !cron.exists(),
                "{criu_dir}: the import wrote outside the store"
            );
            assert!(store.list("default", "importer").unwrap().is_empty());
        }
    }

    /// An archive's manifest naming a host dir among its image lower dirs: the import stacks on
    /// the importer's own image snapshot instead, and one naming another number of them is
    /// refused.
    #[test]
    fn image_lower_dirs_are_the_importer_s_snapshot_whatever_the_archive_names() {
        let (tmp, store, lowers) = victim_store();
        let host = tmp.path().join("host-etc");
        std::fs::create_dir_all(&host).unwrap();
        let export = forged_export(|src| {
            plant(
                src,
                &manifest("default", "c", 1, std::slice::from_ref(&host)),
            );
        });
        let found = import_as(&store, export.path(), &owner(&lowers)).unwrap();
        assert!(
            matches!(&found, Imported::Belayer(o)
                if (o.namespace.as_str(), o.container.as_str(), o.checkpoint)
                    == ("default", "importer", 1)),
            "{found:?}"
        );
        let cp = store.load("default", "importer", 1).unwrap();
        assert_eq!(cp.manifest.image_lowers, lowers);
        assert!(cp.criu_dir().join(CRIU_INVENTORY).is_file());

        let export = forged_export(|src| {
            plant(
                src,
                &manifest("default", "c", 2, &[host.clone(), host.clone()]),
            );
        });
        let e = refusal(&store, export.path(), &owner(&lowers));
        assert!(e.contains("image lower dirs"), "{e}");
    }

    /// An archive whose `fs` is a symlink to a host dir: refused before it could be mounted.
    #[test]
    fn a_symlinked_fs_dir_is_refused() {
        let (tmp, store, lowers) = victim_store();
        let host = tmp.path().join("host-etc");
        std::fs::create_dir_all(&host).unwrap();
        let export = forged_export(|src| {
            let dir = plant(src, &manifest("default", "c", 1, &lowers));
            std::fs::remove_dir_all(dir.join("fs")).unwrap();
            std::os::unix::fs::symlink(&host, dir.join("fs")).unwrap();
        });
        let e = refusal(&store, export.path(), &owner(&lowers));
        assert!(e.contains("fs_dir") && e.contains("symlink"), "{e}");
        assert!(store.list("default", "importer").unwrap().is_empty());
    }

    /// An archive naming another container of this store (`default/victim`), with an id that
    /// would wrap its next one, or with a symlink to its dir as the archive's container dir:
    /// the victim's checkpoints stay as they were; a well-formed one lands under the importer.
    #[test]
    fn an_import_never_joins_or_takes_another_container_s_chain() {
        let (_tmp, store, lowers) = victim_store();
        let victim = store.container_dir("default", "victim").unwrap();
        let export = forged_export(|src| {
            let mut m = manifest("default", "victim", 1, &lowers);
            m.seq = u64::MAX;
            m.fs_chain = vec![u64::MAX];
            let dir = plant(src, &manifest("default", "victim", 1, &lowers));
            std::fs::write(dir.join("manifest.json"), m.to_bytes()).unwrap();
            std::fs::rename(&dir, dir.with_file_name(u64::MAX.to_string())).unwrap();
        });
        let e = refusal(&store, export.path(), &owner(&lowers));
        assert!(e.contains("18446744073709551615"), "{e}");

        let export = forged_export(|src| {
            std::fs::create_dir_all(src.join("checkpoints/default")).unwrap();
            std::os::unix::fs::symlink(&victim, src.join("checkpoints/default/evil")).unwrap();
        });
        let e = refusal(&store, export.path(), &owner(&lowers));
        assert!(e.contains("symlink"), "{e}");
        assert_eq!(store.list("default", "victim").unwrap(), [1]);
        assert!(victim.join("1/manifest.json").is_file());

        let export = forged_export(|src| {
            plant(src, &manifest("default", "victim", 2, &lowers));
        });
        import_as(&store, export.path(), &owner(&lowers)).unwrap();
        assert_eq!(store.list("default", "victim").unwrap(), [1]);
        assert_eq!(store.list("default", "importer").unwrap(), [2]);
        let m = store.load("default", "importer", 2).unwrap().manifest;
        assert_eq!(
            (m.namespace, m.container),
            ("default".into(), "importer".into())
        );
    }

    /// A sparse member of 1 TiB apparent size (a few KiB of archive), more members or bytes
    /// than the limits: refused before anything is unpacked.
    #[test]
    fn oversized_and_sparse_archives_are_refused_before_they_are_unpacked() {
        let (_tmp, store, lowers) = victim_store();
        let export = forged_export(|src| {
            let dir = plant(src, &manifest("default", "c", 1, &lowers));
            let f = std::fs::File::create(dir.join("fs/holes")).unwrap();
            f.set_len(1 << 40).unwrap();
        });
        let archive = std::fs::metadata(export.path().join(CHAIN_ARCHIVE)).unwrap();
        assert!(archive.len() < 1 << 20, "{}", archive.len());
        let unpacked = || {
            std::fs::read_dir(store.root())
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(IMPORT_PREFIX))
                .count()
        };
        let e = refusal(&store, export.path(), &owner(&lowers));
        assert!(
            e.contains("max_unpacked_bytes") && e.contains("sparse"),
            "{e}"
        );
        assert_eq!(unpacked(), 0);
        for (limits, setting) in [
            (
                crate::archive::ImportLimits {
                    max_files: 3,
                    ..Default::default()
                },
                "max_files",
            ),
            (
                crate::archive::ImportLimits {
                    max_archive_bytes: 4096,
                    ..Default::default()
                },
                "max_archive_bytes",
            ),
        ] {
            let export = forged_export(|src| {
                plant(src, &manifest("default", "c", 1, &lowers));
            });
            let mut who = owner(&lowers);
            who.limits = limits;
            let e = refusal(&store, export.path(), &who);
            assert!(e.contains(setting), "{e}");
        }
        assert!(store.list("default", "importer").unwrap().is_empty());
        assert_eq!(unpacked(), 0);
    }

    /// A member no export holds (an absolute name): refused before anything is unpacked.
    #[test]
    fn members_outside_the_chain_are_refused_before_they_are_unpacked() {
        let (tmp, store, lowers) = victim_store();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        let export = forged_export(|src| {
            plant(src, &manifest("default", "c", 1, &lowers));
        });
        let archive = export.path().join(CHAIN_ARCHIVE);
        let appended = Command::new("tar")
            .args(["--append", "--format=posix", "--absolute-names", "--file"])
            .arg(&archive)
            .arg(&outside)
            .status()
            .unwrap();
        assert!(appended.success());
        let e = refusal(&store, export.path(), &owner(&lowers));
        assert!(e.contains("is absolute"), "{e}");
    }

    /// An export is root-only: its dir 0700, its images and chain archive 0600, whatever the
    /// umask; and it imports whole.
    #[test]
    fn an_export_is_root_only_and_imports_whole() {
        use std::os::unix::fs::PermissionsExt;
        let (tmp, store, lowers) = victim_store();
        let cp = store.load("default", "victim", 1).unwrap();
        std::fs::create_dir_all(cp.criu_dir()).unwrap();
        std::fs::write(cp.criu_dir().join(CRIU_INVENTORY), b"criu").unwrap();
        let dest = tmp.path().join("export");
        export(
            &store,
            "default",
            "victim",
            1,
            &dest,
            Placing::Copy,
            &criu_bridge::runc::StdSpawner,
        )
        .unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dest), 0o700);
        for name in [CHAIN_ARCHIVE, CRIU_INVENTORY] {
            assert_eq!(mode(&dest.join(name)), 0o600, "{name}");
        }
        import_as(&store, &dest, &owner(&lowers)).unwrap();
        let imported = store.load("default", "importer", 1).unwrap();
        assert!(imported.criu_dir().join(CRIU_INVENTORY).is_file());
        assert!(imported.fs_dir().join("file").is_file());
    }
}
