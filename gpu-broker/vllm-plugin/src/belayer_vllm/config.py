"""The plugin's settings, read from vLLM's own ``--model-loader-extra-config`` JSON, so the worker,
the loader and the KV connector all see the same values without environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .wire import Role

DEFAULT_PAGE_BYTES = 2 << 20


@dataclass(frozen=True)
class PluginConfig:
    broker: str
    """Path of belayer-gpu-broker's socket."""
    role: Role
    """PRIMARY for the first server, SHADOW for the pre-started one."""
    endpoint: str
    """URL this vLLM serves on; written into the lease file when it holds the lease."""
    state_dir: str
    """Where the lease file (``primary.json``) goes; the front reads it."""
    page_bytes: int = DEFAULT_PAGE_BYTES
    """KV arena page size asked of the broker."""
    weights_wait_s: float = 600.0
    """How long a shadow waits for the primary to publish the weights."""
    checksum_bin: str = "belayer-region-checksum"
    """The broker's checksum as a program (gpu-broker/src/bin/belayer-region-checksum.rs)."""
    warmup: bool = True
    """A shadow sends itself two small requests once it serves (``Session._warm_up``)."""
    adopt_window_s: float = 60.0
    """How long a promoted shadow adopts its dead predecessor's KV blocks (0: never, always
    rebuild by prefill); the broker keeps the pages at most its ``--kv-adopt-ms``."""

    @staticmethod
    def from_vllm(vllm_config) -> "PluginConfig":
        extra = dict(vllm_config.load_config.model_loader_extra_config or {})
        missing = [k for k in ("broker", "role", "endpoint") if k not in extra]
        if missing:
            raise ValueError(
                "--load-format belayer needs --model-loader-extra-config with "
                f"{', '.join(missing)} (e.g. '{{\"broker\": \"/run/belayer/gpu0.sock\", "
                '"role": "primary", "endpoint": "http://127.0.0.1:8001"}\')'
            )
        role = {"primary": Role.PRIMARY, "shadow": Role.SHADOW}.get(str(extra["role"]))
        if role is None:
            raise ValueError(f"role {extra['role']!r}: expected primary or shadow")
        return PluginConfig(
            broker=str(extra["broker"]),
            role=role,
            endpoint=str(extra["endpoint"]),
            state_dir=str(extra.get("state_dir") or os.path.dirname(str(extra["broker"]))),
            page_bytes=int(extra.get("page_bytes", DEFAULT_PAGE_BYTES)),
            weights_wait_s=float(extra.get("weights_wait_s", 600.0)),
            checksum_bin=str(extra.get("checksum_bin", "belayer-region-checksum")),
            warmup=bool(extra.get("warmup", True)),
            adopt_window_s=float(extra.get("adopt_window_s", 60.0)),
        )
