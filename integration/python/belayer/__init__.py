"""Client for the Belayer shim's control socket (Python stdlib only).

    >>> import belayer
    >>> sb = belayer.Sandbox("sb1")              # namespace="moby" for docker's containers
    >>> cp = sb.checkpoint()                     # processes + filesystem, one instant
    >>> info = sb.restore(cp.id)                 # info.position.action: actions still reflected

Every request is one HTTP/1.1 + JSON exchange on ``/run/belayer/ctl/<namespace>/<id>.sock``
(root-only); errors are the typed :class:`BelayerError` subclasses.
"""

from .errors import (
    BelayerError,
    Busy,
    CliError,
    Conflict,
    CorruptCheckpoint,
    DiskFull,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ServerError,
    ShimUnavailable,
    TryAgain,
    error_for_status,
)
from .models import (
    CheckpointInfo,
    ContainerPolicy,
    JournalEntry,
    Position,
    Record,
    Recovery,
    RestoreInfo,
    Status,
)
from .sandbox import DEFAULT_SOCKET_DIR, CheckpointId, Container, Sandbox

__all__ = [
    "DEFAULT_SOCKET_DIR",
    "BelayerError",
    "Busy",
    "CheckpointId",
    "CheckpointInfo",
    "CliError",
    "Conflict",
    "Container",
    "ContainerPolicy",
    "CorruptCheckpoint",
    "DiskFull",
    "InvalidRequest",
    "JournalEntry",
    "NotFound",
    "PermissionDenied",
    "Position",
    "ProtocolError",
    "Record",
    "Recovery",
    "RestoreInfo",
    "Sandbox",
    "ServerError",
    "ShimUnavailable",
    "TryAgain",
    "Status",
    "error_for_status",
]
