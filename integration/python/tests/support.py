"""Test helpers: the package under test on ``sys.path``, and a throwaway shim stand-in that
answers canned HTTP on a Unix socket and records what it was asked."""

from __future__ import annotations

import http.server
import json
import socketserver
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Test the source tree, installed or not.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass
class Seen:
    """One request the fake shim received."""

    method: str
    path: str
    body: Any


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    # (method, path) → (status, raw body)
    routes: dict[tuple[str, str], tuple[int, bytes]]
    seen: list[Seen]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.server.seen.append(
            Seen(self.command, self.path, json.loads(raw) if raw else None)
        )
        status, body = self.server.routes.get(
            (self.command, self.path), (400, b'{"error": "no such request"}')
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Quiet (and Unix sockets have no client address to log)."""


class FakeShim:
    """A Unix-socket HTTP server at ``<dir>/<namespace>/<container>.sock``, as a shim's.

    ``answer(method, route, status, body)`` sets the reply to
    ``METHOD /v1/containers/<container>/<route>``; ``seen`` lists the requests received.
    """

    def __init__(self, container: str = "c1", namespace: str = "default") -> None:
        self.container = container
        self.namespace = namespace
        self._tmp = tempfile.TemporaryDirectory(prefix="belayer-fake-")
        self.socket_dir = Path(self._tmp.name)
        path = self.socket_dir / namespace / f"{container}.sock"
        path.parent.mkdir(parents=True)
        self.server = _Server(str(path), _Handler)
        self.server.routes = {}
        self.server.seen = []
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def seen(self) -> list[Seen]:
        return self.server.seen

    def answer(self, method: str, route: str, status: int, body: Any) -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        url = f"/v1/containers/{self.container}/{route}"
        self.server.routes[(method, url)] = (status, raw)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._tmp.cleanup()

    def __enter__(self) -> FakeShim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def checkpoint_json(id: str = "3", **overrides: Any) -> dict[str, Any]:  # noqa: A002
    """A CheckpointInfo as the shim serializes it."""
    data: dict[str, Any] = {
        "id": id,
        "container": "c1",
        "namespace": "default",
        "path": f"/var/lib/belayer/checkpoints/default/c1/{id}",
        "parent": None,
        "created_unix_ms": 1_700_000_000_000,
        "fs_chain": [id],
        "leave_running": True,
        "sizes": {"criu_bytes": 1024, "fs_bytes": 10},
        "timings": {"frozen_ms": 300},
        "criu_stats": {"frozen_time": 1},
    }
    data.update(overrides)
    return data


def position_json(checkpoint: str = "3", action: int = 5) -> dict[str, Any]:
    return {
        "checkpoint": checkpoint,
        "action": action,
        "reflects": f"checkpoint {checkpoint}, taken after action {action}",
        "policy": "rewind",
        "replayed": 0,
        "mismatches": [],
    }


def restore_json(position: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "container": "c1",
        "checkpoint": "3",
        "pid": 4242,
        "verify_ms": 5,
        "mount_ms": 0,
        "restore_ms": 300,
        "total_ms": 320,
        "position": position,
    }


def status_json() -> dict[str, Any]:
    return {
        "container": "c1",
        "namespace": "default",
        "pid": 4242,
        "policy": {"auto": True, "recover": True, "replay": False, "keep": 3},
        "checkpoints": ["2", "3"],
        "actions": 7,
        "position": position_json(),
        "recoveries": [
            {
                "at_unix_ms": 1_700_000_000_500,
                "exit_status": 137,
                "restore": restore_json(position_json()),
                "position": position_json(),
            }
        ],
    }


def journal_entry_json(index: int = 1) -> dict[str, Any]:
    return {
        "index": index,
        "exec_id": f"a{index}",
        "args": ["sh", "-c", "true"],
        "cwd": "/",
        "env_sha256": "00" * 32,
        "started_unix_ms": 1_700_000_000_000,
        "ended_unix_ms": 1_700_000_000_100,
        "exit_code": 0,
        "after_checkpoint": None,
        "spec": {"args": ["sh", "-c", "true"]},
    }
