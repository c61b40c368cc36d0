"""A scripted OpenAI-compatible chat-completions server standing in for the model.

Step k of a conversation is answered with the k-th scripted tool call, where k is the number of
tool results (`role: "tool"` messages) in the request: a retried request, or one a restored agent
sends again, gets the same answer. A request without tools (a title, a summary) gets plain text.

The test steers it through files:
  - every request and answer is appended to EVENTS (JSON lines, flushed at once):
    {"event": "request", "k": k, "n": serial, "t": unix_s} and {"event": "answer", ..., "sent": bool}
  - a step listed in HOLD is answered only once GATE_DIR/release-<k> exists: the model "thinks"
    for as long as the test needs (to checkpoint the sandbox, to kill it)
  - GET /mark/<name> (from a command in the sandbox) appends {"event": "mark", "name": name}
Standard library only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Script:
    """The scripted tool calls, the steps to hold, and where events and gates live."""

    steps: list[dict[str, Any]]
    events: str
    gate_dir: str | None = None
    hold: set[int] = field(default_factory=set)
    think_s: float = 0.2
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _serial: int = 0

    def record(self, **event: Any) -> None:
        event["t"] = time.time()
        line = json.dumps(event) + "\n"
        with self._lock:
            with open(self.events, "a") as f:
                f.write(line)
                f.flush()

    def next_serial(self) -> int:
        with self._lock:
            self._serial += 1
            return self._serial

    def wait_gate(self, k: int) -> None:
        time.sleep(self.think_s)
        if k not in self.hold or self.gate_dir is None:
            return
        gate = os.path.join(self.gate_dir, f"release-{k}")
        while not os.path.exists(gate):
            time.sleep(0.05)


def completion(step: dict[str, Any] | None, k: int, model: str) -> dict[str, Any]:
    """A chat.completion with the step's tool call, or plain text when there is none."""
    if step is None:
        message: dict[str, Any] = {"role": "assistant", "content": "Done."}
        finish = "stop"
    else:
        message = {
            "role": "assistant",
            "content": step.get("thought", ""),
            "tool_calls": [
                {
                    "id": f"call_{k}",
                    "type": "function",
                    "function": {
                        "name": step["tool"],
                        "arguments": json.dumps(step["arguments"]),
                    },
                }
            ],
        }
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-stub-{k}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
    }


def stream_chunks(body: dict[str, Any]) -> list[bytes]:
    """The same answer as server-sent events (for a client that asks for `stream: true`)."""
    message = body["choices"][0]["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if "tool_calls" in message:
        delta["tool_calls"] = [dict(tc, index=i) for i, tc in enumerate(message["tool_calls"])]
    base = {k: body[k] for k in ("id", "created", "model")}
    first = dict(base, object="chat.completion.chunk",
                 choices=[{"index": 0, "delta": delta, "finish_reason": None}])
    last = dict(base, object="chat.completion.chunk",
                choices=[{"index": 0, "delta": {}, "finish_reason": body["choices"][0]["finish_reason"]}],
                usage=body["usage"])
    return [f"data: {json.dumps(c)}\n\n".encode() for c in (first, last)] + [b"data: [DONE]\n\n"]


def handler_for(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_args: Any) -> None:
            pass

        def _send(self, code: int, payload: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            self.wfile.flush()

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.startswith("/mark/"):
                script.record(event="mark", name=self.path[len("/mark/"):])
                self._send(200, b"{}")
            elif self.path.rstrip("/").endswith("/models"):
                self._send(200, json.dumps({"object": "list", "data": [
                    {"id": "fake-model", "object": "model", "owned_by": "belayer"}]}).encode())
            else:
                self._send(404, b'{"error": {"message": "not found"}}')

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            req = json.loads(self.rfile.read(length) or b"{}")
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, b'{"error": {"message": "only chat/completions"}}')
                return
            messages = req.get("messages") or []
            k = sum(1 for m in messages if m.get("role") == "tool")
            n = script.next_serial()
            has_tools = bool(req.get("tools"))
            script.record(event="request", k=k, n=n, tools=has_tools)
            step = script.steps[k] if has_tools and k < len(script.steps) else None
            if step is not None:
                script.wait_gate(k)
            body = completion(step, k, req.get("model", "fake-model"))
            sent = True
            try:
                if req.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Connection", "close")
                    self.end_headers()
                    for chunk in stream_chunks(body):
                        self.wfile.write(chunk)
                    self.wfile.flush()
                    self.close_connection = True
                else:
                    self._send(200, json.dumps(body).encode())
            except OSError:
                sent = False
            script.record(event="answer", k=k, n=n, sent=sent)

    return Handler


def serve(script: Script, port: int) -> ThreadingHTTPServer:
    """Starts the server on 127.0.0.1:`port` in a daemon thread and returns it."""
    server = ThreadingHTTPServer(("127.0.0.1", port), handler_for(script))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
