"""Starts a container the way OpenHands' docker runtime does — docker-py's `containers.run` with
the `[sandbox] docker_runtime_kwargs` of a config file merged in — and reports what docker made
of it. (OpenHands itself is not installed here; this is the call its recipe line feeds.)
"""

import argparse
import json
import tomllib

import docker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.recipe, "rb") as f:
        kwargs = tomllib.load(f)["sandbox"]["docker_runtime_kwargs"]
    client = docker.from_env()
    c = client.containers.run(args.image, ["sleep", "300"], detach=True, network_mode="none", **kwargs)
    try:
        c.reload()
        code, output = c.exec_run(["sh", "-c", "echo hello from $(hostname)"])
        report = {
            "kwargs": kwargs,
            "runtime": c.attrs["HostConfig"]["Runtime"],
            "status": c.status,
            "exec": {"code": code, "output": output.decode()},
            "hostname": c.attrs["Config"]["Hostname"],
        }
    finally:
        c.remove(force=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
