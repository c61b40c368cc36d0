"""Runs one mini-swe-agent task, unchanged, in a docker sandbox, driven by its DeterministicModel.

The environment config comes from a recipe file (configs/frameworks/mini-swe-agent.yaml) or is
mini-swe-agent's default; nothing else about the framework is changed. Between actions the model
"thinks" for --gap seconds (its `/sleep` test action), the bubble in which a real LLM generates.

Writes the sandbox's container id to --id-file as soon as it exists, and a JSON report to --out:
exit status, submission (the repository's final state), each action's return code, times and
output. A run that stops with an error writes the report too, then exits non-zero.
"""

import argparse
import json
import subprocess
import time

import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.docker import DockerEnvironment
from minisweagent.models.test_models import DeterministicModel, make_output

# A small repository task: write a module with a bug, a test, see it fail, fix it, see it pass,
# then steps whose effect depends on how often they ran (an append-only log, a counter), so a
# lost or doubled action shows in the final state.
ACTIONS = [
    "mkdir -p /repo && cd /repo && printf 'def add(a, b):\\n    return a - b\\n' > calc.py && echo created >> log.txt",
    "cd /repo && printf 'from calc import add\\nassert add(2, 3) == 5, add(2, 3)\\nprint(\"ok\")\\n' > test_calc.py && echo test >> log.txt",
    "cd /repo && python3 test_calc.py; echo \"test exit $?\" >> log.txt",
    # The fix changes the file's size: Python trusts a cached .pyc whose source has the same size
    # and mtime second, and the previous action compiled one moments ago.
    "cd /repo && sed -i 's/a - b/a + b  # fixed/' calc.py && echo fixed >> log.txt",
    "cd /repo && python3 test_calc.py && echo passed >> log.txt",
    "cd /repo && n=$(cat counter 2>/dev/null || echo 0) && echo $((n + 1)) > counter && echo \"count $n\" >> log.txt",
    "cd /repo && mkdir -p build && python3 -c 'import calc; print(calc.add(40, 2))' > build/answer && echo built >> log.txt",
    "cd /repo && n=$(cat counter) && echo $((n + 1)) > counter && echo \"count $n\" >> log.txt",
    "cd /repo && rm -rf __pycache__ && mv build/answer answer && rmdir build && echo tidy >> log.txt",
    "cd /repo && n=$(cat counter) && echo $((n + 1)) > counter && echo \"count $n\" >> log.txt",
]
SUBMIT = (
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cd /repo && "
    "find . -type f | sort | xargs sha256sum && cat log.txt counter answer"
)


def outputs(gap: float) -> list[dict]:
    out = []
    for i, cmd in enumerate(ACTIONS + [SUBMIT]):
        if gap > 0:
            out.append(make_output("thinking", [{"command": f"/sleep {gap}"}]))
        out.append(make_output(f"step {i + 1}", [{"command": cmd}]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--recipe", help="a mini-swe-agent config whose `environment` section is used")
    ap.add_argument("--gap", type=float, default=2.0)
    ap.add_argument("--id-file", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    env_config: dict = {}
    if args.recipe:
        with open(args.recipe) as f:
            env_config = dict(yaml.safe_load(f)["environment"])
        assert env_config.pop("environment_class") == "docker"
    env = DockerEnvironment(image=args.image, cwd="/", timeout=60, **env_config)
    with open(args.id_file, "w") as f:
        f.write(env.container_id)
    runtime = subprocess.run(
        ["docker", "inspect", "-f", "{{.HostConfig.Runtime}}", env.container_id],
        capture_output=True, text=True, check=True,
    ).stdout.strip()

    times: list[tuple[float, float]] = []
    execute = env.execute

    def timed(action: dict, *a, **kw) -> dict:
        t0 = time.time()
        try:
            return execute(action, *a, **kw)
        finally:
            times.append((t0, time.time()))

    env.execute = timed  # observe only: the call goes through unchanged
    agent = DefaultAgent(
        DeterministicModel(outputs=outputs(args.gap)),
        env,
        system_template="You are a helpful assistant that can interact with a computer.",
        instance_template="Fix the bug in /repo/calc.py. Task: {{task}}",
        step_limit=0,
        cost_limit=0,
    )
    try:
        result = agent.run(task="make add() add")
        error = None
    except Exception as e:  # the report still tells what each action answered
        result, error = {}, f"{type(e).__name__}: {e}"
    codes = [
        m["extra"].get("returncode")
        for m in agent.messages
        if m.get("role") == "user" and "returncode" in m.get("extra", {})
    ]
    report = {
        "container": env.container_id,
        "runtime": runtime,
        "exit_status": result.get("exit_status"),
        "error": error,
        "submission": result.get("submission"),
        "returncodes": codes,
        "exec_times": times,
        "observations": [m.get("content") for m in agent.messages if m.get("role") == "user"][1:],
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    env.cleanup()
    if error:
        raise SystemExit(f"mini-swe-agent stopped: {error}; the report is in {args.out}")


if __name__ == "__main__":
    main()
