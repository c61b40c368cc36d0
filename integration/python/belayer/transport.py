"""HTTP/1.1 + JSON over a shim's Unix control socket, one request per connection."""

from __future__ import annotations

import http.client
import json
import socket
from pathlib import Path
from typing import Any

from .errors import (
    BelayerError,
    PermissionDenied,
    ProtocolError,
    ShimUnavailable,
    error_for_status,
)


class _UnixConnection(http.client.HTTPConnection):
    """An ``HTTPConnection`` to a Unix socket instead of a TCP address."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("belayer", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def connect_error(exc: OSError, path: Path, container: str, namespace: str) -> BelayerError:
    """The error for a failed connect to ``path``, naming the socket and the container."""
    who = f"container {container!r} (namespace {namespace!r})"
    if isinstance(exc, PermissionError):
        return PermissionDenied(
            f"cannot open the control socket {path} of {who}: the Belayer control API is "
            f"root-only ({exc.strerror})"
        )
    if isinstance(exc, FileNotFoundError):
        why = (
            "does not exist (the container has no running Belayer task: not started, or not "
            "run with runtime io.containerd.belayer.v1)"
        )
    elif isinstance(exc, ConnectionRefusedError):
        why = "refuses connections (its shim is gone)"
    else:
        why = f"cannot be reached ({exc})"
    return ShimUnavailable(f"no Belayer shim serves {who}: control socket {path} {why}")


def request(
    path: Path,
    container: str,
    namespace: str,
    method: str,
    route: str,
    body: dict[str, Any] | None,
    timeout: float,
) -> Any:
    """Sends ``METHOD /v1/containers/{container}/{route}`` and returns the decoded answer.

    Raises the error mapped from the answer's status, :class:`ShimUnavailable` or
    :class:`PermissionDenied` when the socket cannot be opened, and :class:`ProtocolError`
    for an answer that is not JSON or does not come in time.
    """
    payload = json.dumps(body).encode() if body is not None else b""
    conn = _UnixConnection(path, timeout)
    try:
        try:
            conn.connect()
        except OSError as exc:
            raise connect_error(exc, path, container, namespace) from exc
        url = f"/v1/containers/{container}/{route}"
        headers = {"Content-Type": "application/json", "Connection": "close"}
        try:
            conn.request(method, url, body=payload, headers=headers)
            answer = conn.getresponse()
            status, raw = answer.status, answer.read()
        except TimeoutError as exc:
            raise ProtocolError(
                f"{method} {url} on {path}: no answer within {timeout:g} s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise ProtocolError(f"{method} {url} on {path}: {exc}") from exc
    finally:
        conn.close()
    return decode(status, raw, f"{method} {url}")


def decode(status: int, raw: bytes, what: str) -> Any:
    """The JSON of a 200 answer, or the error its status and ``error`` text map to."""
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
        if status == 200:
            raise ProtocolError(f"{what}: the answer is not JSON: {raw[:200]!r}") from None
    if status == 200:
        return data
    message = data.get("error") if isinstance(data, dict) else None
    if not isinstance(message, str):
        message = f"{what}: HTTP {status}"
    raise error_for_status(status, message)
