"""Starts SWE-ReX's docker deployment, unchanged, with `docker_args` from a SWE-agent recipe
(configs/frameworks/swe-agent.yaml), and runs commands in the sandbox through its server.

Writes a JSON report to --out: the runtime docker ran the container with, a bash session's
output, a one-off command's result, a file written and read back, the session's cwd after `cd`.
"""

import argparse
import asyncio
import json
import subprocess

import yaml
from swerex.deployment.docker import DockerDeployment
from swerex.runtime.abstract import (
    BashAction,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    WriteFileRequest,
)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.recipe) as f:
        deployment = dict(yaml.safe_load(f)["env"]["deployment"])
    assert deployment.pop("type") == "docker"

    d = DockerDeployment(image=args.image, pull="never", startup_timeout=120, **deployment)
    await d.start()
    try:
        runtime = subprocess.run(
            ["docker", "inspect", "-f", "{{.HostConfig.Runtime}}", d.container_name],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
        r = d.runtime
        await r.create_session(CreateBashSessionRequest())
        session = await r.run_in_session(BashAction(command="x=$((6 * 7)); echo hello from $x"))
        await r.run_in_session(BashAction(command="cd /tmp"))
        cwd = await r.run_in_session(BashAction(command="pwd"))
        command = await r.execute(Command(command=["cat", "/etc/os-release"]))
        await r.write_file(WriteFileRequest(path="/tmp/note.txt", content="written through swe-rex\n"))
        back = await r.read_file(ReadFileRequest(path="/tmp/note.txt"))
        report = {
            "runtime": runtime,
            "session": session.output,
            "cwd_after_cd": cwd.output,
            "command": {"exit_code": command.exit_code, "stdout": command.stdout},
            "read_back": back.content,
        }
    finally:
        await d.stop()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    asyncio.run(main())
