"""Runs one conversation turn through the `openhands-ai` app, unchanged (issue 22, point 6).

The app is OpenHands' V1 app server (`uvicorn openhands.app_server.app:app`), configured by its
environment only (APP_ENV below); its docker sandbox service starts the agent-server container with
docker-py on the daemon of DOCKER_HOST, which the test gives Belayer as default runtime. The model
is the scripted stub (stub_llm.py, served from this process on 127.0.0.1): one terminal step that
writes a file in the sandbox, then `finish`.

Through the app's HTTP API only: store the LLM settings (POST /api/v1/settings), start a
conversation with a first user message (POST /api/v1/app-conversations), follow its start task
until READY, then the conversation until the app reports it finished. The sandbox is left
running for the test to inspect; the app is stopped.

Writes a JSON report to --out: the start task, the conversation as the app reports it, the
events the app received from the sandbox (its webhook: the sandbox resolves host.docker.internal
through loopback_dns.py), the names the sandbox looked up, the stub's events, and timings: `app_ready_s` (app
process started -> GET /health answers), `sandbox_ready_s` (conversation requested -> start task
READY: sandbox started, healthy, conversation created in it), `turn_s` (READY -> the app reports
execution_status "finished").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loopback_dns  # noqa: E402
import stub_llm  # noqa: E402

PROJECT = "/workspace/project"
# What the terminal step writes; the test reads it back from the sandbox.
STEP_FILE = f"{PROJECT}/app-steps.log"
STEP_LINE = "step 0: written by the agent the app started"


def task() -> list[dict[str, Any]]:
    """The scripted tool calls: a terminal step in the sandbox, then finish."""
    return [
        {"tool": "terminal", "arguments": {
            "command": f"mkdir -p {PROJECT} && echo '{STEP_LINE}' >> {STEP_FILE}"}},
        {"tool": "finish", "arguments": {"message": "wrote app-steps.log"}},
    ]


def app_env(image: str, app_port: int, state: str) -> dict[str, str]:
    """The app's configuration: its own environment variables, nothing patched."""
    repository, tag = image.rsplit(":", 1)
    return {
        # The sandbox image: our offline build of the agent-server the app pins (1.34.0).
        "AGENT_SERVER_IMAGE_REPOSITORY": repository,
        "AGENT_SERVER_IMAGE_TAG": tag,
        # The sandbox on the host's network: its agent-server on 127.0.0.1:8000, no bridge, no
        # port mapping (the app's default maps random host ports to a bridge address).
        "AGENT_SERVER_USE_HOST_NETWORK": "true",
        # Sandbox URLs on 127.0.0.1. The app's default, http://localhost:{port}, becomes
        # host.docker.internal wherever the app believes it runs in a container (it looks for
        # /.dockerenv, which these machines have), and that name is looked up off the machine.
        "SANDBOX_CONTAINER_URL_PATTERN": "http://127.0.0.1:{port}",
        # The app's port, for the sandbox's webhook (http://host.docker.internal:PORT, fixed;
        # loopback_dns.py answers that name here).
        "SANDBOX_HOST_PORT": str(app_port),
        # The app's URL as the sandbox sees it (host network: loopback): its MCP server. Unset,
        # the app gives the sandbox http://host.docker.internal:PORT.
        "OH_WEB_URL": f"http://127.0.0.1:{app_port}",
        "OH_PERSISTENCE_DIR": state,
        "SERVE_FRONTEND": "false",
        # litellm (imported by the app) would otherwise fetch its cost map from GitHub.
        "LITELLM_LOCAL_MODEL_COST_MAP": "true",
        "OPENHANDS_SUPPRESS_BANNER": "1",
    }


def call(base: str, method: str, path: str, body: Any = None, timeout: float = 60) -> Any:
    """One request to the app; its JSON answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def wait_for(what: str, limit_s: float, probe: Any) -> Any:
    """Polls `probe` every 0.5 s until it returns something truthy; fails after `limit_s`."""
    started = time.monotonic()
    last: Any = None
    while time.monotonic() - started < limit_s:
        try:
            last = probe()
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            last = repr(e)
        else:
            if last:
                return last
        time.sleep(0.5)
    raise SystemExit(f"no {what} after {limit_s:.0f} s; last: {last}")


def app_events(base: str, conversation_id: str) -> list[dict[str, Any]] | None:
    """The events the app received from the sandbox (its webhook), as kind and tool; None until
    the terminal step's observation is among them."""
    page = call(base, "GET", f"/api/v1/conversation/{conversation_id}/events/search?limit=100")
    events = [{"kind": e.get("kind"), "tool": e.get("tool_name")} for e in page.get("items", [])]
    done = {"kind": "ObservationEvent", "tool": "terminal"} in events
    return events if done else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--app-port", type=int, required=True)
    ap.add_argument("--llm-port", type=int, required=True)
    ap.add_argument("--state", required=True, help="the app's persistence dir")
    ap.add_argument("--events", required=True, help="the stub's event log (JSON lines)")
    ap.add_argument("--app-log", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    stub_llm.serve(stub_llm.Script(steps=task(), events=a.events), a.llm_port)
    # The sandbox's webhook name, for the sandbox's resolver (the test's dockerd: 127.0.0.1).
    asked: list[str] = []
    try:
        loopback_dns.serve(asked)
    except OSError as e:
        raise SystemExit(f"cannot serve DNS on 127.0.0.1:53 for the sandbox's webhook: {e}")
    base = f"http://127.0.0.1:{a.app_port}"
    report: dict[str, Any] = {"error": None, "dns_asked": asked}
    log = open(a.app_log, "w")
    app = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "openhands.app_server.app:app",
         "--host", "127.0.0.1", "--port", str(a.app_port)],
        env={**os.environ, **app_env(a.image, a.app_port, a.state)},
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=a.state)
    try:
        started = time.monotonic()
        wait_for("answer to GET /health", 180, lambda: app.poll() is None and call(base, "GET", "/health"))
        report["app_ready_s"] = round(time.monotonic() - started, 2)

        call(base, "POST", "/api/v1/settings", {"agent_settings_diff": {"llm": {
            "model": "openai/fake-model",
            "base_url": f"http://127.0.0.1:{a.llm_port}/v1",
            "api_key": "stub-key"}}})
        requested = time.monotonic()
        task_id = call(base, "POST", "/api/v1/app-conversations", {"initial_message": {
            "role": "user", "run": True,
            "content": [{"type": "text", "text": "Append a line to app-steps.log, then finish."}]}})["id"]

        def start_task() -> Any:
            t = call(base, "GET", f"/api/v1/app-conversations/start-tasks?ids={task_id}")[0]
            if t["status"] == "ERROR":
                raise SystemExit(f"the app's start task failed: {t['detail']}")
            return t if t["status"] == "READY" else None

        t = wait_for("READY start task", 240, start_task)
        report["start_task"] = {k: t[k] for k in ("status", "detail", "sandbox_id",
                                                  "app_conversation_id", "agent_server_url")}
        report["sandbox_ready_s"] = round(time.monotonic() - requested, 2)
        ready = time.monotonic()
        conversation_id = t["app_conversation_id"]

        def finished() -> Any:
            c = call(base, "GET", f"/api/v1/app-conversations?ids={conversation_id}")[0]
            return c if c and c.get("execution_status") == "finished" else None

        c = wait_for("finished conversation", 120, finished)
        report["turn_s"] = round(time.monotonic() - ready, 2)
        report["conversation"] = {k: c.get(k) for k in (
            "id", "sandbox_id", "sandbox_status", "execution_status", "conversation_url")}
        report["app_events"] = wait_for("terminal step's observation among the app's events",
                                        30, lambda: app_events(base, conversation_id))
    except SystemExit as e:
        report["error"] = str(e)
    finally:
        app.terminate()
        try:
            app.wait(timeout=15)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()
        log.close()
    if os.path.exists(a.events):
        with open(a.events) as f:
            report["stub_events"] = [json.loads(line) for line in f if line.strip()]
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    if report["error"]:
        raise SystemExit(report["error"])


if __name__ == "__main__":
    main()
