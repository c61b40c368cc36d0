"""Prints the filesystem tree as one line per node: path, type, mode, owner, link count, xattrs,
content hash and whether it has a hole (files), target (symlinks), mtime (non-directories).
Skips virtual filesystems and the files the episode's background processes keep writing.

A hole is found with SEEK_HOLE, not from st_blocks: once in CI a 576-byte file of the freshly
unpacked image (lower layer, untouched) read st_blocks 0 after a restore, a full file called
sparse. ext4 counts a file's blocks apart while its delayed allocation is written back;
SEEK_HOLE reads the extents themselves."""
import hashlib, os, stat, sys

SKIP = {"/proc", "/sys", "/dev", "/run", "/tmp", "/work/counter", "/work/holder.log", "/root/.cache"}
def has_hole(p, size):
    fd = os.open(p, os.O_RDONLY)
    try:
        return size > 0 and os.lseek(fd, 0, os.SEEK_HOLE) < size
    finally:
        os.close(fd)

def xattrs(p):
    try:
        return sorted((k, os.getxattr(p, k, follow_symlinks=False).hex()) for k in os.listxattr(p, follow_symlinks=False))
    except OSError:
        return []
out = []
for root, dirs, files in os.walk("/"):
    dirs[:] = sorted(d for d in dirs if os.path.join(root, d) not in SKIP)
    for name in sorted(dirs + files):
        p = os.path.join(root, name)
        if p in SKIP:
            continue
        st = os.lstat(p)
        kind = stat.S_IFMT(st.st_mode)
        line = [p, oct(st.st_mode), st.st_uid, st.st_gid, st.st_nlink if not stat.S_ISDIR(st.st_mode) else 0, xattrs(p)]
        if stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            line += [st.st_size, h.hexdigest(), has_hole(p, st.st_size)]
        elif stat.S_ISLNK(st.st_mode):
            line.append(os.readlink(p))
        if not stat.S_ISDIR(st.st_mode):
            line.append(st.st_mtime_ns)
        out.append(repr(line))
sys.stdout.write("\n".join(out) + "\n")
