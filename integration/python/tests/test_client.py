"""The client's own logic against a fake shim on a throwaway Unix socket: requests sent, answers
parsed, errors mapped, the CLI driven for fork. No containerd needed."""

from __future__ import annotations

import os
import socket
import stat
import tempfile
import textwrap
import unittest
from pathlib import Path

import support
from support import FakeShim

import belayer
from belayer import transport


class ErrorMappingTest(unittest.TestCase):
    def test_each_documented_status_has_its_class(self) -> None:
        expected = {
            400: belayer.InvalidRequest,
            403: belayer.PermissionDenied,
            404: belayer.NotFound,
            409: belayer.Conflict,
            422: belayer.CorruptCheckpoint,
            503: belayer.TryAgain,
            507: belayer.DiskFull,
            500: belayer.ServerError,
        }
        for status, cls in expected.items():
            err = belayer.error_for_status(status, "why")
            self.assertIs(type(err), cls, status)
            self.assertIsInstance(err, belayer.BelayerError)
            self.assertEqual((err.status, str(err)), (status, "why"))
        self.assertIs(belayer.Busy, belayer.Conflict)

    def test_undocumented_status_is_a_server_error_keeping_it(self) -> None:
        err = belayer.error_for_status(501, "not implemented")
        self.assertIsInstance(err, belayer.ServerError)
        self.assertEqual(err.status, 501)

    def test_error_answers_raise_with_the_servers_text(self) -> None:
        cases = [
            (400, belayer.InvalidRequest),
            (404, belayer.NotFound),
            (409, belayer.Conflict),
            (422, belayer.CorruptCheckpoint),
            (503, belayer.TryAgain),
            (507, belayer.DiskFull),
            (500, belayer.ServerError),
            (403, belayer.PermissionDenied),
        ]
        with FakeShim() as shim:
            sb = belayer.Sandbox("c1", socket_dir=shim.socket_dir)
            for status, cls in cases:
                shim.answer("GET", "status", status, {"error": f"failure {status}"})
                with self.assertRaises(cls) as ctx:
                    sb.status()
                self.assertEqual(str(ctx.exception), f"failure {status}")

    def test_error_answer_without_json_names_the_status(self) -> None:
        with FakeShim() as shim:
            shim.answer("GET", "journal", 500, b"oops")
            expected = "GET /v1/containers/c1/journal: HTTP 500"
            with self.assertRaisesRegex(belayer.ServerError, expected):
                belayer.Sandbox("c1", socket_dir=shim.socket_dir).journal()

    def test_non_json_success_is_a_protocol_error(self) -> None:
        with FakeShim() as shim:
            shim.answer("GET", "status", 200, b"<html>")
            with self.assertRaisesRegex(belayer.ProtocolError, "not JSON"):
                belayer.Sandbox("c1", socket_dir=shim.socket_dir).status()

    def test_missing_field_is_a_protocol_error(self) -> None:
        data = support.checkpoint_json()
        del data["fs_chain"]
        expected = "CheckpointInfo: the answer lacks fs_chain"
        with self.assertRaisesRegex(belayer.ProtocolError, expected):
            belayer.CheckpointInfo.from_json(data)


class UnavailableTest(unittest.TestCase):
    def test_missing_socket_names_socket_and_container(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            sb = belayer.Sandbox("gone", namespace="moby", socket_dir=d)
            with self.assertRaises(belayer.ShimUnavailable) as ctx:
                sb.checkpoints()
            message = str(ctx.exception)
            self.assertIn(f"{d}/moby/gone.sock", message)
            self.assertIn("'gone'", message)
            self.assertIn("does not exist", message)

    def test_dead_socket_refuses(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "default" / "dead.sock"
            path.parent.mkdir()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(str(path))
            s.close()  # the file stays, nobody listens: a shim that died
            with self.assertRaisesRegex(belayer.ShimUnavailable, "refuses connections") as ctx:
                belayer.Sandbox("dead", socket_dir=d).status()
            self.assertIn(str(path), str(ctx.exception))

    def test_permission_error_is_permission_denied(self) -> None:
        err = transport.connect_error(
            PermissionError(13, "Permission denied"), Path("/run/x.sock"), "c1", "default"
        )
        self.assertIsInstance(err, belayer.PermissionDenied)
        self.assertIn("root-only", str(err))
        self.assertIn("/run/x.sock", str(err))


class RequestsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.shim = FakeShim("c1", "ns1")
        self.addCleanup(self.shim.close)
        self.sb = belayer.Sandbox("c1", namespace="ns1", socket_dir=self.shim.socket_dir)

    def test_socket_path(self) -> None:
        self.assertEqual(
            belayer.Sandbox("c9", namespace="moby").socket_path,
            Path("/run/belayer/ctl/moby/c9.sock"),
        )

    def test_checkpoint_sends_exit_and_parses(self) -> None:
        self.shim.answer("POST", "checkpoint", 200, support.checkpoint_json(parent="2"))
        info = self.sb.checkpoint(exit=True)
        self.assertEqual(self.shim.seen[-1].body, {"exit": True})
        self.assertEqual((info.id, info.parent, info.sizes["criu_bytes"]), ("3", "2", 1024))
        self.sb.checkpoint()
        self.assertEqual(self.shim.seen[-1].body, {"exit": False})

    def test_list_inspect_delete(self) -> None:
        self.shim.answer(
            "GET", "checkpoints", 200, [support.checkpoint_json("1"), support.checkpoint_json("2")]
        )
        self.shim.answer("GET", "checkpoints/2", 200, support.checkpoint_json("2"))
        self.shim.answer("DELETE", "checkpoints/2", 200, {})
        self.assertEqual([c.id for c in self.sb.checkpoints()], ["1", "2"])
        self.assertEqual(self.sb.inspect("2").id, "2")
        self.assertEqual(self.sb.inspect(2).path, "/var/lib/belayer/checkpoints/default/c1/2")
        self.assertIsNone(self.sb.delete(2))
        self.assertEqual(self.shim.seen[-1].method, "DELETE")

    def test_bad_checkpoint_ids_are_refused_before_sending(self) -> None:
        for bad in ("x", "-1", -1, "1.5", True):
            with self.assertRaises(belayer.InvalidRequest):
                self.sb.inspect(bad)  # type: ignore[arg-type]
        self.assertEqual(self.shim.seen, [])

    def test_restore_body_and_position(self) -> None:
        answer = support.restore_json(support.position_json("3", 5))
        self.shim.answer("POST", "restore", 200, answer)
        info = self.sb.restore()
        self.assertEqual(self.shim.seen[-1].body, {"checkpoint": None})
        self.assertIsInstance(info.position, belayer.Position)
        assert info.position is not None
        self.assertEqual((info.position.checkpoint, info.position.action), ("3", 5))
        self.sb.restore("3")
        self.assertEqual(self.shim.seen[-1].body, {"checkpoint": 3})

    def test_restore_without_position(self) -> None:
        self.shim.answer("POST", "restore", 200, support.restore_json(None))
        self.assertIsNone(self.sb.restore(1).position)

    def test_status_nested_types(self) -> None:
        self.shim.answer("GET", "status", 200, support.status_json())
        st = self.sb.status()
        self.assertIsInstance(st.policy, belayer.ContainerPolicy)
        self.assertTrue(st.policy.auto)
        self.assertEqual(st.checkpoints, ["2", "3"])
        self.assertIsInstance(st.recoveries[0], belayer.Recovery)
        self.assertIsInstance(st.recoveries[0].restore, belayer.RestoreInfo)
        self.assertEqual(st.recoveries[0].position.action, 5)  # type: ignore[union-attr]

    def test_journal(self) -> None:
        self.shim.answer(
            "GET", "journal", 200, [support.journal_entry_json(1), support.journal_entry_json(2)]
        )
        entries = self.sb.journal()
        self.assertEqual([e.index for e in entries], [1, 2])
        self.assertEqual(entries[0].args, ["sh", "-c", "true"])
        self.assertIsInstance(entries[0], belayer.JournalEntry)

    def test_hints(self) -> None:
        self.shim.answer("POST", "hint", 200, {})
        self.sb.hint_llm_start(expected_ms=800)
        self.sb.hint_llm_start(expected_tokens=120)
        self.sb.hint_llm_end()
        self.assertEqual(
            [s.body for s in self.shim.seen],
            [
                {"hint": "llm-start", "expected_ms": 800, "expected_tokens": None},
                {"hint": "llm-start", "expected_ms": None, "expected_tokens": 120},
                {"hint": "llm-end", "expected_ms": None, "expected_tokens": None},
            ],
        )

    def test_llm_generation_brackets_the_block(self) -> None:
        self.shim.answer("POST", "hint", 200, {})
        with self.sb.llm_generation(expected_ms=50):
            self.assertEqual([s.body["hint"] for s in self.shim.seen], ["llm-start"])
        self.assertEqual([s.body["hint"] for s in self.shim.seen], ["llm-start", "llm-end"])

    def test_llm_generation_keeps_the_blocks_exception(self) -> None:
        self.shim.answer("POST", "hint", 200, {})
        with self.assertRaisesRegex(RuntimeError, "model failed"):
            with self.sb.llm_generation():
                # llm-end will fail too; the block's error must win.
                self.shim.answer("POST", "hint", 500, {"error": "shim trouble"})
                raise RuntimeError("model failed")
        self.assertEqual([s.body["hint"] for s in self.shim.seen], ["llm-start", "llm-end"])

    def test_the_request_uses_the_containers_url(self) -> None:
        self.shim.answer("GET", "status", 200, support.status_json())
        self.sb.status()
        self.assertEqual(self.shim.seen[-1].path, "/v1/containers/c1/status")


class RecordTest(unittest.TestCase):
    def test_unknown_fields_are_kept_and_round_trip(self) -> None:
        data = support.restore_json(support.position_json() | {"new_field": [1]})
        data["future"] = {"x": 1}
        info = belayer.RestoreInfo.from_json(data)
        self.assertEqual(info.extra, {"future": {"x": 1}})
        assert info.position is not None
        self.assertEqual(info.position.extra, {"new_field": [1]})
        self.assertEqual(info.to_json(), data)

    def test_status_round_trip(self) -> None:
        data = support.status_json()
        self.assertEqual(belayer.Status.from_json(data).to_json(), data)

    def test_not_an_object(self) -> None:
        with self.assertRaisesRegex(belayer.ProtocolError, "expected a JSON object"):
            belayer.Status.from_json([])


class ForkCliTest(unittest.TestCase):
    """``fork`` runs the belayer CLI; a stand-in script records its arguments."""

    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = Path(tmp.name)
        self.cli = self.dir / "belayer"

    def fake_cli(self, body: str) -> None:
        self.cli.write_text("#!/bin/sh\n" + textwrap.dedent(body))
        self.cli.chmod(self.cli.stat().st_mode | stat.S_IXUSR)

    def test_fork_arguments_and_ids(self) -> None:
        log = self.dir / "args"
        self.fake_cli(
            f"""\
            echo "$@" > {log}
            echo "store=$BELAYER_STORE" >> {log}
            printf 'c1-fork3-1\\nc1-fork3-2\\n'
            """
        )
        sb = belayer.Sandbox(
            "c1", namespace="ns1", address="/x/containerd.sock", belayer_bin=self.cli, store="/s"
        )
        self.assertEqual(sb.fork("3", 2), ["c1-fork3-1", "c1-fork3-2"])
        self.assertEqual(
            log.read_text().splitlines(),
            [
                "--address /x/containerd.sock --namespace ns1 fork c1 --checkpoint 3 --count 2",
                "store=/s",
            ],
        )
        fork = sb.attach("c1-fork3-1")
        self.assertEqual((fork.container, fork.namespace, fork.store), ("c1-fork3-1", "ns1", "/s"))

    def test_address_defaults_to_the_environment(self) -> None:
        old = os.environ.get("CONTAINERD_ADDRESS")
        os.environ["CONTAINERD_ADDRESS"] = "/env/containerd.sock"
        try:
            self.assertEqual(belayer.Sandbox("c1").address, "/env/containerd.sock")
            del os.environ["CONTAINERD_ADDRESS"]
            self.assertEqual(belayer.Sandbox("c1").address, "/run/containerd/containerd.sock")
        finally:
            if old is not None:
                os.environ["CONTAINERD_ADDRESS"] = old

    def test_cli_failure_carries_its_error(self) -> None:
        self.fake_cli("echo 'checkpoint 9 of c1 not found' >&2; exit 1\n")
        with self.assertRaises(belayer.CliError) as ctx:
            belayer.Sandbox("c1", belayer_bin=self.cli).fork(9, 1)
        self.assertEqual(ctx.exception.returncode, 1)
        self.assertIn("checkpoint 9 of c1 not found", str(ctx.exception))
        self.assertIn("belayer fork c1 --checkpoint 9 --count 1", str(ctx.exception))

    def test_missing_cli(self) -> None:
        with self.assertRaisesRegex(belayer.CliError, "not found"):
            belayer.Sandbox("c1", belayer_bin=self.dir / "nope").fork(1)

    def test_bad_count(self) -> None:
        with self.assertRaises(belayer.InvalidRequest):
            belayer.Sandbox("c1", belayer_bin=self.cli).fork(1, 0)


if __name__ == "__main__":
    unittest.main()
