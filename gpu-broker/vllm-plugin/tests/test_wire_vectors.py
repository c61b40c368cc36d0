"""The Python codec against the Rust one: the same frames (written by gpu-broker/tests/wire_vectors.rs)
must encode from, and decode to, the same messages."""

from pathlib import Path

import pytest

from belayer_vllm import wire as w

VECTORS = Path(__file__).parent / "vectors"

P = w.SamplingParams(0.7, 40, 0x0123456789ABCDEF, 256)

MESSAGES = {
    "hello-shadow": w.Hello(w.Role.SHADOW, 0x1122334455667788),
    "hello-operator": w.Hello(w.Role.OPERATOR, 0),
    "hello-ok": w.HelloOk(2**64 - 1, 7, 3, 4242),
    "manifest-req": w.ManifestReq(),
    "manifest": w.Manifest([
        w.RegionInfo(w.RegionKind.WEIGHTS, 270_000_128, 0xFEED, 0xDEADBEEFCAFEF00D, True, 0, b"Z\x00layout"),
        w.RegionInfo(w.RegionKind.KV, 1 << 30, 0, 0, False, 2 << 20, b""),
    ]),
    "acquire": w.Acquire(2 << 20, 256),
    "grant": w.Grant(2, 3000, [(0, 256), (300, 4)], False, True),
    "alloc-weights": w.AllocWeights(1, 9, 4096),
    "publish": w.Publish(1, 9, 0x0102030405060708, bytes([0, 1, 2, 255])),
    "heartbeat": w.Heartbeat(5),
    "admit": w.Admit(1, 0xABCDEF, P, 0, [1, 9690, 198, 49151]),
    "commit": w.Commit(4, [w.CommitEntry(1, 0, [7042, 30], 0, False), w.CommitEntry(2, 17, [], 99, True)]),
    "log-list": w.LogList(),
    "log-ids": w.LogIds([(1, False), (2**64 - 1, True)]),
    "log-get": w.LogGet(77),
    "log-entry": w.LogEntry(w.RequestLog(77, w.SamplingParams(0.0, 0, 0, 64), [1, 2, 3], [4, 5], 12, False)),
    "release": w.Release(8),
    "fence": w.Fence(),
    "ok": w.Ok(9),
    "status-req": w.StatusReq(),
    "status-reply": w.StatusReply(w.Status(1, 2, 3, 4, True, 5, 6, 7, 8, 9, 10)),
    "kv-note": w.KvNote(6, [w.KvBlock(1, b"0123456789abcdef", 0x0102030405060708), w.KvBlock(2**32 - 1, b"\xff" * 16, 2**64 - 1)]),
    "kv-adopt-req": w.KvAdoptReq(6, 300),
    "kv-adoptable": w.KvAdoptable(2 << 20, [(0, 128)], [w.KvBlock(300, bytes(16), 42)], True),
    "kv-adopt-done": w.KvAdoptDone(6),
    "error": w.Error(w.ErrorCode.BROKER_RESTARTED, "broker restarted: instance ä → ü"),
}


def _same(a, b) -> bool:
    # f32 fields: compare what travels (the bits), not the Python float.
    if isinstance(a, w.SamplingParams):
        return w.encode(w.LogEntry(w.RequestLog(0, a, [], [], 0, False))) == w.encode(w.LogEntry(w.RequestLog(0, b, [], [], 0, False)))
    return a == b


def test_every_vector_file_has_a_message():
    files = {p.stem for p in VECTORS.glob("*.bin") if not p.stem.startswith("bad-")}
    assert files == set(MESSAGES), "vector files and Python messages differ"


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_encode_matches_rust(name):
    assert w.encode(MESSAGES[name]) == (VECTORS / f"{name}.bin").read_bytes()


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_decode_matches_rust(name):
    got = w.decode((VECTORS / f"{name}.bin").read_bytes())
    want = MESSAGES[name]
    assert type(got) is type(want)
    if isinstance(want, w.Admit):
        assert got.prompt == want.prompt and _same(got.params, want.params)
    else:
        assert got == want


@pytest.mark.parametrize("path", sorted(VECTORS.glob("bad-*.bin")), ids=lambda p: p.stem)
def test_refuses_what_rust_refuses(path):
    with pytest.raises(w.DecodeError):
        w.decode(path.read_bytes())


def test_bad_vectors_exist():
    assert len(list(VECTORS.glob("bad-*.bin"))) >= 10
