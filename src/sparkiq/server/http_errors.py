"""How a failure becomes an HTTP answer: one status, one code, a message a caller can act on.

:func:`classify` maps sparkiq's errors to statuses -- 401 for a bad token, 404 for an unknown
store, 400 for a bad request (503 when a partition could not answer: the cluster's state,
not the caller's mistake), 502 for a node that could not be reached, 503 for other sparkiq
failures -- and anything unexpected to a 500 that names a request id to find in the node's
log, never a traceback or a Python class name.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from sparkiq.errors import (
    AuthenticationError,
    ForbiddenError,
    InvalidQueryError,
    NodeUnreachableError,
    SparkiqError,
    UnknownStoreError,
)
from sparkiq.wire import protocol

__all__ = ["HttpError", "classify"]

log = logging.getLogger("sparkiq.server")

_request_ids = itertools.count(1)


class HttpError(Exception):
    """An answer other than 2xx: ``status``, a stable ``code``, a ``message`` and the
    request ``field`` at fault (if one is)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.extra: dict[str, Any] = {}


def classify(exc: Exception) -> HttpError:
    """The HTTP answer for ``exc`` (see the module docstring)."""
    if isinstance(exc, AuthenticationError):
        return HttpError(401, "unauthorized", exc.message)
    if isinstance(exc, ForbiddenError):
        return HttpError(403, "forbidden", exc.message)
    if isinstance(exc, UnknownStoreError):
        return HttpError(404, "unknown_store", exc.message, "store")
    if isinstance(exc, InvalidQueryError):
        code = getattr(exc, "code", None) or "invalid_query"
        # A partition that could not answer (behind the bound, no live replica) is the
        # cluster's state, not the caller's mistake: retry later.
        status = 503 if code == "partition_failed" else 400
        error = HttpError(status, code, exc.message, _field_of(exc))
        error.extra = _sql_details(exc)
        return error
    if isinstance(exc, RecursionError):
        # Only input nests this deeply (a SQL expression chain, a MessagePack body of
        # nested arrays): the stack has unwound, nothing is broken, the caller must flatten.
        return HttpError(
            400, "nesting_too_deep", "the request nests too deeply to be read; flatten it"
        )
    if isinstance(exc, protocol.RemoteError | NodeUnreachableError):
        return HttpError(502, "upstream_unavailable", exc.message)
    if isinstance(exc, SparkiqError):
        return HttpError(503, "unavailable", exc.message)
    request_id = next(_request_ids)
    log.error("request %d failed", request_id, exc_info=exc)
    return HttpError(
        500, "internal_error", f"internal error (request id {request_id}); see the node's log"
    )


def _field_of(exc: Exception) -> str | None:
    field = getattr(exc, "field", None)
    return field if isinstance(field, str) else None


def _sql_details(exc: Exception) -> dict[str, Any]:
    details = {}
    for name in ("line", "column", "snippet", "candidates"):
        value = getattr(exc, name, None)
        if value is not None:
            details[name] = value
    return details
