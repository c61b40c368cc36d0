"""``--kv-transfer-config '{"kv_connector": "BelayerConnector", "kv_connector_module_path":
"belayer_vllm.kv", "kv_role": "kv_both"}'``: places vLLM's KV cache buffer in the broker.

vLLM allocates the whole KV cache as one ``torch.zeros(n, dtype=int8)`` inside the connector's
``get_mem_pool_context()`` (``v1/worker/utils.py:allocate_kv_cache``), then cuts per-layer views
out of it. On the CPU there is no memory pool to hand torch, so the context answers exactly that
one allocation with the broker-backed buffer (:meth:`Session.kv_buffer`) and restores
``torch.zeros`` on exit (tested in tests/test_kv_context.py). The connector moves no KV itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from . import session as session_mod


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


class BelayerConnectorMetadata(KVConnectorMetadata):
    pass


class BelayerConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)

    # --- worker side ----------------------------------------------------------------------------
    def get_mem_pool_context(self):
        sess = session_mod.current()
        if sess is None:
            raise RuntimeError("belayer KV connector without a broker session: add --load-format belayer")
        return broker_kv_allocation(sess.kv_buffer)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None

    # --- scheduler side -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return BelayerConnectorMetadata()
