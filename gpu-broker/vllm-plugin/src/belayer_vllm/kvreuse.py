"""KV reuse across a takeover: the dead primary's KV blocks, adopted instead of recomputed.

The lease holder records every full KV block it writes (:class:`Recorder`): the block's index, a
hash of every token up to the block's end (a chain over the blocks before it, salted with the
model, dtype and block size) and a checksum of the block's bytes in every layer. The broker keeps
the records, and, once the holder's death is confirmed (no writer left), keeps its KV pages out
of the pool for the successor.

The promoted shadow maps those pages read-only (:class:`Adoption`) and publishes the records'
prefix hashes for its scheduler (:func:`write_table`, a file beside the lease file: the scheduler
runs in vLLM's engine-core process, the pages in the worker). A resent request whose prompt
starts with recorded blocks is answered by the KV connector with those tokens as already
computed; before the forward pass, the worker checks each block's checksum against the old pages
and copies it into the block vLLM allocated, or reports it as a load error, and vLLM recomputes
from that block on (``kv_load_failure_policy = "recompute"``). A block is never used unchecked.

The block layout is vLLM's CPU one: every layer's cache is one contiguous tensor whose first
dimension is the block index (``[num_blocks, kv_heads, block_size, 2 * head_size]``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from .wire import KvBlock

log = logging.getLogger("vllm.belayer")

TABLE = "kv-adopt.json"
"""The adoptable prefixes, for the scheduler (in the lease file's directory)."""


def salt_of(vllm_config) -> bytes:
    """What a block's KV depends on besides its tokens: the same weights (one broker), and these."""
    m, c = vllm_config.model_config, vllm_config.cache_config
    return f"belayer-kv/1/{m.model}/{m.dtype}/{c.block_size}".encode()


def prefix_hashes(tokens: list[int], block_size: int, salt: bytes, start: bytes | None = None, first: int = 0) -> list[bytes]:
    """The chain hash after each full block of ``tokens`` from block ``first`` on (``start`` is
    the hash after block ``first - 1``; the salt's hash for block 0)."""
    h = start if start is not None else hashlib.blake2b(salt, digest_size=16).digest()
    out = []
    for k in range(first, len(tokens) // block_size):
        block = tokens[k * block_size : (k + 1) * block_size]
        h = hashlib.blake2b(h + struct.pack(f"<{block_size}I", *block), digest_size=16).digest()
        out.append(h)
    return out


def layout_ok(layers: list[torch.Tensor]) -> bool:
    """Whether every layer is one contiguous tensor indexed by block first, all with one count."""
    return bool(layers) and all(t.is_contiguous() and t.dim() >= 2 and t.shape[0] == layers[0].shape[0] for t in layers)


def block_checksum(layers: Iterable[torch.Tensor], block: int) -> int:
    """Checksum of one block's bytes in every layer, in layer order."""
    h = hashlib.blake2b(digest_size=8)
    for t in layers:
        h.update(t[block].view(torch.uint8).numpy().data)
    return int.from_bytes(h.digest(), "little")


@dataclass
class _Chain:
    blocks: list[int]
    """Block indices already recorded, in order."""
    last: bytes | None
    """Chain hash after the last recorded block."""


class Recorder:
    """The lease holder's side: the records of the blocks each step completed."""

    def __init__(self, block_size: int, salt: bytes) -> None:
        self.block_size = block_size
        self.salt = salt
        self.chains: dict[str, _Chain] = {}

    def forget(self, req_ids: Iterable[str]) -> None:
        for r in req_ids:
            self.chains.pop(r, None)

    def after_forward(self, requests: dict, scheduled: dict[str, int], layers: list[torch.Tensor]) -> list[KvBlock]:
        """Records for the blocks this forward pass filled. ``requests``: the model runner's
        request states (prompt and output token ids, block ids, computed tokens before this
        step); ``scheduled``: the tokens this step computed per request."""
        out: list[KvBlock] = []
        bs = self.block_size
        for req_id, n in scheduled.items():
            st = requests.get(req_id)
            if st is None or st.prompt_token_ids is None or not st.block_ids:
                continue
            ids = list(st.block_ids[0])
            full = min((st.num_computed_tokens + n) // bs, len(ids))
            ids = ids[:full]
            c = self.chains.get(req_id)
            if c is None or ids[: len(c.blocks)] != c.blocks:
                # New, or its blocks changed (preempted and resumed): record from the start.
                c = self.chains[req_id] = _Chain([], None)
            first = len(c.blocks)
            if full <= first:
                continue
            tokens = (list(st.prompt_token_ids) + list(st.output_token_ids))[: full * bs]
            if len(tokens) < full * bs:
                continue
            for k, h in enumerate(prefix_hashes(tokens, bs, self.salt, c.last, first), start=first):
                out.append(KvBlock(ids[k], h, block_checksum(layers, ids[k])))
                c.blocks.append(ids[k])
                c.last = h
        return out


def write_table(state_dir: str, epoch: int, blocks: list[KvBlock]) -> None:
    """Publishes the adoptable prefixes (prefix hash → block, checksum) for the scheduler."""
    path = os.path.join(state_dir, TABLE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"epoch": epoch, "blocks": {b.prefix.hex(): [b.block, b.checksum] for b in blocks}}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def remove_table(state_dir: str) -> None:
    try:
        os.unlink(os.path.join(state_dir, TABLE))
    except FileNotFoundError:
        pass


class Table:
    """The scheduler's side: the published prefixes, reread when the file changes."""

    def __init__(self, state_dir: str) -> None:
        self.path = os.path.join(state_dir, TABLE)
        self.key: tuple[int, int] | None = None
        self.blocks: dict[bytes, tuple[int, int]] = {}

    def current(self) -> dict[bytes, tuple[int, int]]:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self.key, self.blocks = None, {}
            return self.blocks
        key = (st.st_ino, st.st_mtime_ns)
        if key != self.key:
            try:
                with open(self.path) as f:
                    raw = json.load(f)["blocks"]
                self.blocks = {bytes.fromhex(k): (int(v[0]), int(v[1])) for k, v in raw.items()}
            except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
                log.warning("belayer: unreadable KV adoption table %s: %s; rebuilding by prefill", self.path, e)
                self.blocks = {}
            self.key = key
        return self.blocks

    def match(self, tokens: list[int], block_size: int, salt: bytes, computed: int) -> list[tuple[int, int, int, bytes]]:
        """(block position, old block, checksum, prefix hash) for the recorded blocks that
        continue the request's first ``computed`` tokens, leaving at least one token to
        compute. The file is a hint: the worker checks each against the broker's records."""
        blocks = self.current()
        if not blocks or computed % block_size:
            return []
        usable = (len(tokens) - 1) // block_size
        found = []
        for k, h in enumerate(prefix_hashes(tokens[: usable * block_size], block_size, salt)):
            if k < computed // block_size:
                continue
            hit = blocks.get(h)
            if hit is None:
                break
            found.append((k, hit[0], hit[1], h))
        return found


class Adoption:
    """The promoted shadow's read-only view of its dead predecessor's KV pages."""

    def __init__(self, fd: int, offset: int, length: int, kv_addr: int, layers: list[torch.Tensor], records: list[KvBlock]) -> None:
        self.records = {b.block: (b.prefix, b.checksum) for b in records}
        """The broker's records, by old block: what a load must name exactly."""
        self.map = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=offset)
        base = torch.frombuffer(self.map, dtype=torch.uint8)
        self.old: list[torch.Tensor] = []
        for t in layers:
            off = t.data_ptr() - kv_addr
            nbytes = t.numel() * t.element_size()
            if off < 0 or off + nbytes > length:
                raise ValueError(f"a KV layer at offset {off} is outside the {length}-byte buffer")
            self.old.append(base[off : off + nbytes].view(t.dtype).view(t.shape))
        self.adopted = 0
        self.refused = 0
        self.pool: ThreadPoolExecutor | None = None

    def _load(self, layers: list[torch.Tensor], old_block: int, new_block: int, checksum: int, prefix: bytes) -> bool:
        if self.records.get(old_block) != (prefix, checksum):
            return False
        try:
            ok = 0 <= old_block < self.old[0].shape[0] and 0 <= new_block < layers[0].shape[0]
            if ok and block_checksum(self.old, old_block) == checksum:
                for dst, src in zip(layers, self.old):
                    dst[new_block].copy_(src[old_block])
                return True
        except (RuntimeError, ValueError, IndexError) as e:
            log.warning("belayer: adopting KV block %d into %d failed: %s", old_block, new_block, e)
        return False

    def load(self, layers: list[torch.Tensor], loads: list[tuple[int, int, int, bytes]]) -> list[bool]:
        """Copies each (old block, new block, checksum, prefix hash) that the broker recorded
        so and whose bytes still match the checksum; anything else (an unrecorded pairing, a
        changed block, an index outside the cache, a failed copy) is refused. The checks
        run on a few threads (hashing and copying release the GIL; the forward pass waits)."""
        if len(loads) > 1:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="belayer-kv")
            done = list(self.pool.map(lambda x: self._load(layers, *x), loads))
        else:
            done = [self._load(layers, *x) for x in loads]
        n = sum(done)
        self.adopted += n
        self.refused += len(done) - n
        return done

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.old = []
        try:
            self.map.close()
        except BufferError:
            # A tensor view still holds the buffer; the mapping goes with the process.
            pass
