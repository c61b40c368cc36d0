"""A DNS server on 127.0.0.1:53 that knows one name: host.docker.internal is 127.0.0.1.

Stands in for the node's resolver in the `openhands-ai` app test: the app tells its sandbox to
post events to http://host.docker.internal:PORT (fixed in the app), and a sandbox on the host's
network resolves that name through the node, where a deployment would list it (on Linux, an
/etc/hosts line `127.0.0.1 host.docker.internal`, which docker copies into host-network
containers). The test's dockerd points its containers at 127.0.0.1 (`"dns"` in its daemon.json);
every other name gets NXDOMAIN, so no lookup leaves the machine. UDP only, A and AAAA, no EDNS.
Standard library only.
"""

from __future__ import annotations

import socket
import struct
import threading

NAME = "host.docker.internal"
A, AAAA, IN = 1, 28, 1


def question(msg: bytes) -> tuple[str, int, int, int] | None:
    """The first question's name, type and class, and where the question ends; None if malformed."""
    labels, i = [], 12
    while i < len(msg):
        n = msg[i]
        if n == 0:
            if i + 5 > len(msg):
                return None
            qtype, qclass = struct.unpack("!HH", msg[i + 1:i + 5])
            return ".".join(labels).lower(), qtype, qclass, i + 5
        if n & 0xC0:
            return None
        labels.append(msg[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    return None


def answer(msg: bytes) -> bytes | None:
    """The reply to query `msg`: 127.0.0.1 for NAME's A record, no record for its AAAA,
    NXDOMAIN for any other name."""
    if len(msg) < 12:
        return None
    (ident, flags, qdcount) = struct.unpack("!HHH", msg[:6])
    q = question(msg) if qdcount == 1 else None
    if q is None:
        return None
    name, qtype, qclass, end = q
    known = name == NAME and qclass == IN
    rcode = 0 if known else 3
    records = b""
    if known and qtype == A:
        # A pointer to the question's name, A, IN, TTL 60 s, 4 bytes of address.
        records = struct.pack("!HHHIH", 0xC00C, A, IN, 60, 4) + socket.inet_aton("127.0.0.1")
    reply_flags = 0x8000 | (flags & 0x0100) | 0x0080 | rcode  # QR, RD copied, RA, rcode
    header = struct.pack("!HHHHHH", ident, reply_flags, 1, 1 if records else 0, 0, 0)
    return header + msg[12:end] + records


def serve(asked: list[str]) -> socket.socket:
    """Answers on 127.0.0.1:53 (UDP) from a daemon thread, appending each name asked for to
    `asked`; the bound socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 53))

    def loop() -> None:
        while True:
            msg, peer = sock.recvfrom(512)
            q = question(msg) if len(msg) >= 12 else None
            if q is not None:
                asked.append(q[0])
            reply = answer(msg)
            if reply is not None:
                sock.sendto(reply, peer)

    threading.Thread(target=loop, daemon=True).start()
    return sock
