"""The client against a real Belayer shim, under a private containerd that the Rust end-to-end
test ``integration/tests/python_client.rs`` starts; it passes the container in environment
variables. Without them every test here FAILS, saying how to run them: nothing skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import unittest
import uuid
from pathlib import Path

import support  # noqa: F401 (puts the package on sys.path)

import belayer

HOW = (
    "these tests need a real Belayer shim; run them through the end-to-end test, as root: "
    "cargo test --release -p belayer-integration --test python_client"
)
REQUIRED = (
    "BELAYER_TEST_NAMESPACE",
    "BELAYER_TEST_CONTAINER",
    "CONTAINERD_ADDRESS",
    "BELAYER_BIN",
    "BELAYER_STORE",
)
PACKAGE_DIR = Path(__file__).resolve().parents[1]


class RealShimTest(unittest.TestCase):
    """One running busybox container under the Belayer runtime (``sleep``), shared by the tests;
    each test leaves it running."""

    problem: str | None = None

    @classmethod
    def setUpClass(cls) -> None:
        missing = [name for name in REQUIRED if not os.environ.get(name)]
        if missing:
            cls.problem = f"{', '.join(missing)} not set: {HOW}"
            return
        cls.ns = os.environ["BELAYER_TEST_NAMESPACE"]
        cls.address = os.environ["CONTAINERD_ADDRESS"]
        cls.ctr_bin = os.environ.get("BELAYER_TEST_CTR", "ctr")
        cls.sb = belayer.Sandbox(
            os.environ["BELAYER_TEST_CONTAINER"],
            namespace=cls.ns,
            address=cls.address,
            belayer_bin=os.environ["BELAYER_BIN"],
            store=os.environ["BELAYER_STORE"],
        )

    def setUp(self) -> None:
        if self.problem:
            self.fail(self.problem)

    # Helpers: containerd's side, through ctr.

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.ctr_bin, "-a", self.address, "-n", self.ns, *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def exec(self, script: str, container: str | None = None) -> tuple[str, int, str]:
        """Runs ``sh -c script`` in the container; returns (exec id, exit code, stdout)."""
        exec_id = f"py{uuid.uuid4().hex[:10]}"
        target = container or self.sb.container
        out = self.ctr("tasks", "exec", "--exec-id", exec_id, target, "sh", "-c", script)
        return exec_id, out.returncode, out.stdout

    def task_status(self, container: str) -> str:
        for line in self.ctr("tasks", "ls").stdout.splitlines():
            fields = line.split()
            if fields and fields[0] == container:
                return fields[2]
        return "ABSENT"

    def remove(self, container: str) -> None:
        """Kills and deletes a container (a fork) and its task."""
        self.ctr("tasks", "kill", "-s", "9", container)
        deadline = time.monotonic() + 15
        while self.task_status(container) not in ("STOPPED", "ABSENT"):
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        self.ctr("tasks", "rm", "-f", container)
        out = self.ctr("containers", "rm", container)
        self.assertEqual(out.returncode, 0, f"containers rm {container}: {out.stderr}")

    # The tests.

    def test_checkpoint_list_inspect_then_restore_undoes_a_change(self) -> None:
        sb = self.sb
        _, code, _ = self.exec("echo kept > /py-kept")
        self.assertEqual(code, 0)
        actions = sb.status().actions
        cp = sb.checkpoint()
        self.assertEqual((cp.container, cp.namespace), (sb.container, self.ns))
        self.assertTrue(cp.leave_running)
        self.assertIn(cp.id, [c.id for c in sb.checkpoints()])
        info = sb.inspect(cp.id)
        self.assertEqual((info.id, info.path, info.fs_chain), (cp.id, cp.path, cp.fs_chain))
        self.assertTrue(Path(info.path).is_dir(), info.path)

        _, code, _ = self.exec("echo changed > /py-kept && touch /py-later")
        self.assertEqual(code, 0)
        restored = sb.restore(cp.id)
        self.assertEqual(restored.checkpoint, cp.id)
        self.assertGreater(restored.pid, 0)
        self.assertIsNotNone(restored.position, restored)
        assert restored.position is not None
        self.assertEqual(restored.position.checkpoint, cp.id)
        self.assertEqual(restored.position.action, actions, restored.position.reflects)
        self.assertEqual(self.task_status(sb.container), "RUNNING")
        _, code, out = self.exec("cat /py-kept; test ! -e /py-later")
        self.assertEqual((code, out), (0, "kept\n"), "the restore did not undo the change")

        # Without an id: the newest checkpoint.
        newest = sb.checkpoint()
        self.assertEqual(sb.restore().checkpoint, newest.id)
        self.assertEqual(sb.status().position.checkpoint, newest.id)  # type: ignore[union-attr]

    def test_journal_records_execs(self) -> None:
        before = len(self.sb.journal())
        first, code1, _ = self.exec("echo one > /py-journal")
        second, code2, _ = self.exec("exit 3")
        self.assertEqual((code1, code2), (0, 3))
        entries = self.sb.journal()
        self.assertEqual(len(entries), before + 2, [e.exec_id for e in entries])
        a, b = entries[-2:]
        self.assertEqual((a.exec_id, b.exec_id), (first, second))
        self.assertEqual(a.args, ["sh", "-c", "echo one > /py-journal"])
        self.assertEqual((a.exit_code, b.exit_code), (0, 3))
        self.assertEqual(b.index, a.index + 1)
        assert a.ended_unix_ms is not None
        self.assertGreaterEqual(a.ended_unix_ms, a.started_unix_ms)
        self.assertEqual(self.sb.status().actions, b.index)

    def test_status(self) -> None:
        st = self.sb.status()
        self.assertEqual((st.container, st.namespace), (self.sb.container, self.ns))
        self.assertGreater(st.pid, 0)
        self.assertIsInstance(st.policy, belayer.ContainerPolicy)
        self.assertGreaterEqual(st.policy.keep, 1)
        self.assertEqual(st.checkpoints, [c.id for c in self.sb.checkpoints()])
        self.assertEqual(st.recoveries, [], "nothing crashed, nothing was recovered")

    def test_hints_are_accepted_and_an_unknown_one_is_refused(self) -> None:
        self.sb.hint_llm_start(expected_ms=500)
        self.sb.hint_llm_end()
        self.sb.hint_llm_start(expected_tokens=64)
        with self.sb.llm_generation(expected_ms=100):
            time.sleep(0.05)
        with self.assertRaises(belayer.InvalidRequest) as ctx:
            self.sb.hint("llm-maybe")
        self.assertIn("unknown hint", str(ctx.exception))
        self.assertEqual(ctx.exception.status, 400)

    def test_missing_checkpoint_is_not_found(self) -> None:
        for call in (self.sb.inspect, self.sb.delete, self.sb.restore):
            with self.assertRaises(belayer.NotFound, msg=call.__name__) as ctx:
                call(987654)
            self.assertIn("987654", str(ctx.exception))
        self.assertEqual(self.task_status(self.sb.container), "RUNNING")

    def test_delete_checkpoint_and_the_base_is_a_conflict(self) -> None:
        older = self.sb.checkpoint()
        newer = self.sb.checkpoint()
        self.assertIn(older.id, newer.fs_chain, "the newer checkpoint stacks the older's layer")
        # Back at the older one, nothing needs the newer checkpoint any more.
        self.sb.restore(older.id)
        self.sb.delete(newer.id)
        self.assertNotIn(newer.id, [c.id for c in self.sb.checkpoints()])
        with self.assertRaises(belayer.NotFound):
            self.sb.inspect(newer.id)
        # The running rootfs stacks on the older one: the shim keeps it.
        with self.assertRaises(belayer.Conflict) as ctx:
            self.sb.delete(older.id)
        self.assertEqual(ctx.exception.status, 409)
        self.assertIn("base of the running container", str(ctx.exception))
        self.assertIn(older.id, [c.id for c in self.sb.checkpoints()])

    def test_fork_two_running_containers(self) -> None:
        _, code, _ = self.exec("echo source > /py-fork")
        self.assertEqual(code, 0)
        cp = self.sb.checkpoint()
        ids = self.sb.fork(cp.id, 2)
        for fork_id in ids:
            self.addCleanup(self.remove, fork_id)
        self.assertEqual(len(set(ids)), 2, ids)
        self.assertNotIn(self.sb.container, ids)
        for fork_id in ids:
            self.assertEqual(self.task_status(fork_id), "RUNNING", fork_id)
            self.assertGreater(self.sb.attach(fork_id).status().pid, 0)
            _, code, out = self.exec(f"cat /py-fork && echo {fork_id} > /py-fork", fork_id)
            self.assertEqual((code, out), (0, "source\n"), f"fork {fork_id} lost the state")
        # Each fork wrote its own layer.
        _, _, out = self.exec("cat /py-fork")
        self.assertEqual(out, "source\n")

    def test_fork_of_a_missing_checkpoint_is_a_cli_error(self) -> None:
        with self.assertRaises(belayer.CliError) as ctx:
            self.sb.fork(987654, 1)
        self.assertNotEqual(ctx.exception.returncode, 0)
        self.assertIn("987654", ctx.exception.stderr)

    def test_missing_container_is_shim_unavailable(self) -> None:
        ghost = self.sb.attach("no-such-container")
        with self.assertRaises(belayer.ShimUnavailable) as ctx:
            ghost.status()
        self.assertIn(str(ghost.socket_path), str(ctx.exception))
        self.assertIn("no-such-container", str(ctx.exception))

    def test_non_root_is_permission_denied(self) -> None:
        setpriv, python = shutil.which("setpriv"), "/usr/bin/python3"
        self.assertTrue(setpriv and Path(python).is_file(), "needs setpriv and /usr/bin/python3")
        probe = (
            "import belayer, sys\n"
            f"sb = belayer.Sandbox({self.sb.container!r}, namespace={self.ns!r})\n"
            "try:\n    sb.status()\n"
            "except belayer.PermissionDenied as e:\n    print(e); sys.exit(0)\n"
            "sys.exit(1)\n"
        )
        out = subprocess.run(
            [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={"PYTHONPATH": str(PACKAGE_DIR), "PYTHONDONTWRITEBYTECODE": "1"},
        )
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("root-only", out.stdout)


if __name__ == "__main__":
    unittest.main()
