"""The vLLM worker process's one broker session: the lease, its heartbeat, the lease file the
front reads, the KV buffer's placement, and the watch on vLLM's other two processes.

A primary acquires the lease while loading weights. A shadow sends its ``Acquire`` from a thread
at once; the broker answers it only at promotion, when the thread maps the KV arena over the
private buffer vLLM has been using (same addresses: vLLM's per-layer views stay valid), cold
reloads the weights if the broker refused them, and writes the lease file.
"""

from __future__ import annotations

import ctypes
import json
import logging
import math
import mmap
import os
import select
import sys
import threading
from collections.abc import Callable

from . import kvreuse
from .client import BrokerClient, BrokerError
from .config import PluginConfig
from .wire import Grant, RegionKind, Role

log = logging.getLogger("vllm.belayer")

EXIT_FENCED = 75
EXIT_BROKER_GONE = 3
EXIT_PEER_DIED = 70

_SESSION: "Session | None" = None
_LOCK = threading.Lock()


def current() -> "Session | None":
    return _SESSION


def start(cfg: PluginConfig, kv_bytes: int) -> "Session":
    """The process's session (created once: vLLM loads the model once per worker)."""
    global _SESSION
    with _LOCK:
        if _SESSION is None:
            _SESSION = Session(cfg, kv_bytes)
        return _SESSION


def die(code: int, why: str) -> None:
    """Leaves at once: a fenced or orphaned worker must not write another token or KV byte."""
    try:
        sys.stderr.write(f"belayer_vllm: {why}; exiting {code}\n")
        sys.stderr.flush()
    finally:
        os._exit(code)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
MAP_FIXED = 0x10


class Session:
    def __init__(self, cfg: PluginConfig, kv_bytes: int) -> None:
        self.cfg = cfg
        self.client = BrokerClient(cfg.broker, cfg.role)
        self.pages = max(1, math.ceil(kv_bytes / cfg.page_bytes))
        self.grant: Grant | None = None
        self.promoted = threading.Event()
        self.kv_ready = threading.Event()
        self.kv_addr = 0
        self.kv_len = 0
        self.kv_map: mmap.mmap | None = None
        self.reload_weights: Callable[[], None] | None = None
        self.takeover_cb: list[Callable[[], None]] = []
        self.adoption: kvreuse.Adoption | None = None
        self._adopt_seen = (0, 0)
        log.info("belayer: connected to %s as %s (pid %d, broker instance %x)", cfg.broker, cfg.role.name, self.client.pid, self.client.instance)
        threading.Thread(target=self._watch_peers, name="belayer-watch", daemon=True).start()
        if cfg.role == Role.PRIMARY:
            self.grant = self.client.acquire(cfg.page_bytes, self.pages)
            self._start_heartbeat()

    def wait_for_promotion(self) -> None:
        """A shadow's ``Acquire``, sent once it has its weights: the broker answers it only at
        promotion, and the connection carries nothing else until then."""
        assert self.cfg.role == Role.SHADOW
        threading.Thread(target=self._wait_promotion, name="belayer-shadow", daemon=True).start()

    @property
    def holds_lease(self) -> bool:
        return self.grant is not None

    # --- the KV buffer ------------------------------------------------------------------------

    def _kv_fd(self) -> int:
        """The KV arena's fd (the lease holder's manifest carries it)."""
        regions = self.client.manifest()
        kv = [r for r in regions if r.info.kind == RegionKind.KV]
        for r in regions:
            if not kv or r is not kv[0]:
                os.close(r.fd)
        if not kv:
            raise BrokerError("the manifest of the lease holder carries no KV arena")
        return kv[0].fd

    def _arena_offset(self, length: int) -> tuple[int, int]:
        """(fd, offset) of the granted KV pages, which must be one run holding ``length`` bytes."""
        assert self.grant is not None
        runs = self.grant.pages
        if len(runs) != 1 or runs[0][1] * self.cfg.page_bytes < length:
            raise BrokerError(f"KV grant {runs} is not one run of {length} bytes")
        return self._kv_fd(), runs[0][0] * self.cfg.page_bytes

    def kv_buffer(self, size: int):
        """The bytes vLLM's ``allocate_kv_cache`` asks for: the broker's arena for the lease
        holder, private memory for a shadow until its promotion."""
        import torch

        length = math.ceil(size / mmap.PAGESIZE) * mmap.PAGESIZE
        if self.holds_lease:
            fd, off = self._arena_offset(length)
            self.kv_map = mmap.mmap(fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=off)
            os.close(fd)
            where = f"broker KV arena at offset {off}"
        else:
            self.kv_map = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            where = "private memory until promotion"
        t = torch.frombuffer(self.kv_map, dtype=torch.int8, count=size)
        if self.holds_lease:
            t.zero_()
        self.kv_addr = t.data_ptr()
        self.kv_len = length
        self.kv_ready.set()
        log.info("belayer: KV cache buffer of %d bytes in %s", size, where)
        if not self.holds_lease and self.cfg.warmup:
            threading.Thread(target=self._warm_up, name="belayer-warmup", daemon=True).start()
        if self.holds_lease:
            self.write_lease_file()
        return t

    def _remap_kv(self) -> None:
        fd, off = self._arena_offset(self.kv_len)
        try:
            addr = _libc.mmap(self.kv_addr, self.kv_len, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED | MAP_FIXED, fd, off)
            if addr != self.kv_addr:
                raise OSError(ctypes.get_errno(), f"mmap MAP_FIXED of the KV arena returned {addr:#x}")
        finally:
            os.close(fd)
        log.info("belayer: KV cache buffer now maps the broker's arena at offset %d", off)

    def _warm_up(self) -> None:
        """A shadow's first request through its own API server, before any promotion: vLLM's
        own warm-up leaves the first real request paying seconds of lazy set-up (measured ~10 s
        here under load). Its KV is private memory until promotion and its tokens are not
        logged (no lease), so this touches nothing of the primary's."""
        import time
        import urllib.request

        t0 = time.monotonic()
        base = self.cfg.endpoint.rstrip("/")
        while time.monotonic() - t0 < 900:
            try:
                with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as r:
                    model = json.load(r)["data"][0]["id"]
                break
            except (OSError, ValueError, KeyError, IndexError):
                time.sleep(0.2)
        else:
            return
        for prompt, stream in (([1] * 64, True), ([1] * 300, False)):
            body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream, "return_token_ids": True}).encode()
            req = urllib.request.Request(f"{base}/v1/completions", data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    r.read()
            except OSError as e:
                log.warning("belayer: shadow warm-up request failed: %s", e)
                return
        log.info("belayer: shadow warm-up done in %.1f s", time.monotonic() - t0)

    # --- lease --------------------------------------------------------------------------------

    def _wait_promotion(self) -> None:
        try:
            grant = self.client.acquire(self.cfg.page_bytes, self.pages)
        except BrokerError as e:
            die(EXIT_BROKER_GONE, f"waiting for promotion: {e}")
            return
        self.grant = grant
        log.warning("belayer: promoted (epoch %d, takeover %s, weights_ok %s)", grant.epoch, grant.takeover, grant.weights_ok)
        self._start_heartbeat()
        self.kv_ready.wait()
        try:
            self._remap_kv()
            try:
                self._adopt(grant)
            except (OSError, ValueError, BrokerError) as e:
                # Reuse is an optimisation: without it every request rebuilds by prefill.
                log.warning("belayer: KV reuse unavailable (%s); rebuilding by prefill", e)
                kvreuse.remove_table(self.cfg.state_dir)
                self.adoption = None
            if not grant.weights_ok:
                log.warning("belayer: the broker refused the weights at the health check; cold loading")
                assert self.reload_weights is not None
                self.reload_weights()
        except Exception as e:  # noqa: BLE001 - a promoted shadow that cannot serve must leave
            die(EXIT_BROKER_GONE, f"taking over failed: {e!r}")
        self.write_lease_file()
        self.promoted.set()

    # --- KV reuse after a takeover ------------------------------------------------------------

    def _adopt(self, grant: Grant) -> None:
        """Maps the dead predecessor's KV pages read-only and publishes its blocks' prefixes for
        the scheduler. Anything missing or odd means no reuse: every request rebuilds by prefill."""
        kvreuse.remove_table(self.cfg.state_dir)
        self.write_kv_layout()
        if self.cfg.adopt_window_s <= 0:
            self.client.kv_adopt_done()
            return
        page_bytes, pages, blocks = self.client.kv_adoptable()
        if not pages or not blocks:
            log.warning("belayer: no KV blocks to adopt (predecessor fenced alive, or none recorded); rebuilding by prefill")
            return
        layers = self._kv_layers()
        if not grant.weights_ok:
            # When the weights went bad is unknown: KV computed with them may be bad too, however
            # well its checksum matches.
            log.warning("belayer: weights refused, so the predecessor's KV is not adopted either; rebuilding by prefill")
            self.client.kv_adopt_done()
            return
        if len(pages) != 1 or page_bytes != self.cfg.page_bytes or pages[0][1] * page_bytes < self.kv_len or not layers:
            log.warning("belayer: the predecessor's KV pages %s (%d-byte pages) do not match this KV buffer; rebuilding by prefill", pages, page_bytes)
            self.client.kv_adopt_done()
            return
        fd = self._kv_fd()
        try:
            self.adoption = kvreuse.Adoption(fd, pages[0][0] * page_bytes, self.kv_len, self.kv_addr, layers, blocks)
        finally:
            os.close(fd)
        kvreuse.write_table(self.cfg.state_dir, grant.epoch, blocks)
        log.warning("belayer: KV reuse: %d blocks of the dead primary may be adopted for %.0f s", len(blocks), self.cfg.adopt_window_s)
        timer = threading.Timer(self.cfg.adopt_window_s, self._end_adoption)
        timer.daemon = True
        timer.start()

    @staticmethod
    def _kv_layers() -> list:
        from .kv import connector

        conn = connector()
        return conn.layers if conn is not None else []

    def write_kv_layout(self) -> None:
        """``kv-layout.json`` beside the lease file: where each layer's blocks lie in the KV
        arena (for diagnosis, and for the test that corrupts chosen blocks)."""
        layers = self._kv_layers()
        if self.grant is None or not layers or not self.kv_addr:
            return
        off = self.grant.pages[0][0] * self.cfg.page_bytes
        doc = {
            "epoch": self.grant.epoch,
            "arena_offset": off,
            "layers": [
                {"offset": t.data_ptr() - self.kv_addr, "block_bytes": t[0].numel() * t.element_size(), "blocks": int(t.shape[0])}
                for t in layers
            ],
        }
        path = os.path.join(self.cfg.state_dir, "kv-layout.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def _end_adoption(self) -> None:
        kvreuse.remove_table(self.cfg.state_dir)
        a, self.adoption = self.adoption, None
        if a is not None:
            log.warning("belayer: KV reuse over: adopted %d blocks, refused %d (checksum)", a.adopted, a.refused)
        try:
            self.client.kv_adopt_done()
        except BrokerError as e:
            self.on_broker_error(e, "kv adopt done")

    def adoption_progress(self) -> None:
        """Logs the adoption's counts when they change (called after each step's loads)."""
        a = self.adoption
        if a is not None and (a.adopted, a.refused) != self._adopt_seen:
            self._adopt_seen = (a.adopted, a.refused)
            log.warning("belayer: KV reuse: adopted %d blocks, refused %d (checksum)", a.adopted, a.refused)

    def _start_heartbeat(self) -> None:
        assert self.grant is not None
        every = max(0.05, self.grant.lease_ms / 4000.0)

        def beat() -> None:
            ev = threading.Event()
            while not ev.wait(every):
                try:
                    self.client.heartbeat()
                except BrokerError as e:
                    self.on_broker_error(e, "heartbeat")
                except Exception as e:  # noqa: BLE001 - a lease nobody renews must not linger
                    die(EXIT_BROKER_GONE, f"heartbeat failed: {e!r}")

        threading.Thread(target=beat, name="belayer-heartbeat", daemon=True).start()

    def on_broker_error(self, e: BrokerError, what: str) -> None:
        if e.stale:
            die(EXIT_FENCED, f"fenced: the broker refused our {what} ({e}); a newer primary holds the lease")
        die(EXIT_BROKER_GONE, f"{what}: {e}; this vLLM's token log is gone, restart it against the new broker")

    def write_lease_file(self) -> None:
        assert self.grant is not None
        os.makedirs(self.cfg.state_dir, exist_ok=True)
        path = os.path.join(self.cfg.state_dir, "primary.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"epoch": self.grant.epoch, "endpoint": self.cfg.endpoint, "worker_pid": os.getpid(), "instance": self.client.instance}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    # --- vLLM's other processes -----------------------------------------------------------------

    def _watch_peers(self) -> None:
        """vLLM dies whole but slowly (seconds) when its engine core or API server dies; the
        worker holds the broker connection, so it leaves at once and the broker confirms."""
        pids = []
        pid = os.getppid()
        for _ in range(2):
            if pid <= 1:
                break
            try:
                comm = open(f"/proc/{pid}/comm").read().strip()
            except OSError:
                break
            pids.append((pid, comm))
            if not comm.startswith("VLLM::EngineCor"):
                break
            pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        fds = {}
        for p, comm in pids:
            try:
                fds[os.pidfd_open(p)] = (p, comm)
            except OSError:
                die(EXIT_PEER_DIED, f"vLLM process {p} ({comm}) is already gone")
        if not fds:
            return
        ready, _, _ = select.select(list(fds), [], [])
        p, comm = fds[ready[0]]
        die(EXIT_PEER_DIED, f"vLLM process {p} ({comm}) died")
