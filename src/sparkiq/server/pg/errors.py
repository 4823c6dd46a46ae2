"""sparkiq's errors as Postgres ``ErrorResponse`` fields, with SQLSTATE codes.

The SQLSTATE is the one in the error's :class:`~sparkiq.errors.ErrorCode` row (docs/rest.md
lists every code; docs/postgres.md the ones a Postgres client meets): 42601 for a syntax
error (``P`` holds the character position), 42P01 / 42703 / 42883 for an unknown table,
column or function, 54000 for a limit, 57014 for a timeout or a cancel request, 57P03 for a
partition that could not answer. A wrong password is 28P01; anything unexpected is XX000,
logged with an id. Every error but the password one leaves the connection usable: the next
statement runs.
"""

from __future__ import annotations

import itertools
import logging

from sparkiq.errors import ErrorCode, SparkiqError, as_sparkiq_error, error_code
from sparkiq.sql.errors import SqlError

__all__ = [
    "StatementCanceledError",
    "error_fields",
    "fatal_fields",
    "sqlstate",
    "throttled_fields",
]

log = logging.getLogger("sparkiq.server.pg")
_error_ids = itertools.count(1)


class StatementCanceledError(SparkiqError):
    """The client canceled the running statement (a CancelRequest, psql's Ctrl-C)."""

    code = ErrorCode.CANCELED


def sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of ``exc``: its code's row in the table."""
    return error_code(exc).sqlstate


def error_fields(exc: BaseException, text: str | None = None) -> dict[str, str]:
    """``ErrorResponse`` fields for ``exc`` raised by statement ``text``: severity, SQLSTATE,
    message, and where sparkiq knows them the position, the detail (the caret snippet) and a
    hint (the closest names)."""
    known = as_sparkiq_error(exc)
    if known is None:
        error_id = next(_error_ids)
        log.error("pg statement failed (error id %d)", error_id, exc_info=exc)
        state = ErrorCode.INTERNAL_ERROR.sqlstate
        message = f"internal error (error id {error_id}); see the node's log"
    else:
        state, message = known.reply_code.sqlstate, known.message or str(known)
    fields = {"S": "ERROR", "V": "ERROR", "C": state, "M": message}
    if isinstance(exc, SqlError):
        if exc.snippet:
            fields["D"] = exc.snippet
        if exc.candidates:
            fields["H"] = "did you mean " + " or ".join(repr(c) for c in exc.candidates) + "?"
        position = _position(text, exc.line, exc.column)
        if position is not None:
            fields["P"] = str(position)
    return fields


def _position(text: str | None, line: int | None, column: int | None) -> int | None:
    """The 1-based character offset Postgres reports for (line, column) in ``text``."""
    if text is None or line is None or column is None:
        return None
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    return sum(len(x) + 1 for x in lines[: line - 1]) + column


def fatal_fields(sqlstate: str, message: str) -> dict[str, str]:
    """An error that ends the connection."""
    return {"S": "FATAL", "V": "FATAL", "C": sqlstate, "M": message}


def throttled_fields(peer: str, wait: float) -> dict[str, str]:
    """A login refused unchecked: its address failed too often lately (SQLSTATE 28000,
    invalid_authorization_specification, not 28P01: no password was judged)."""
    return fatal_fields(
        "28000",
        f"too many failed authentications from {peer}: the password was not checked; "
        f"retry in {wait:.1f} s",
    )
