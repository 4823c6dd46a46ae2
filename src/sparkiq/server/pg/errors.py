"""sparkiq's errors as Postgres ``ErrorResponse`` fields, with SQLSTATE codes.

The SQLSTATE is the error's :class:`~sparkiq.errors.ErrorCode` row's (the table in
docs/rest.md lists them all); the ones a Postgres client meets:

=====================================  =======  ============================================
error (code)                           SQLSTATE  meaning for a client
=====================================  =======  ============================================
wrong or missing password              28P01    invalid_password; the connection is closed
``syntax``                             42601    syntax_error (``P``: the character position)
``unknown_table`` (a table not served)  42P01   undefined_table
``unknown_column``                     42703    undefined_column
``unknown_function``                   42883    undefined_function
``forbidden_*`` statement, table ...   42501    insufficient_privilege: pull queries only
``forbidden`` (no grant)               42501    insufficient_privilege: the user's principal
                                                may not read the table
other unsupported SQL                  0A000    feature_not_supported
a limit (rows, size, page)             54000    program_limit_exceeded
``timeout``                            57014    query_canceled (``SqlLimits.timeout_seconds``)
``canceled`` (StatementCanceledError)  57014    query_canceled (the client's cancel request)
``partition_failed``                   57P03    cannot_connect_now: a partition could not
                                                answer; retry later (the connection is fine)
other invalid queries                  22023    invalid_parameter_value
node unreachable, other sparkiq fault  58000    system_error
anything else                          XX000    internal_error (logged with an id)
=====================================  =======  ============================================

Every error but the password one leaves the connection usable: the next statement runs.
"""

from __future__ import annotations

import itertools
import logging

from sparkiq.errors import ErrorCode, SparkiqError, as_sparkiq_error, error_code
from sparkiq.sql.errors import SqlError

__all__ = ["StatementCanceledError", "error_fields", "sqlstate"]

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
