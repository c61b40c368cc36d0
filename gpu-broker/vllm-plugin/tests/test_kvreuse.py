"""KV reuse's pure parts against real tensors and a real shared mapping: the prefix chain, the
records a step makes, the scheduler's match, and the checked copy (a changed block is refused)."""

import mmap
import os
from dataclasses import dataclass, field

import torch

from belayer_vllm import kvreuse
from belayer_vllm.wire import KvBlock

BS = 4
SALT = b"test-salt"


@dataclass
class State:
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)


def layers_over(buf: mmap.mmap, n_layers=3, blocks=8, shape=(2, BS, 6)) -> list[torch.Tensor]:
    """Per-layer block-first views cut from one buffer, as vLLM's CPU allocation does."""
    base = torch.frombuffer(buf, dtype=torch.uint8)
    per = blocks * shape[0] * shape[1] * shape[2] * 4
    return [base[i * per : (i + 1) * per].view(torch.float32).view(blocks, *shape) for i in range(n_layers)]


def test_the_chain_depends_on_every_earlier_token_and_the_salt():
    toks = list(range(13))
    h = kvreuse.prefix_hashes(toks, BS, SALT)
    assert len(h) == 3 and len(set(h)) == 3 and all(len(x) == 16 for x in h)
    changed = toks.copy()
    changed[0] = 99
    h2 = kvreuse.prefix_hashes(changed, BS, SALT)
    assert all(a != b for a, b in zip(h, h2))
    assert kvreuse.prefix_hashes(toks, BS, b"other")[0] != h[0]
    # Resuming the chain from a block gives the same hashes.
    assert kvreuse.prefix_hashes(toks, BS, SALT, h[0], 1) == h[1:]


def test_a_step_records_the_blocks_it_filled_once():
    buf = mmap.mmap(-1, 3 * 8 * 2 * BS * 6 * 4)
    layers = layers_over(buf)
    for i, t in enumerate(layers):
        t.copy_(torch.randn(t.shape) + i)
    rec = kvreuse.Recorder(BS, SALT)
    st = State(list(range(10)), ([5, 2, 7],), 0)
    # Prefill of 10 tokens: two full blocks (5, 2).
    got = rec.after_forward({"r": st}, {"r": 10}, layers)
    assert [b.block for b in got] == [5, 2]
    want = kvreuse.prefix_hashes(list(range(10)), BS, SALT)
    assert [b.prefix for b in got] == want
    assert got[0].checksum == kvreuse.block_checksum(layers, 5)
    # Decode steps: tokens 10, 11 fill block 7 at the step that computes position 11.
    st.num_computed_tokens, st.output_token_ids = 10, [42]
    assert rec.after_forward({"r": st}, {"r": 1}, layers) == []
    st.num_computed_tokens, st.output_token_ids = 11, [42, 43]
    got = rec.after_forward({"r": st}, {"r": 1}, layers)
    assert [b.block for b in got] == [7]
    assert got[0].prefix == kvreuse.prefix_hashes(list(range(10)) + [42, 43], BS, SALT)[2]
    # Blocks replaced (preempted, resumed elsewhere): recorded again under the new indices.
    st.block_ids = ([1, 3, 4],)
    assert [b.block for b in rec.after_forward({"r": st}, {"r": 1}, layers)] == [1, 3, 4]
    # Fewer blocks than computed tokens would fill: only those recorded, nothing raised.
    rec.forget(["r"])
    st.block_ids = ([1],)
    assert [b.block for b in rec.after_forward({"r": st}, {"r": 1}, layers)] == [1]


def test_the_scheduler_matches_leading_recorded_blocks_and_leaves_a_token(tmp_path):
    toks = list(range(12))
    h = kvreuse.prefix_hashes(toks, BS, SALT)
    kvreuse.write_table(str(tmp_path), 3, [KvBlock(9, h[0], 1), KvBlock(8, h[1], 2), KvBlock(6, h[2], 3)])
    t = kvreuse.Table(str(tmp_path))
    # 12 tokens: at most 2 blocks, one token must be computed.
    assert t.match(toks, BS, SALT, 0) == [(0, 9, 1, h[0]), (1, 8, 2, h[1])]
    assert t.match(toks + [1], BS, SALT, 0) == [(0, 9, 1, h[0]), (1, 8, 2, h[1]), (2, 6, 3, h[2])]
    # Locally cached first block: continue from the second.
    assert t.match(toks + [1], BS, SALT, BS) == [(1, 8, 2, h[1]), (2, 6, 3, h[2])]
    # A different token in block 1 ends the match there.
    other = toks.copy()
    other[5] = 77
    assert t.match(other + [1], BS, SALT, 0) == [(0, 9, 1, h[0])]
    assert t.match(toks, BS, b"other", 0) == []
    kvreuse.remove_table(str(tmp_path))
    assert t.match(toks + [1], BS, SALT, 0) == []


def test_a_block_is_copied_only_if_its_checksum_still_matches():
    used = 3 * 8 * 2 * BS * 6 * 4
    size = -(-used // mmap.PAGESIZE) * mmap.PAGESIZE
    fd = os.memfd_create("kv-test")
    os.ftruncate(fd, 2 * size)
    old_map = mmap.mmap(fd, size, offset=size)
    old = layers_over(old_map)
    for i, t in enumerate(old):
        t.copy_(torch.randn(t.shape) * (i + 1))
    sums = {b: kvreuse.block_checksum(old, b) for b in range(8)}
    new_map = mmap.mmap(fd, size)
    live = layers_over(new_map)
    kv_addr = live[0].data_ptr()
    # The successor's view of the old pages: same offsets, read-only; the broker's records.
    pre = {b: bytes([b]) * 16 for b in range(8)}
    a = kvreuse.Adoption(fd, size, size, kv_addr, live, [KvBlock(b, pre[b], sums[b]) for b in range(8)])
    assert a.load(live, [(3, 6, sums[3], pre[3])]) == [True]
    assert all(torch.equal(n[6], o[3]) for n, o in zip(live, old))
    # One byte of block 4 in the last layer changes: refused, nothing copied.
    old_map[used - (8 - 4) * 2 * BS * 6 * 4] ^= 0xFF
    before = [n[1].clone() for n in live]
    assert a.load(live, [(4, 1, sums[4], pre[4])]) == [False]
    assert all(torch.equal(n[1], b) for n, b in zip(live, before))
    assert a.load(live, [(99, 1, 0, pre[3])]) == [False], "a block index beyond the cache is refused"
    assert a.load(live, [(3, 99, sums[3], pre[3])]) == [False], "so is a destination beyond it"
    # A pairing the broker did not record (a forged adoption table) is refused, intact or not.
    assert a.load(live, [(3, 1, sums[3], pre[5])]) == [False]
    assert a.load(live, [(3, 1, sums[5], pre[3])]) == [False]
    # Several at once (checked on threads): each judged on its own.
    loads = [(0, 2, sums[0], pre[0]), (4, 3, sums[4], pre[4]), (5, 4, sums[5], pre[5])]
    assert a.load(live, loads) == [True, False, True]
    assert torch.equal(live[2][4], old[2][5])
    assert (a.adopted, a.refused) == (3, 6)
    a.close()
    os.close(fd)
