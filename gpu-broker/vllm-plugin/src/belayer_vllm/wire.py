"""The broker's wire protocol (gpu-broker/src/wire.rs, wire/codec.rs) in Python.

One message per SOCK_SEQPACKET packet: magic ``BLGB``, version u16 (= 1), kind u16, body length
u32, then the little-endian body. Every bound the Rust decoder checks is checked here too; the two
codecs are held together by the shared vectors in ``tests/vectors`` (gpu-broker/tests/wire_vectors.rs
writes and reads the same files).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum

MAGIC = b"BLGB"
VERSION = 1
MAX_FRAME = 64 * 1024
HEADER_LEN = 12
MAX_TOKENS = 12 * 1024
MAX_META = 48 * 1024
MAX_LIST = 4096
MAX_TEXT = 4096
MAX_REGIONS = 8
MAX_KV_BLOCKS = 2048


class DecodeError(ValueError):
    """A frame that the broker's decoder would refuse too."""


class Role(IntEnum):
    PRIMARY = 0
    SHADOW = 1
    OBSERVER = 2
    OPERATOR = 3


class RegionKind(IntEnum):
    WEIGHTS = 0
    KV = 1


class ErrorCode(IntEnum):
    STALE_EPOCH = 1
    NOT_PRIMARY = 2
    BROKER_RESTARTED = 3
    BAD_REQUEST = 4
    NO_CAPACITY = 5
    BACKEND = 6
    FORBIDDEN = 7


@dataclass(frozen=True)
class SamplingParams:
    temperature: float  # 0 = greedy; carried as f32 bits
    top_k: int
    seed: int
    max_new_tokens: int


@dataclass(frozen=True)
class RegionInfo:
    kind: RegionKind
    bytes: int
    version: int
    checksum: int
    published: bool
    page_bytes: int
    meta: bytes


@dataclass(frozen=True)
class CommitEntry:
    request_id: int
    pos: int
    tokens: list[int]
    sampler_state: int
    finished: bool


@dataclass(frozen=True)
class KvBlock:
    """A full KV block the lease holder wrote (gpu-broker/src/wire.rs ``KvBlock``)."""

    block: int
    prefix: bytes  # 16 bytes: hash of every token up to the block's end
    checksum: int


@dataclass(frozen=True)
class RequestLog:
    request_id: int
    params: SamplingParams
    prompt: list[int]
    generated: list[int]
    sampler_state: int
    finished: bool


@dataclass(frozen=True)
class Status:
    instance: int = 0
    epoch: int = 0
    primary_pid: int = 0
    shadows_waiting: int = 0
    weights_ready: bool = False
    takeovers: int = 0
    weights_refused: int = 0
    requests: int = 0
    inflight: int = 0
    last_health_us: int = 0
    kv_free_pages: int = 0


# --- messages (kind numbers as in codec.rs msg_kind) ---------------------------------------------


@dataclass(frozen=True)
class Hello:
    role: Role
    known_instance: int = 0
    KIND = 1


@dataclass(frozen=True)
class HelloOk:
    instance: int
    worker_id: int
    epoch: int
    pid: int
    KIND = 2


@dataclass(frozen=True)
class ManifestReq:
    KIND = 3


@dataclass(frozen=True)
class Manifest:
    regions: list[RegionInfo]
    KIND = 4


@dataclass(frozen=True)
class Acquire:
    page_bytes: int
    pages: int
    KIND = 5


@dataclass(frozen=True)
class Grant:
    epoch: int
    lease_ms: int
    pages: list[tuple[int, int]]
    weights_ok: bool
    takeover: bool
    KIND = 6


@dataclass(frozen=True)
class AllocWeights:
    epoch: int
    version: int
    bytes: int
    KIND = 7


@dataclass(frozen=True)
class Publish:
    epoch: int
    version: int
    checksum: int
    meta: bytes
    KIND = 8


@dataclass(frozen=True)
class Heartbeat:
    epoch: int
    KIND = 9


@dataclass(frozen=True)
class Admit:
    epoch: int
    request_id: int
    params: SamplingParams
    sampler_state: int
    prompt: list[int]
    KIND = 10


@dataclass(frozen=True)
class Commit:
    epoch: int
    entries: list[CommitEntry]
    KIND = 11


@dataclass(frozen=True)
class LogList:
    KIND = 12


@dataclass(frozen=True)
class LogIds:
    ids: list[tuple[int, bool]]
    KIND = 13


@dataclass(frozen=True)
class LogGet:
    request_id: int
    KIND = 14


@dataclass(frozen=True)
class LogEntry:
    log: RequestLog
    KIND = 15


@dataclass(frozen=True)
class Release:
    epoch: int
    KIND = 16


@dataclass(frozen=True)
class Fence:
    KIND = 17


@dataclass(frozen=True)
class Ok:
    epoch: int
    KIND = 18


@dataclass(frozen=True)
class StatusReq:
    KIND = 19


@dataclass(frozen=True)
class StatusReply:
    status: Status
    KIND = 20


@dataclass(frozen=True)
class Error:
    code: ErrorCode
    message: str
    KIND = 21


@dataclass(frozen=True)
class KvNote:
    epoch: int
    blocks: list[KvBlock]
    KIND = 22


@dataclass(frozen=True)
class KvAdoptReq:
    epoch: int
    start: int  # Rust's `from`
    KIND = 23


@dataclass(frozen=True)
class KvAdoptable:
    page_bytes: int
    pages: list[tuple[int, int]]
    blocks: list[KvBlock]
    more: bool
    KIND = 24


@dataclass(frozen=True)
class KvAdoptDone:
    epoch: int
    KIND = 25


Msg = (
    Hello | HelloOk | ManifestReq | Manifest | Acquire | Grant | AllocWeights | Publish | Heartbeat
    | Admit | Commit | LogList | LogIds | LogGet | LogEntry | Release | Fence | Ok | StatusReq
    | StatusReply | Error | KvNote | KvAdoptReq | KvAdoptable | KvAdoptDone
)

# --- encoding ---------------------------------------------------------------------------------


class _Enc:
    def __init__(self) -> None:
        self.b = bytearray()

    def u8(self, v: int) -> None:
        self.b += struct.pack("<B", v)

    def bool(self, v: bool) -> None:
        self.u8(1 if v else 0)

    def u16(self, v: int) -> None:
        self.b += struct.pack("<H", v)

    def u32(self, v: int) -> None:
        self.b += struct.pack("<I", v)

    def u64(self, v: int) -> None:
        self.b += struct.pack("<Q", v)

    def bytes_(self, v: bytes) -> None:
        self.u32(len(v))
        self.b += v

    def tokens(self, t: list[int]) -> None:
        self.u32(len(t))
        self.b += struct.pack(f"<{len(t)}I", *t)

    def params(self, p: SamplingParams) -> None:
        self.b += struct.pack("<fIQI", p.temperature, p.top_k, p.seed, p.max_new_tokens)

    def runs(self, runs: list[tuple[int, int]]) -> None:
        self.u32(len(runs))
        for a, n in runs:
            self.u32(a)
            self.u32(n)

    def kv_blocks(self, blocks: list[KvBlock]) -> None:
        self.u32(len(blocks))
        for b in blocks:
            if len(b.prefix) != 16:
                raise ValueError(f"KV block prefix of {len(b.prefix)} bytes, not 16")
            self.b += struct.pack("<I", b.block) + b.prefix + struct.pack("<Q", b.checksum)


def encode(m: Msg) -> bytes:
    """One frame for ``m`` (the caller checks ``len(frame) <= MAX_FRAME``, as the Rust sender does)."""
    e = _Enc()
    _body(e, m)
    return MAGIC + struct.pack("<HHI", VERSION, m.KIND, len(e.b)) + bytes(e.b)


def _body(e: _Enc, m: Msg) -> None:
    match m:
        case Hello(role, known):
            e.u8(int(role))
            e.u64(known)
        case HelloOk(instance, worker_id, epoch, pid):
            e.u64(instance)
            e.u32(worker_id)
            e.u64(epoch)
            e.u32(pid)
        case ManifestReq() | LogList() | Fence() | StatusReq():
            pass
        case Manifest(regions):
            e.u32(len(regions))
            for r in regions:
                e.u8(int(r.kind))
                e.u64(r.bytes)
                e.u64(r.version)
                e.u64(r.checksum)
                e.bool(r.published)
                e.u64(r.page_bytes)
                e.bytes_(r.meta)
        case Acquire(page_bytes, pages):
            e.u64(page_bytes)
            e.u32(pages)
        case Grant(epoch, lease_ms, pages, weights_ok, takeover):
            e.u64(epoch)
            e.u32(lease_ms)
            e.runs(pages)
            e.bool(weights_ok)
            e.bool(takeover)
        case AllocWeights(epoch, version, nbytes):
            e.u64(epoch)
            e.u64(version)
            e.u64(nbytes)
        case Publish(epoch, version, checksum, meta):
            e.u64(epoch)
            e.u64(version)
            e.u64(checksum)
            e.bytes_(meta)
        case Heartbeat(epoch) | Release(epoch) | Ok(epoch) | KvAdoptDone(epoch):
            e.u64(epoch)
        case KvNote(epoch, blocks):
            e.u64(epoch)
            e.kv_blocks(blocks)
        case KvAdoptReq(epoch, start):
            e.u64(epoch)
            e.u32(start)
        case KvAdoptable(page_bytes, pages, blocks, more):
            e.u64(page_bytes)
            e.runs(pages)
            e.kv_blocks(blocks)
            e.bool(more)
        case Admit(epoch, request_id, params, sampler_state, prompt):
            e.u64(epoch)
            e.u64(request_id)
            e.params(params)
            e.u64(sampler_state)
            e.tokens(prompt)
        case Commit(epoch, entries):
            e.u64(epoch)
            e.u32(len(entries))
            for c in entries:
                e.u64(c.request_id)
                e.u32(c.pos)
                e.tokens(c.tokens)
                e.u64(c.sampler_state)
                e.bool(c.finished)
        case LogIds(ids):
            e.u32(len(ids))
            for rid, fin in ids:
                e.u64(rid)
                e.bool(fin)
        case LogGet(request_id):
            e.u64(request_id)
        case LogEntry(log):
            e.u64(log.request_id)
            e.params(log.params)
            e.tokens(log.prompt)
            e.tokens(log.generated)
            e.u64(log.sampler_state)
            e.bool(log.finished)
        case StatusReply(s):
            e.u64(s.instance)
            e.u64(s.epoch)
            e.u32(s.primary_pid)
            e.u32(s.shadows_waiting)
            e.bool(s.weights_ready)
            e.u32(s.takeovers)
            e.u32(s.weights_refused)
            e.u32(s.requests)
            e.u32(s.inflight)
            e.u64(s.last_health_us)
            e.u32(s.kv_free_pages)
        case Error(code, message):
            e.u16(int(code))
            raw = message.encode()[:MAX_TEXT]
            # Cut at a character boundary, as the Rust encoder does.
            while raw:
                try:
                    raw.decode()
                    break
                except UnicodeDecodeError:
                    raw = raw[:-1]
            e.bytes_(raw)
        case _:
            raise TypeError(f"not a broker message: {m!r}")


# --- decoding ---------------------------------------------------------------------------------


class _Dec:
    def __init__(self, b: bytes) -> None:
        self.b = memoryview(b)
        self.i = 0

    def take(self, n: int, what: str) -> bytes:
        if len(self.b) - self.i < n:
            raise DecodeError(f"body truncated while reading {what}")
        v = bytes(self.b[self.i : self.i + n])
        self.i += n
        return v

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def bool(self, what: str) -> bool:
        v = self.u8(what)
        if v > 1:
            raise DecodeError(f"field {what} is out of range")
        return v == 1

    def u16(self, what: str) -> int:
        return struct.unpack("<H", self.take(2, what))[0]

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack("<Q", self.take(8, what))[0]

    def length(self, bound: int, what: str) -> int:
        n = self.u32(what)
        if n > bound:
            raise DecodeError(f"field {what} is out of range")
        return n

    def bytes_(self, bound: int, what: str) -> bytes:
        return self.take(self.length(bound, what), what)

    def tokens(self, what: str) -> list[int]:
        n = self.length(MAX_TOKENS, what)
        return list(struct.unpack(f"<{n}I", self.take(4 * n, what)))

    def params(self) -> SamplingParams:
        t = struct.unpack("<f", self.take(4, "temperature"))[0]
        if t != t or t in (float("inf"), float("-inf")) or t < 0:
            raise DecodeError("field temperature is out of range")
        return SamplingParams(t, self.u32("top_k"), self.u64("seed"), self.u32("max_new_tokens"))

    def runs(self) -> list[tuple[int, int]]:
        return [(self.u32("page run"), self.u32("page run")) for _ in range(self.length(MAX_LIST, "pages"))]

    def kv_blocks(self) -> list[KvBlock]:
        out = []
        for _ in range(self.length(MAX_KV_BLOCKS, "kv blocks")):
            block = self.u32("kv block")
            prefix = self.take(16, "kv block prefix")
            out.append(KvBlock(block, prefix, self.u64("kv block checksum")))
        return out

    def enum(self, cls, v: int, what: str):
        try:
            return cls(v)
        except ValueError:
            raise DecodeError(f"field {what} is out of range") from None


def decode(frame: bytes) -> Msg:
    """Decodes one frame; raises :class:`DecodeError` exactly where the Rust decoder refuses."""
    if len(frame) > MAX_FRAME:
        raise DecodeError(f"frame of {len(frame)} bytes exceeds the {MAX_FRAME}-byte bound")
    if len(frame) < HEADER_LEN:
        raise DecodeError(f"frame of {len(frame)} bytes is shorter than the header")
    if frame[:4] != MAGIC:
        raise DecodeError(f"bad magic {frame[:4]!r}")
    version, kind, declared = struct.unpack("<HHI", frame[4:12])
    if version != VERSION:
        raise DecodeError(f"protocol version {version} is not supported (this side speaks {VERSION})")
    if declared != len(frame) - HEADER_LEN:
        raise DecodeError(f"header says {declared} body bytes, frame has {len(frame) - HEADER_LEN}")
    d = _Dec(frame[HEADER_LEN:])
    m = _decode_body(d, kind)
    if d.i != len(d.b):
        raise DecodeError(f"{len(d.b) - d.i} trailing bytes after the message")
    return m


def _decode_body(d: _Dec, kind: int) -> Msg:
    if kind == 1:
        return Hello(d.enum(Role, d.u8("role"), "role"), d.u64("known_instance"))
    if kind == 2:
        return HelloOk(d.u64("instance"), d.u32("worker_id"), d.u64("epoch"), d.u32("pid"))
    if kind == 3:
        return ManifestReq()
    if kind == 4:
        regions = []
        for _ in range(d.length(MAX_REGIONS, "regions")):
            regions.append(
                RegionInfo(
                    d.enum(RegionKind, d.u8("region kind"), "region kind"),
                    d.u64("bytes"),
                    d.u64("version"),
                    d.u64("checksum"),
                    d.bool("published"),
                    d.u64("page_bytes"),
                    d.bytes_(MAX_META, "meta"),
                )
            )
        return Manifest(regions)
    if kind == 5:
        return Acquire(d.u64("page_bytes"), d.u32("pages"))
    if kind == 6:
        epoch, lease_ms = d.u64("epoch"), d.u32("lease_ms")
        return Grant(epoch, lease_ms, d.runs(), d.bool("weights_ok"), d.bool("takeover"))
    if kind == 7:
        return AllocWeights(d.u64("epoch"), d.u64("version"), d.u64("bytes"))
    if kind == 8:
        return Publish(d.u64("epoch"), d.u64("version"), d.u64("checksum"), d.bytes_(MAX_META, "meta"))
    if kind == 9:
        return Heartbeat(d.u64("epoch"))
    if kind == 10:
        return Admit(d.u64("epoch"), d.u64("request_id"), d.params(), d.u64("sampler_state"), d.tokens("prompt"))
    if kind == 11:
        epoch = d.u64("epoch")
        entries = []
        for _ in range(d.length(MAX_LIST, "entries")):
            entries.append(
                CommitEntry(d.u64("request_id"), d.u32("pos"), d.tokens("tokens"), d.u64("sampler_state"), d.bool("finished"))
            )
        return Commit(epoch, entries)
    if kind == 12:
        return LogList()
    if kind == 13:
        return LogIds([(d.u64("id"), d.bool("finished")) for _ in range(d.length(MAX_LIST, "ids"))])
    if kind == 14:
        return LogGet(d.u64("request_id"))
    if kind == 15:
        return LogEntry(
            RequestLog(d.u64("request_id"), d.params(), d.tokens("prompt"), d.tokens("generated"), d.u64("sampler_state"), d.bool("finished"))
        )
    if kind == 16:
        return Release(d.u64("epoch"))
    if kind == 17:
        return Fence()
    if kind == 18:
        return Ok(d.u64("epoch"))
    if kind == 19:
        return StatusReq()
    if kind == 20:
        return StatusReply(
            Status(
                d.u64("instance"), d.u64("epoch"), d.u32("primary_pid"), d.u32("shadows_waiting"),
                d.bool("weights_ready"), d.u32("takeovers"), d.u32("weights_refused"), d.u32("requests"),
                d.u32("inflight"), d.u64("last_health_us"), d.u32("kv_free_pages"),
            )
        )
    if kind == 21:
        code = d.enum(ErrorCode, d.u16("error code"), "error code")
        raw = d.bytes_(MAX_TEXT, "message")
        try:
            return Error(code, raw.decode())
        except UnicodeDecodeError:
            raise DecodeError("field message is out of range") from None
    if kind == 22:
        return KvNote(d.u64("epoch"), d.kv_blocks())
    if kind == 23:
        return KvAdoptReq(d.u64("epoch"), d.u32("from"))
    if kind == 24:
        return KvAdoptable(d.u64("page_bytes"), d.runs(), d.kv_blocks(), d.bool("more"))
    if kind == 25:
        return KvAdoptDone(d.u64("epoch"))
    raise DecodeError(f"unknown message kind {kind}")
