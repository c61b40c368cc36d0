"""Background process of the reference episode: holds 300 MB of known bytes, an open file and a
listening socket. A client connecting to 127.0.0.1:8765 gets the sha256 of the memory now, so a
restored process proves its memory intact."""
import hashlib, os, socket, sys

size = int(sys.argv[1]) if len(sys.argv) > 1 else 300 << 20
data = bytearray(hashlib.shake_256(b"belayer").digest(size))
digest = hashlib.sha256(data).hexdigest()
log = open("/work/holder.log", "a")
log.write(f"started {os.getpid()} {digest}\n")
log.flush()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 8765))
srv.listen(8)
with open("/work/holder.ready", "w") as f:
    f.write(digest)
while True:
    conn, _ = srv.accept()
    with conn:
        conn.sendall(hashlib.sha256(data).hexdigest().encode())
