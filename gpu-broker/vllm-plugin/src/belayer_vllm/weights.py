"""``--load-format belayer``: the model's parameters live in the broker's weights region.

The first vLLM on a broker loads the checkpoint as vLLM always does, writes every parameter into a
region it asks the broker for, has the broker checksum and seal it, and then points its own
parameters at that region. Every later vLLM maps the published region read-only and points its
parameters at it: no model file is read. On the CPU, linear layers are marked
``_cpu_skip_gemm_dispatch`` so vLLM computes from these tensors in place instead of repacking them
into private memory.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import mmap
import os
import shutil
import subprocess
import time
import warnings
import zlib

import torch
from torch import nn

from vllm.config import ModelConfig, VllmConfig
from vllm.model_executor.layers.linear import LinearBase
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

from . import session as session_mod
from .client import BrokerError, Region
from .config import PluginConfig
from .wire import RegionKind, Role

log = logging.getLogger("vllm.belayer")

LAYOUT_FORMAT = "belayer-vllm-weights-1"
ALIGN = 4096


def weight_version(model_config: ModelConfig) -> int:
    key = f"{model_config.model}|{model_config.revision}|{model_config.dtype}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1


def layout_of(model: nn.Module) -> tuple[list[dict], int]:
    tensors, off = [], 0
    for name, p in model.named_parameters():
        nbytes = p.numel() * p.element_size()
        tensors.append({"name": name, "dtype": str(p.dtype).removeprefix("torch."), "shape": list(p.shape), "offset": off, "bytes": nbytes})
        off += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return tensors, max(off, ALIGN)


def encode_layout(tensors: list[dict], model_config: ModelConfig) -> bytes:
    raw = json.dumps({"format": LAYOUT_FORMAT, "model": model_config.model, "tensors": tensors}, separators=(",", ":")).encode()
    return b"Z" + zlib.compress(raw, 9)


def decode_layout(meta: bytes) -> list[dict]:
    if not meta.startswith(b"Z"):
        raise ValueError("weights layout is not a belayer-vllm layout")
    d = json.loads(zlib.decompress(meta[1:]))
    if d.get("format") != LAYOUT_FORMAT:
        raise ValueError(f"weights layout format {d.get('format')!r}, expected {LAYOUT_FORMAT}")
    return d["tensors"]


def region_checksum(cfg: PluginConfig, fd: int) -> int:
    """The broker's own checksum, run as its program on ``fd``."""
    exe = shutil.which(cfg.checksum_bin) or cfg.checksum_bin
    os.lseek(fd, 0, os.SEEK_SET)
    out = subprocess.run([exe, str(fd)], pass_fds=(fd,), check=True, capture_output=True, text=True)
    return int(out.stdout.strip(), 16)


def mark_in_place(model: nn.Module) -> None:
    """CPU linear layers compute from ``layer.weight`` as it is (no repack into private memory)."""
    for m in model.modules():
        if isinstance(m, LinearBase):
            m._cpu_skip_gemm_dispatch = True


def attach(model: nn.Module, region: Region) -> int:
    """Points every parameter at the (read-only) weights region; returns how many."""
    tensors = decode_layout(region.info.meta)
    params = dict(model.named_parameters())
    names = {t["name"] for t in tensors}
    if names != set(params):
        raise ValueError(f"weights region holds {len(names)} tensors, the model has {len(params)} (missing {sorted(set(params) - names)[:3]})")
    mm = mmap.mmap(region.fd, region.info.bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # frombuffer warns that the mapping is read-only: it is meant to be
        for t in tensors:
            p = params[t["name"]]
            dtype = getattr(torch, t["dtype"])
            if list(p.shape) != t["shape"] or p.dtype != dtype:
                raise ValueError(f"{t['name']}: region has {t['dtype']}{t['shape']}, model wants {p.dtype}{list(p.shape)}")
            p.data = torch.frombuffer(mm, dtype=dtype, count=p.numel(), offset=t["offset"]).view(p.shape)
    return len(tensors)


def publish(sess: session_mod.Session, model: nn.Module, model_config: ModelConfig) -> None:
    """Writes the loaded parameters into a new broker region, publishes it and attaches to it."""
    tensors, total = layout_of(model)
    version = weight_version(model_config)
    region = sess.client.alloc_weights(version, total)
    params = dict(model.named_parameters())
    try:
        for t in tensors:
            raw = params[t["name"]].data.contiguous().view(torch.uint8).numpy().tobytes()
            os.pwrite(region.fd, raw, t["offset"])
        checksum = region_checksum(sess.cfg, region.fd)
        sess.client.publish(version, checksum, encode_layout(tensors, model_config))
    finally:
        os.close(region.fd)
    published = published_weights(sess, version, 0)
    if published is None:
        raise BrokerError("the broker lists no published weights right after Publish")
    try:
        attach(model, published)
    finally:
        os.close(published.fd)
    log.info("belayer: published %d tensors (%d bytes, checksum %016x) into the broker", len(tensors), total, checksum)


def published_weights(sess: session_mod.Session, version: int, wait_s: float) -> Region | None:
    deadline = time.monotonic() + wait_s
    while True:
        regions = sess.client.manifest()
        found = None
        for r in regions:
            if found is None and r.info.kind == RegionKind.WEIGHTS and r.info.published and r.info.version == version:
                found = r
            else:
                os.close(r.fd)
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


@register_model_loader("belayer")
class BelayerModelLoader(BaseModelLoader):
    """Weights from the broker when published there, else from the checkpoint (then published)."""

    def __init__(self, load_config) -> None:
        super().__init__(load_config)
        files_config = copy.copy(load_config)
        files_config.load_format = "auto"
        files_config.model_loader_extra_config = {}
        self.files = DefaultModelLoader(files_config)
        self.vllm_config: VllmConfig | None = None

    def download_model(self, model_config: ModelConfig) -> None:
        self.files.download_model(model_config)

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        self.vllm_config = vllm_config
        return super().load_model(vllm_config, model_config, prefix)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        assert self.vllm_config is not None
        cfg = PluginConfig.from_vllm(self.vllm_config)
        kv_bytes = self.vllm_config.cache_config.kv_cache_memory_bytes or (1 << 30)
        sess = session_mod.start(cfg, kv_bytes)
        mark_in_place(model)
        version = weight_version(model_config)
        t0 = time.perf_counter()
        if cfg.role == Role.SHADOW:
            region = published_weights(sess, version, cfg.weights_wait_s)
            if region is None:
                raise BrokerError(f"no published weights (version {version:x}) on {cfg.broker} after {cfg.weights_wait_s} s: start the primary first")
        else:
            assert sess.grant is not None
            region = published_weights(sess, version, 0) if sess.grant.weights_ok else None
        if region is not None:
            try:
                n = attach(model, region)
            finally:
                os.close(region.fd)
            log.info("belayer: attached %d tensors from the broker in %.1f ms (no checkpoint read)", n, (time.perf_counter() - t0) * 1e3)
        else:
            self.files.load_weights(model, model_config)
            publish(sess, model, model_config)
        sess.reload_weights = lambda: self._reload(sess, model, model_config)
        if cfg.role == Role.SHADOW:
            sess.wait_for_promotion()

    def _reload(self, sess: session_mod.Session, model: nn.Module, model_config: ModelConfig) -> None:
        """Promotion with weights the broker refused: the mapped ones may be corrupt. Load the
        checkpoint into private memory, publish it, and redo vLLM's post-processing."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import process_weights_after_loading
        from vllm.utils.torch_utils import set_default_torch_dtype

        t0 = time.perf_counter()
        with set_current_vllm_config(self.vllm_config), set_default_torch_dtype(model_config.dtype), torch.no_grad():
            for p in model.parameters():
                p.data = torch.empty_like(p.data)
            self.files.load_weights(model, model_config)
            publish(sess, model, model_config)
            process_weights_after_loading(model, model_config, torch.device("cpu"))
        log.warning("belayer: cold loaded the weights in %.2f s after the broker refused them", time.perf_counter() - t0)
