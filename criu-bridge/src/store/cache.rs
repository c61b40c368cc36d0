//! The page cache of stored CRIU images, given back to the kernel just before a dump.
//!
//! A dump writes the whole memory of the container (hundreds of MB) into new page-cache pages
//! while the container is frozen. In a VM whose hypervisor backs guest memory lazily and takes
//! free memory back (virtio-balloon free page reporting, as on Firecracker), a page the guest has
//! not used lately costs a fault on the host when it is first written: measured on this project's
//! VMs, CRIU wrote 330 MB of pages in 90 ms into recently used memory and in 700–800 ms once the
//! guest's free memory was cold, with the container frozen throughout. The CRIU images of the
//! checkpoints below the newest are rarely read again (a restore takes the newest), yet their
//! pages are recently used memory: dropped right before the freeze, they are what the dump's
//! writes are given. The newest checkpoint stays cached for a fast restore.

use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{ContainerLock, Store, StoreError, lease};

/// How many checkpoints below the newest have their images released: the one below it (whose
/// pages are still cached) and one more, for a checkpoint whose release was skipped.
const RELEASED_BELOW_NEWEST: usize = 2;

impl Store {
    /// Drops from the page cache the CRIU images of the checkpoints just below the newest of the
    /// container `lock` holds ([`RELEASED_BELOW_NEWEST`]); returns the bytes of the files it
    /// released (cached or not). The files are unchanged: only clean cached pages go. Regular
    /// files only, never through a symlink.
    pub fn release_older_images(&self, lock: &ContainerLock) -> Result<u64, StoreError> {
        let (ns, id) = lease::names_of(&lock.dir);
        let seqs = self.list(&ns, &id)?;
        let below = seqs.len().saturating_sub(1);
        let mut bytes = 0;
        for &seq in &seqs[below.saturating_sub(RELEASED_BELOW_NEWEST)..below] {
            let dir = self.load(&ns, &id, seq)?.criu_dir();
            bytes += release_dir(&dir).map_err(|(p, e)| StoreError::io("release", &p, e))?;
        }
        Ok(bytes)
    }
}

/// Releases the cached pages of every regular file directly in `dir`; returns their bytes.
fn release_dir(dir: &Path) -> Result<u64, (std::path::PathBuf, io::Error)> {
    let mut bytes = 0;
    for e in fs::read_dir(dir).map_err(|e| (dir.to_path_buf(), e))? {
        let e = e.map_err(|e| (dir.to_path_buf(), e))?;
        // The entry's own type: a symlink is not followed.
        if !e.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path = e.path();
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| (path.clone(), e))?;
        let meta = f.metadata().map_err(|e| (path.clone(), e))?;
        if meta.is_file() {
            crate::sys::drop_cached(&f).map_err(|e| (path.clone(), e))?;
            bytes += meta.len();
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// Pages of `path` in the page cache (mincore over a shared read-only mapping).
    fn resident_pages(path: &Path) -> usize {
        let f = fs::File::open(path).unwrap();
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a fresh read-only shared mapping of an open file, of its length, unmapped
        // below; nothing reads through it.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(addr, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        let page = 4096;
        let mut vec = vec![0u8; len.div_ceil(page)];
        // SAFETY: `addr..addr+len` is the mapping above; `vec` has one byte per page of it.
        let r = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        // SAFETY: the mapping made above, of `len` bytes, unmapped once.
        unsafe { libc::munmap(addr, len) };
        vec.iter().filter(|b| **b & 1 == 1).count()
    }

    /// A temp dir on a disk filesystem (tmpfs pages cannot be dropped): under /var/tmp.
    fn disk_dir() -> tempfile::TempDir {
        tempfile::tempdir_in("/var/tmp").unwrap()
    }

    /// A stored checkpoint whose CRIU dir holds one written, fsynced, cached file of `mb` MiB.
    fn stored(store: &Store, seq: u64, mb: usize) -> std::path::PathBuf {
        let lock = store.lock("ns", "c").unwrap();
        let pending = store.begin(&lock).unwrap();
        let path = pending.criu_dir().join("pages-1.img");
        let mut f = fs::File::create(&path).unwrap();
        f.write_all(&vec![seq as u8 + 1; mb << 20]).unwrap();
        f.sync_all().unwrap();
        let manifest = crate::store::Manifest::bare("ns", "c", seq, vec![seq], vec![]);
        let cp = pending.commit(manifest).unwrap();
        cp.criu_dir().join("pages-1.img")
    }

    #[test]
    fn releases_the_images_below_the_newest_and_keeps_the_newest_cached() {
        let root = disk_dir();
        let store = Store::new(root.path());
        let files: Vec<_> = (1..=4).map(|s| stored(&store, s, 4)).collect();
        for f in &files {
            assert!(resident_pages(f) > 0, "{} was not cached", f.display());
        }
        let lock = store.lock("ns", "c").unwrap();
        let released = store.release_older_images(&lock).unwrap();
        assert_eq!(released, 2 * (4 << 20));
        // 1 is beyond the depth; 2 and 3 are dropped; 4, the newest, stays.
        assert!(resident_pages(&files[0]) > 0);
        assert_eq!(resident_pages(&files[1]), 0);
        assert_eq!(resident_pages(&files[2]), 0);
        assert_eq!(resident_pages(&files[3]), 1024);
        // The files are unchanged.
        assert!(fs::read(&files[1]).unwrap().iter().all(|b| *b == 3));
    }

    #[test]
    fn a_symlink_in_an_image_dir_is_not_followed() {
        let root = disk_dir();
        let outside = root.path().join("outside.img");
        // Clean (fsynced) pages: a release that followed the link would drop them.
        let mut f = fs::File::create(&outside).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let store = Store::new(root.path().join("store"));
        let first = stored(&store, 1, 1);
        std::os::unix::fs::symlink(&outside, first.with_file_name("link.img")).unwrap();
        stored(&store, 2, 1);
        let lock = store.lock("ns", "c").unwrap();
        assert_eq!(store.release_older_images(&lock).unwrap(), 1 << 20);
        assert_eq!(resident_pages(&outside), 256);
    }
}
