"""A Belayer container as an agent loop sees it: checkpoint, restore, fork, journal, hints."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import transport
from .errors import BelayerError, CliError, InvalidRequest
from .models import (
    CheckpointInfo,
    JournalEntry,
    RestoreInfo,
    Status,
    checkpoint_list,
    journal_list,
)

DEFAULT_SOCKET_DIR = Path("/run/belayer/ctl")
DEFAULT_ADDRESS = "/run/containerd/containerd.sock"

CheckpointId = int | str
"""A checkpoint id: the number ``checkpoints()`` lists, as an int or a string of digits."""


def checkpoint_number(checkpoint: CheckpointId) -> int:
    """``checkpoint`` as the API's number, or :class:`InvalidRequest`."""
    if isinstance(checkpoint, int) and not isinstance(checkpoint, bool) and checkpoint >= 0:
        return checkpoint
    if isinstance(checkpoint, str) and checkpoint.isascii() and checkpoint.isdigit():
        return int(checkpoint)
    raise InvalidRequest(
        f"invalid checkpoint id {checkpoint!r}: ids are the numbers `checkpoints()` lists"
    )


class Sandbox:
    """One container run with the Belayer runtime, reached through its shim's control socket.

    ``namespace`` is containerd's (``"default"``; docker's containers live in ``"moby"``).
    ``socket_dir`` holds the sockets (``/run/belayer/ctl/<namespace>/<id>.sock``). ``fork`` runs
    the ``belayer`` CLI (``belayer_bin``, default ``belayer`` on PATH) against containerd at
    ``address`` (default ``$CONTAINERD_ADDRESS``, else containerd's socket), with ``store`` as
    ``$BELAYER_STORE`` when given. ``timeout`` bounds each request, in seconds.
    """

    def __init__(
        self,
        container: str,
        *,
        namespace: str = "default",
        socket_dir: str | os.PathLike[str] = DEFAULT_SOCKET_DIR,
        address: str | os.PathLike[str] | None = None,
        belayer_bin: str | os.PathLike[str] = "belayer",
        store: str | os.PathLike[str] | None = None,
        timeout: float = 300.0,
    ) -> None:
        self.container = container
        self.namespace = namespace
        self.socket_dir = Path(socket_dir)
        self.address = str(address or os.environ.get("CONTAINERD_ADDRESS") or DEFAULT_ADDRESS)
        self.belayer_bin = str(belayer_bin)
        self.store = None if store is None else str(store)
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Sandbox({self.container!r}, namespace={self.namespace!r})"

    @property
    def socket_path(self) -> Path:
        """Where this container's shim listens."""
        return self.socket_dir / self.namespace / f"{self.container}.sock"

    def attach(self, container: str) -> Sandbox:
        """Another container (a fork, say) with this one's settings."""
        return Sandbox(
            container,
            namespace=self.namespace,
            socket_dir=self.socket_dir,
            address=self.address,
            belayer_bin=self.belayer_bin,
            store=self.store,
            timeout=self.timeout,
        )

    def _call(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        return transport.request(
            self.socket_path, self.container, self.namespace, method, route, body, self.timeout
        )

    # Checkpoints.

    def checkpoint(self, exit: bool = False) -> CheckpointInfo:
        """Checkpoints the running container, processes and filesystem at one instant.

        With ``exit`` the container stops after the dump; by default it keeps running.
        """
        return CheckpointInfo.from_json(self._call("POST", "checkpoint", {"exit": exit}))

    def checkpoints(self) -> list[CheckpointInfo]:
        """The container's checkpoints, oldest first."""
        return checkpoint_list(self._call("GET", "checkpoints"))

    def inspect(self, checkpoint: CheckpointId) -> CheckpointInfo:
        """One checkpoint (:class:`~belayer.errors.NotFound` when there is none)."""
        return CheckpointInfo.from_json(
            self._call("GET", f"checkpoints/{checkpoint_number(checkpoint)}")
        )

    def delete(self, checkpoint: CheckpointId) -> None:
        """Removes a checkpoint."""
        self._call("DELETE", f"checkpoints/{checkpoint_number(checkpoint)}")

    def restore(self, checkpoint: CheckpointId | None = None) -> RestoreInfo:
        """Restores the container in place from ``checkpoint`` (default: the newest).

        The answer's ``position`` says which journalled action the environment now reflects.
        """
        number = None if checkpoint is None else checkpoint_number(checkpoint)
        return RestoreInfo.from_json(self._call("POST", "restore", {"checkpoint": number}))

    def fork(self, checkpoint: CheckpointId, count: int = 1) -> list[str]:
        """Starts ``count`` new containers from ``checkpoint``, each with its own writable layer.

        Returns their ids (reach them with :meth:`attach`). Runs ``belayer fork``: a fork is a
        new containerd container, which only containerd's API creates.
        """
        if count < 1:
            raise InvalidRequest(f"fork count must be at least 1, not {count}")
        number = checkpoint_number(checkpoint)
        verb = ["fork", self.container, "--checkpoint", str(number), "--count", str(count)]
        return self._cli(verb).split()

    def _cli(self, verb: list[str]) -> str:
        """Runs ``belayer VERB...`` against this container's containerd; returns its stdout."""
        args = [self.belayer_bin, "--address", self.address, "--namespace", self.namespace]
        args += verb
        env = dict(os.environ)
        if self.store is not None:
            env["BELAYER_STORE"] = self.store
        try:
            done = subprocess.run(
                args, env=env, capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError as exc:
            raise CliError(
                f"the belayer CLI {self.belayer_bin!r} was not found (install it, or pass "
                f"belayer_bin=)",
                returncode=None,
                stderr="",
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise CliError(
                f"`belayer {' '.join(verb)}` did not finish within {self.timeout:g} s",
                returncode=None,
                stderr="",
            ) from exc
        if done.returncode != 0:
            stderr = done.stderr.strip()
            raise CliError(
                f"`belayer {' '.join(verb)}` failed (exit {done.returncode}): {stderr}",
                returncode=done.returncode,
                stderr=stderr,
            )
        return done.stdout

    # The action journal and state.

    def journal(self) -> list[JournalEntry]:
        """Every journalled action (exec) of the container, in order."""
        return journal_list(self._call("GET", "journal"))

    def status(self) -> Status:
        """Policy, checkpoints, journal position and recoveries."""
        return Status.from_json(self._call("GET", "status"))

    # Hints to the checkpoint scheduler.

    def hint(
        self,
        hint: str,
        *,
        expected_ms: int | None = None,
        expected_tokens: int | None = None,
    ) -> None:
        """Sends a scheduler hint by name (``llm-start`` or ``llm-end``)."""
        self._call(
            "POST",
            "hint",
            {"hint": hint, "expected_ms": expected_ms, "expected_tokens": expected_tokens},
        )

    def hint_llm_start(
        self, expected_ms: int | None = None, expected_tokens: int | None = None
    ) -> None:
        """The model started generating the next action (optionally: for about this long)."""
        self.hint("llm-start", expected_ms=expected_ms, expected_tokens=expected_tokens)

    def hint_llm_end(self) -> None:
        """The model finished generating."""
        self.hint("llm-end")

    @contextlib.contextmanager
    def llm_generation(
        self, expected_ms: int | None = None, expected_tokens: int | None = None
    ) -> Iterator[None]:
        """Sends ``llm-start`` before the block and ``llm-end`` after it.

        When the block raises, a failing ``llm-end`` does not hide the block's exception.
        """
        self.hint_llm_start(expected_ms=expected_ms, expected_tokens=expected_tokens)
        try:
            yield
        except BaseException:
            with contextlib.suppress(BelayerError):
                self.hint_llm_end()
            raise
        self.hint_llm_end()


Container = Sandbox
"""Alias of :class:`Sandbox`."""
