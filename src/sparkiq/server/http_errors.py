"""How a failure becomes an HTTP answer: one status, one code, a message a caller can act on.

:func:`classify` reads the error's :class:`~sparkiq.errors.ErrorCode` (see
:func:`~sparkiq.errors.as_sparkiq_error`): the code's row gives the status -- 401 for a bad token,
404 for an unknown store, 400 for a bad request, 503 when a partition could not answer (the
cluster's state, not the caller's mistake), 502 for a node that could not be reached, 503
for other sparkiq failures. Anything unexpected becomes a 500 that names a request id to
find in the node's log, never a traceback or a Python class name.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from sparkiq.errors import ErrorCode, SparkiqError, as_sparkiq_error

__all__ = ["HttpError", "classify"]

log = logging.getLogger("sparkiq.server")

_request_ids = itertools.count(1)

#: What a SQL error adds to its body, where it knows it (where the problem is, close names).
_SQL_DETAILS = ("line", "column", "snippet", "candidates")


class HttpError(SparkiqError):
    """A refusal by the HTTP layer itself (a route, a header, a body), and the answer every
    failure becomes: ``code`` (its table row gives ``status``), a ``message``, the request
    ``field`` at fault (if one is) and ``extra`` members of the error body."""

    def __init__(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message, code=code, field=field)
        self.extra: dict[str, Any] = {}

    @property
    def status(self) -> int:
        return self.code.status


def classify(exc: BaseException) -> HttpError:
    """The HTTP answer for ``exc`` (see the module docstring)."""
    if isinstance(exc, HttpError):
        return exc
    known = as_sparkiq_error(exc)
    if known is None:
        request_id = next(_request_ids)
        log.error("request %d failed", request_id, exc_info=exc)
        return HttpError(
            ErrorCode.INTERNAL_ERROR,
            f"internal error (request id {request_id}); see the node's log",
        )
    code = known.reply_code
    # a relayed failure's field names the other node's request, not this one's
    error = HttpError(code, known.message, known.field if code is known.code else None)
    error.extra = {
        name: value for name in _SQL_DETAILS if (value := getattr(known, name, None)) is not None
    }
    return error
