"""``--kv-transfer-config '{"kv_connector": "BelayerConnector", "kv_connector_module_path":
"belayer_vllm.kv", "kv_role": "kv_both", "kv_load_failure_policy": "recompute"}'``: places vLLM's
KV cache buffer in the broker, and after a takeover adopts the dead primary's checksummed KV
blocks instead of recomputing them (:mod:`belayer_vllm.kvreuse`).

vLLM allocates the whole KV cache as one ``torch.zeros(n, dtype=int8)`` inside the connector's
``get_mem_pool_context()`` (``v1/worker/utils.py:allocate_kv_cache``), then cuts per-layer views
out of it. On the CPU there is no memory pool to hand torch, so the context answers exactly that
one allocation with the broker-backed buffer (:meth:`Session.kv_buffer`) and restores
``torch.zeros`` on exit (tested in tests/test_kv_context.py).

KV reuse: the scheduler side answers ``get_num_new_matched_tokens`` from the adoption table the
promoted worker publishes, and passes (old block, new block, checksum) per request to the worker
side, whose ``start_load_kv`` verifies and copies each block before the forward pass; a block
whose checksum no longer matches is reported by ``get_block_ids_with_load_errors`` and vLLM
recomputes it (hence ``kv_load_failure_policy = "recompute"``, checked at start).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from . import kvreuse
from . import session as session_mod
from .config import PluginConfig

log = logging.getLogger("vllm.belayer")


def connector() -> "BelayerConnector | None":
    """This process's worker-side connector, if vLLM made one."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return None
    c = get_kv_transfer_group()
    return c if isinstance(c, BelayerConnector) else None


@contextlib.contextmanager
def broker_kv_allocation(provide) -> Iterator[None]:
    """While active, ``torch.zeros(n, dtype=torch.int8)`` (one 1-D int8 allocation: the KV
    buffer) returns ``provide(n)``; every other call goes to torch. Undone on exit."""
    original = torch.zeros
    used = []

    def zeros(*size: Any, **kw: Any):
        if not used and len(size) == 1 and isinstance(size[0], int) and kw.get("dtype") is torch.int8 and set(kw) <= {"dtype", "device"}:
            used.append(size[0])
            return provide(size[0])
        return original(*size, **kw)

    torch.zeros = zeros
    try:
        yield
    finally:
        torch.zeros = original


@dataclass
class BelayerConnectorMetadata(KVConnectorMetadata):
    loads: list[tuple[str, int, int, int, bytes]] = field(default_factory=list)
    """(request id, old block, new block, checksum, prefix hash) to verify and copy before
    this step."""


class BelayerConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        policy = getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", None)
        if policy != "recompute":
            raise ValueError(
                f'the belayer KV connector needs "kv_load_failure_policy": "recompute" in '
                f"--kv-transfer-config (it is {policy!r}): a reused KV block whose checksum no "
                "longer matches is recomputed, never used"
            )
        self.block_size = vllm_config.cache_config.block_size
        self.salt = kvreuse.salt_of(vllm_config)
        cfg = PluginConfig.from_vllm(vllm_config)
        self.table = kvreuse.Table(cfg.state_dir)
        self.pending: dict[str, list[tuple[int, int, int, bytes]]] = {}
        self.loads: list[tuple[str, int, int, int, bytes]] = []
        self.layers: list[torch.Tensor] = []
        self.invalid: set[int] = set()
        self.failed_reqs: set[str] = set()

    # --- worker side ----------------------------------------------------------------------------
    def get_mem_pool_context(self):
        sess = session_mod.current()
        if sess is None:
            raise RuntimeError("belayer KV connector without a broker session: add --load-format belayer")
        return broker_kv_allocation(sess.kv_buffer)

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layers = list(kv_caches.values())
        if kvreuse.layout_ok(layers):
            self.layers = layers
            sess = session_mod.current()
            if sess is not None and sess.holds_lease:
                sess.write_kv_layout()
        else:
            log.warning("belayer: KV layout is not one contiguous block-first tensor per layer; KV reuse off")

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        self.failed_reqs = set()
        meta = self._get_connector_metadata()
        if not isinstance(meta, BelayerConnectorMetadata) or not meta.loads:
            return None
        sess = session_mod.current()
        adoption = sess.adoption if sess is not None else None
        if adoption is not None and self.layers:
            done = adoption.load(self.layers, [x[1:] for x in meta.loads])
        else:
            done = [False] * len(meta.loads)
        for (req_id, _, new, _, _), ok in zip(meta.loads, done):
            if not ok:
                self.invalid.add(new)
                self.failed_reqs.add(req_id)
        if sess is not None:
            sess.adoption_progress()
        return None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self.invalid = self.invalid, set()
        return out

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    # --- scheduler side -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        tokens = request.prompt_token_ids
        if not tokens:
            return 0, False
        found = self.table.match(list(tokens), self.block_size, self.salt, num_computed_tokens)
        if not found:
            self.pending.pop(request.request_id, None)
            return 0, False
        self.pending[request.request_id] = found
        return len(found) * self.block_size, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        found = self.pending.pop(request.request_id, None)
        if not found or num_external_tokens <= 0:
            return None
        ids = blocks.get_block_ids()[0]
        n = num_external_tokens // self.block_size
        for k, old, checksum, prefix in found[:n]:
            self.loads.append((request.request_id, old, ids[k], checksum, prefix))
        return None

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = BelayerConnectorMetadata(self.loads)
        self.loads = []
        return meta
