"""Typed errors of the Belayer client, one class per answer the control API documents.

The API answers errors with an HTTP status and a JSON body ``{"error": "..."}``; the client
raises the class mapped from the status, whose message is the server's ``error`` text.
"""

from __future__ import annotations


class BelayerError(Exception):
    """Base of every error this package raises.

    ``status`` is the HTTP status the shim answered (``None`` when the error happened before
    or outside an answer, e.g. the socket is missing or the CLI failed).
    """

    status: int | None = None

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidRequest(BelayerError):
    """400: the request was malformed (bad checkpoint id, unknown hint, bad body)."""

    status = 400


class PermissionDenied(BelayerError):
    """403, or the socket refused us: the control API is root-only."""

    status = 403


class NotFound(BelayerError):
    """404: no such container or checkpoint."""

    status = 404


class Conflict(BelayerError):
    """409: another checkpoint or restore is in progress, or the container is not running."""

    status = 409


Busy = Conflict
"""Alias of :class:`Conflict`, for the "another operation in progress" reading of 409."""


class CorruptCheckpoint(BelayerError):
    """422: the checkpoint is corrupt or of an unknown format."""

    status = 422


class DiskFull(BelayerError):
    """507: the checkpoint store's disk is full."""

    status = 507


class TryAgain(BelayerError):
    """503: a task of the container cannot be stopped for a checkpoint now (it is in vfork, or in
    uninterruptible sleep); the container runs and nothing was kept. A later attempt may succeed."""

    status = 503


class ServerError(BelayerError):
    """500 (or any other status the API does not document): the shim failed."""

    status = 500


class ShimUnavailable(BelayerError):
    """No shim serves the container: its socket is missing or refuses connections."""


class ProtocolError(BelayerError):
    """The shim's answer was not the HTTP + JSON the API documents, or timed out."""


class CliError(BelayerError):
    """The ``belayer`` CLI (used for ``fork``) is missing or exited non-zero.

    ``returncode`` is its exit status (``None`` when it could not start); ``stderr`` its
    one-line error.
    """

    def __init__(self, message: str, *, returncode: int | None, stderr: str) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


_BY_STATUS: dict[int, type[BelayerError]] = {
    400: InvalidRequest,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    422: CorruptCheckpoint,
    503: TryAgain,
    507: DiskFull,
    500: ServerError,
}


def error_for_status(status: int, message: str) -> BelayerError:
    """The error the client raises for an HTTP ``status`` answered with ``message``.

    Statuses the API does not document map to :class:`ServerError`, keeping the status.
    """
    cls = _BY_STATUS.get(status, ServerError)
    return cls(message, status=status)
