"""The control API's answers as dataclasses, mirroring the Rust types of ``api/src/control.rs``,
``api/src/policy.rs`` and ``api/src/journal.rs``.

Every record keeps the fields it does not know in ``extra``, so a newer shim's additions are
not lost; a field it knows but the answer lacks is a :class:`~belayer.errors.ProtocolError`.
Checkpoint ids are strings, as the API spells them (``"3"``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self

from .errors import ProtocolError


@dataclass
class Record:
    """Base of the answer types: parsing from JSON and back, unknown fields kept."""

    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    # Converters of nested fields (applied to non-null values).
    _nested: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_json(cls, data: Any) -> Self:
        """Builds the record from a decoded JSON object."""
        if not isinstance(data, dict):
            raise ProtocolError(
                f"{cls.__name__}: expected a JSON object, got {type(data).__name__}"
            )
        known = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        missing = [name for name in known if name not in data]
        if missing:
            raise ProtocolError(f"{cls.__name__}: the answer lacks {', '.join(missing)}")
        values = {}
        for name in known:
            value = data[name]
            convert = cls._nested.get(name)
            values[name] = convert(value) if convert and value is not None else value
        extra = {k: v for k, v in data.items() if k not in values}
        return cls(**values, extra=extra)

    def to_json(self) -> dict[str, Any]:
        """The record as the API spells it, unknown fields included."""
        out: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name != "extra":
                out[f.name] = _to_json(getattr(self, f.name))
        return out


def _to_json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value


def _list_of(cls: type[Record]) -> Callable[[Any], list[Any]]:
    def convert(values: Any) -> list[Any]:
        if not isinstance(values, list):
            raise ProtocolError(f"expected a list of {cls.__name__}, got {type(values).__name__}")
        return [cls.from_json(v) for v in values]

    return convert


@dataclass
class CheckpointInfo(Record):
    """A checkpoint as ``inspect`` shows it."""

    id: str
    container: str
    namespace: str
    path: str
    parent: str | None
    created_unix_ms: int
    fs_chain: list[str]
    """Checkpoints whose filesystem layers this one's rootfs stacks, newest first."""
    leave_running: bool
    sizes: dict[str, Any]
    timings: dict[str, Any]
    criu_stats: Any


@dataclass
class Position(Record):
    """Which journalled actions the environment reflects after a restore."""

    checkpoint: str
    action: int
    """Actions 1..=action are reflected; later ones were undone."""
    reflects: str
    """In words: ``"checkpoint 7, taken after action 12"``."""
    policy: str
    replayed: int
    """For the ``replay`` policy: the actions re-run."""
    mismatches: list[str]
    """For the ``replay`` policy: the re-run actions whose exit code differed."""


@dataclass
class RestoreInfo(Record):
    """The answer of a restore: the new init pid, timings (ms), journal position."""

    container: str
    checkpoint: str
    pid: int
    verify_ms: int
    mount_ms: int
    restore_ms: int
    total_ms: int
    position: Position | None

    _nested = {"position": Position.from_json}


@dataclass
class Recovery(Record):
    """One automatic recovery (init died on its own; the newest checkpoint was restored)."""

    at_unix_ms: int
    exit_status: int
    restore: RestoreInfo
    position: Position | None

    _nested = {"restore": RestoreInfo.from_json, "position": Position.from_json}


@dataclass
class ContainerPolicy(Record):
    """What Belayer does for one container, from its annotations and the node's settings."""

    auto: bool
    recover: bool
    replay: bool
    keep: int


@dataclass
class Status(Record):
    """A container's Belayer state: policy, checkpoints, journal position, recoveries."""

    container: str
    namespace: str
    pid: int
    policy: ContainerPolicy
    checkpoints: list[str]
    actions: int
    """Actions journalled (completed ones)."""
    position: Position | None
    """Where the journal stands after the last restore."""
    recoveries: list[Recovery]

    _nested = {
        "policy": ContainerPolicy.from_json,
        "position": Position.from_json,
        "recoveries": _list_of(Recovery),
    }


@dataclass
class JournalEntry(Record):
    """One journalled action (an exec of the container)."""

    index: int
    """Position in the journal, from 1."""
    exec_id: str
    args: list[str]
    cwd: str
    env_sha256: str
    started_unix_ms: int
    ended_unix_ms: int | None
    exit_code: int | None
    """``None`` while the action runs."""
    after_checkpoint: int | None
    """The newest checkpoint when the action started."""
    spec: Any
    """The OCI process spec, for replay."""


checkpoint_list = _list_of(CheckpointInfo)
journal_list = _list_of(JournalEntry)
