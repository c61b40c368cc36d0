"""A broker connection: SOCK_SEQPACKET, one message per packet, region fds via SCM_RIGHTS.

Synchronous request/reply behind a lock, so a heartbeat thread and the engine's thread can share
one connection (as gpu-broker/src/client.rs does).
"""

from __future__ import annotations

import array
import os
import socket
import threading
from dataclasses import dataclass

from . import wire


class BrokerError(RuntimeError):
    """The broker refused a request (``code`` says why) or went away."""

    def __init__(self, message: str, code: wire.ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code

    @property
    def stale(self) -> bool:
        return self.code in (wire.ErrorCode.STALE_EPOCH, wire.ErrorCode.NOT_PRIMARY)

    @property
    def restarted(self) -> bool:
        return self.code == wire.ErrorCode.BROKER_RESTARTED or self.code is None


@dataclass
class Region:
    info: wire.RegionInfo
    fd: int


MAX_FDS = 8


class BrokerClient:
    """One connection to ``belayer-gpu-broker``."""

    def __init__(self, path: str, role: wire.Role, known_instance: int = 0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            self.sock.connect(path)
        except OSError as e:
            self.sock.close()
            raise BrokerError(f"cannot connect to the broker at {path}: {e}") from e
        self.lock = threading.Lock()
        self.epoch = 0
        reply, _ = self.call(wire.Hello(role, known_instance))
        if not isinstance(reply, wire.HelloOk):
            raise BrokerError(f"unexpected reply to hello: {reply!r}")
        self.instance = reply.instance
        self.worker_id = reply.worker_id
        self.pid = reply.pid

    def close(self) -> None:
        self.sock.close()

    def _send(self, m: wire.Msg) -> None:
        frame = wire.encode(m)
        if len(frame) > wire.MAX_FRAME:
            raise BrokerError(f"{type(m).__name__} of {len(frame)} bytes exceeds the frame bound")
        try:
            self.sock.sendall(frame)
        except OSError as e:
            raise BrokerError(
                f"the broker closed the connection ({e.strerror}): it exited or restarted; its "
                "weights, KV arena and token log may be gone"
            ) from e

    def _recv(self) -> tuple[wire.Msg, list[int]]:
        fds = array.array("i")
        try:
            data, anc, flags, _ = self.sock.recvmsg(
                wire.MAX_FRAME + 1, socket.CMSG_SPACE(MAX_FDS * fds.itemsize), socket.MSG_CMSG_CLOEXEC
            )
        except OSError as e:
            raise BrokerError(f"broker socket failure: {e}") from e
        for level, typ, payload in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        if not data:
            for fd in fds:
                os.close(fd)
            raise BrokerError(
                "the broker closed the connection (it exited or restarted, or refused our last "
                "message); its weights, KV arena and token log may be gone"
            )
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            raise BrokerError("truncated message from the broker")
        return wire.decode(data), list(fds)

    def call(self, m: wire.Msg) -> tuple[wire.Msg, list[int]]:
        """Sends ``m`` and returns the reply with any fds; an ``Error`` reply raises."""
        with self.lock:
            self._send(m)
            reply, fds = self._recv()
        if isinstance(reply, wire.Error):
            for fd in fds:
                os.close(fd)
            raise BrokerError(f"broker refused: {reply.message} ({reply.code.name})", reply.code)
        return reply, fds

    def _ok(self, m: wire.Msg) -> int:
        reply, _ = self.call(m)
        if not isinstance(reply, wire.Ok):
            raise BrokerError(f"unexpected reply: {reply!r}")
        return reply.epoch

    def manifest(self) -> list[Region]:
        reply, fds = self.call(wire.ManifestReq())
        if not isinstance(reply, wire.Manifest) or len(fds) != len(reply.regions):
            for fd in fds:
                os.close(fd)
            raise BrokerError(f"bad manifest: {reply!r} with {len(fds)} fds")
        return [Region(info, fd) for info, fd in zip(reply.regions, fds)]

    def acquire(self, page_bytes: int, pages: int) -> wire.Grant:
        """Asks for the lease; a shadow's call returns only at its promotion."""
        reply, _ = self.call(wire.Acquire(page_bytes, pages))
        if not isinstance(reply, wire.Grant):
            raise BrokerError(f"unexpected reply to acquire: {reply!r}")
        self.epoch = reply.epoch
        return reply

    def alloc_weights(self, version: int, nbytes: int) -> Region:
        reply, fds = self.call(wire.AllocWeights(self.epoch, version, nbytes))
        if not isinstance(reply, wire.Manifest) or not fds:
            raise BrokerError(f"unexpected reply to alloc: {reply!r}")
        for fd in fds[1:]:
            os.close(fd)
        return Region(reply.regions[0], fds[0])

    def publish(self, version: int, checksum: int, meta: bytes) -> None:
        self._ok(wire.Publish(self.epoch, version, checksum, meta))

    def heartbeat(self) -> None:
        self._ok(wire.Heartbeat(self.epoch))

    def admit(self, request_id: int, params: wire.SamplingParams, prompt: list[int]) -> None:
        self._ok(wire.Admit(self.epoch, request_id, params, 0, prompt))

    def commit(self, entries: list[wire.CommitEntry]) -> None:
        self._ok(wire.Commit(self.epoch, entries))

    def kv_note(self, blocks: list[wire.KvBlock]) -> None:
        """Records full KV blocks (in frames of at most ``MAX_KV_BLOCKS``)."""
        for i in range(0, len(blocks), wire.MAX_KV_BLOCKS):
            self._ok(wire.KvNote(self.epoch, blocks[i : i + wire.MAX_KV_BLOCKS]))

    def kv_adoptable(self) -> tuple[int, list[tuple[int, int]], list[wire.KvBlock]]:
        """(page_bytes, pages, blocks) a confirmed-dead predecessor left; no pages if none."""
        start, blocks = 0, []
        while True:
            reply, _ = self.call(wire.KvAdoptReq(self.epoch, start))
            if not isinstance(reply, wire.KvAdoptable):
                raise BrokerError(f"unexpected reply to kv adopt: {reply!r}")
            blocks += reply.blocks
            if not reply.more or not reply.blocks:
                return reply.page_bytes, reply.pages, blocks
            start = reply.blocks[-1].block + 1

    def kv_adopt_done(self) -> None:
        self._ok(wire.KvAdoptDone(self.epoch))

    def log_ids(self) -> list[tuple[int, bool]]:
        reply, _ = self.call(wire.LogList())
        assert isinstance(reply, wire.LogIds)
        return reply.ids

    def log_get(self, request_id: int) -> wire.RequestLog:
        reply, _ = self.call(wire.LogGet(request_id))
        if not isinstance(reply, wire.LogEntry):
            raise BrokerError(f"unexpected reply to log get: {reply!r}")
        return reply.log

    def release(self) -> None:
        self._ok(wire.Release(self.epoch))

    def fence(self) -> int:
        return self._ok(wire.Fence())

    def status(self) -> wire.Status:
        reply, _ = self.call(wire.StatusReq())
        if not isinstance(reply, wire.StatusReply):
            raise BrokerError(f"unexpected reply to status: {reply!r}")
        return reply.status
