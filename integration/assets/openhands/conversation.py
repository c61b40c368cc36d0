"""Runs one OpenHands V1 conversation, unchanged, in a DockerWorkspace sandbox (issue 22).

The agent is `get_default_agent` with an LLM pointed at the scripted stub (stub_llm.py, served
from this process on 127.0.0.1); the sandbox is OpenHands' agent-server image started by
DockerWorkspace on the docker daemon of DOCKER_HOST, on the host's network (`network="host"`: the
server listens on 127.0.0.1:--port, no bridge traffic). Nothing in OpenHands is patched; the LLM's
timeout and retry waits are its ordinary settings, shortened so a lost request is retried in
seconds.

The task (8 model turns, 7 tool steps and `finish`) builds a tiny project in /workspace/project:
every terminal step appends to steps.log (append-only), the file editor creates calc.py with a bug
and its test, the test fails, a str_replace fixes it, the test passes. Step 5's command marks
itself running (GET /mark/step5-running on the stub) and sleeps, so the test can kill the sandbox
while it runs.

Writes a JSON report to --out: the final execution status, the runtime docker ran the sandbox
with, the project's files, the server's history (tool calls and their results in order), the
client's websocket reconnects, and timings: `sandbox_ready_s` (DockerWorkspace created -> its
server healthy), `conversation_s` (Conversation(...) called -> run() returned), `run_s` (run()
called -> returned).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from typing import Any

import httpx
from pydantic import SecretStr

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stub_llm  # noqa: E402

from openhands.sdk import LLM, Conversation  # noqa: E402
from openhands.tools.preset.default import get_default_agent  # noqa: E402
from openhands.workspace import DockerWorkspace  # noqa: E402
from openhands.workspace.docker.workspace import check_port_available  # noqa: E402

# How long a run waits for the server's port. The previous conversation's server, killed with its
# sandbox, leaves its connections in TIME_WAIT on the port for 60 s, and DockerWorkspace refuses a
# port it cannot bind without SO_REUSEADDR ("Port 8000 is not available").
PORT_WAIT_S = 120.0


def wait_for_port(port: int) -> float:
    """Waits until DockerWorkspace's own check passes for `port`; returns the seconds waited."""
    started = time.monotonic()
    while not check_port_available(port):
        if time.monotonic() - started > PORT_WAIT_S:
            held = subprocess.run(["ss", "-tanp", f"sport = :{port}"], capture_output=True,
                                  text=True).stdout
            raise SystemExit(f"port {port} still taken after {PORT_WAIT_S:.0f} s:\n{held}")
        time.sleep(0.5)
    return round(time.monotonic() - started, 2)

PROJECT = "/workspace/project"


def task(llm_port: int) -> list[dict[str, Any]]:
    """The scripted tool calls: step k answers the model turn after k tool results."""
    log = f"{PROJECT}/steps.log"
    mark = f"python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:{llm_port}/mark/step5-running')\""
    terminal = lambda command: {"tool": "terminal", "arguments": {"command": command}}  # noqa: E731
    editor = lambda **a: {"tool": "file_editor", "arguments": a}  # noqa: E731
    return [
        terminal(f"mkdir -p {PROJECT} && cd {PROJECT} && echo 'step 0: project created' >> {log}"),
        editor(command="create", path=f"{PROJECT}/calc.py",
               file_text="def add(a, b):\n    return a - b\n"),
        editor(command="create", path=f"{PROJECT}/test_calc.py",
               file_text="from calc import add\n\nassert add(2, 3) == 5, add(2, 3)\nprint('tests pass')\n"),
        terminal(f"cd {PROJECT} && python3 test_calc.py; echo \"step 3: test rc=$?\" >> {log}"),
        editor(command="str_replace", path=f"{PROJECT}/calc.py",
               old_str="return a - b", new_str="return a + b"),
        terminal(f"cd {PROJECT} && echo 'step 5: begin' >> {log} && {mark} && sleep 6 && "
                 f"python3 test_calc.py; echo \"step 5: test rc=$?\" >> {log}"),
        terminal(f"cd {PROJECT} && echo \"step 6: $(wc -l < {log}) lines before\" >> {log}"),
        {"tool": "finish", "arguments": {"message": "calc.add fixed; tests pass"}},
    ]


class Reconnects(logging.Handler):
    """Counts the client websocket's lost connections (the SDK logs them at debug level)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.closed = 0
        self.connect_failures = 0

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg == "ws_connection_closed_retry":
            self.closed += 1
        elif msg == "ws_connect_retry":
            self.connect_failures += 1


def server_history(host: str, key: str, conversation_id: str) -> list[dict[str, Any]]:
    """The conversation's events as the agent-server reports them (REST, every page)."""
    items: list[dict[str, Any]] = []
    page: str | None = None
    with httpx.Client(base_url=host, headers={"X-Session-API-Key": key}, timeout=30) as c:
        while True:
            params: dict[str, Any] = {"limit": 100}
            if page:
                params["page_id"] = page
            r = c.get(f"/api/conversations/{conversation_id}/events/search", params=params)
            r.raise_for_status()
            body = r.json()
            items += body["items"]
            page = body.get("next_page_id")
            if not page:
                return items


def summarize(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls and what answered them, in order."""
    out = []
    for e in events:
        kind = e.get("kind")
        if kind == "ActionEvent":
            out.append({"kind": "action", "tool": e.get("tool_name"), "call": e.get("tool_call_id")})
        elif kind == "ObservationEvent":
            obs = e.get("observation") or {}
            out.append({"kind": "observation", "tool": e.get("tool_name"), "call": e.get("tool_call_id"),
                        "error": bool(obs.get("is_error"))})
        elif kind in ("AgentErrorEvent", "ConversationErrorEvent"):
            out.append({"kind": "error", "call": e.get("tool_call_id"), "detail": str(e)[:400]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--port", type=int, default=8000, help="the agent-server's port (host network)")
    ap.add_argument("--llm-port", type=int, required=True)
    ap.add_argument("--events", required=True, help="the stub's event log (JSON lines)")
    ap.add_argument("--gates", help="directory of release-<k> files for held steps")
    ap.add_argument("--hold", default="", help="comma-separated steps the stub holds")
    ap.add_argument("--think-s", type=float, default=0.2, help="the stub's time per model turn")
    ap.add_argument("--id-file", required=True, help="written with the sandbox's container id")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    reconnects = Reconnects()
    ws_logger = logging.getLogger("openhands.sdk.conversation.impl.remote_conversation")
    ws_logger.setLevel(logging.DEBUG)
    ws_logger.addHandler(reconnects)

    steps = task(args.llm_port)
    hold = {int(k) for k in args.hold.split(",") if k}
    script = stub_llm.Script(steps=steps, events=args.events, gate_dir=args.gates, hold=hold,
                             think_s=args.think_s)
    server = stub_llm.serve(script, args.llm_port)

    # The agent-server binds 0.0.0.0 on the host's network: give it a session key.
    key = secrets.token_hex(16)
    os.environ["OH_SESSION_API_KEYS_0"] = key
    port_wait_s = wait_for_port(args.port)
    started = time.monotonic()
    workspace = DockerWorkspace(server_image=args.image, host_port=args.port, network="host",
                                detach_logs=False, health_check_timeout=120)
    report: dict[str, Any] = {}
    try:
        cid = workspace._container_id or ""
        with open(args.id_file + ".tmp", "w") as f:
            f.write(cid)
        os.replace(args.id_file + ".tmp", args.id_file)
        report["port_wait_s"] = port_wait_s
        report["sandbox_ready_s"] = round(time.monotonic() - started, 2)
        report["runtime"] = subprocess.run(
            ["docker", "inspect", "-f", "{{.HostConfig.Runtime}}", cid],
            capture_output=True, text=True, check=True).stdout.strip()

        llm = LLM(model="openai/fake-model", base_url=f"http://127.0.0.1:{args.llm_port}/v1",
                  api_key=SecretStr("stub"), usage_id="agent", timeout=30, num_retries=8,
                  retry_min_wait=1, retry_max_wait=4)
        agent = get_default_agent(llm=llm, cli_mode=True)
        # The conversation's stop points: Conversation(...) called (it creates the conversation
        # on the agent-server) -> conversation.run() returned (FINISHED as this driver sees it).
        report["conversation_start_unix"] = time.time()
        c0 = time.monotonic()
        conversation = Conversation(agent=agent, workspace=workspace)
        conversation.send_message("Fix calc.add in /workspace/project so its test passes.")
        t0 = time.monotonic()
        error = None
        try:
            conversation.run(timeout=600)
        except Exception as e:  # reported, not raised: the test reads the report
            error = f"{type(e).__name__}: {e}"
        report["run_s"] = round(time.monotonic() - t0, 2)
        report["conversation_s"] = round(time.monotonic() - c0, 3)
        report["finished_unix"] = time.time()
        report["error"] = error
        report["status"] = str(conversation.state.execution_status.value)
        history = server_history(workspace.host, key, str(conversation.id))
        report["history"] = summarize(history)
        report["client_events"] = summarize(
            [json.loads(e.model_dump_json()) for e in conversation.state.events])
        files = {}
        for name in ("steps.log", "calc.py", "test_calc.py"):
            r = workspace.execute_command(f"cat {PROJECT}/{name}")
            files[name] = r.stdout if r.exit_code == 0 else None
        report["files"] = files
        report["reconnects"] = {"closed": reconnects.closed,
                                "connect_failures": reconnects.connect_failures}
        conversation.close()
    finally:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        workspace.cleanup()
        server.shutdown()


if __name__ == "__main__":
    main()
