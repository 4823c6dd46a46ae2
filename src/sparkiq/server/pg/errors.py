"""sparkiq's errors as Postgres ``ErrorResponse`` fields, with SQLSTATE codes.

=====================================  =======  ============================================
error                                  SQLSTATE  meaning for a client
=====================================  =======  ============================================
wrong or missing password              28P01    invalid_password; the connection is closed
``SqlSyntaxError``                     42601    syntax_error (``P``: the character position)
unknown table (or a table not served)  42P01    undefined_table
unknown column                         42703    undefined_column
unknown function                       42883    undefined_function
forbidden statement, table, function   42501    insufficient_privilege: pull queries only
``ForbiddenError`` (no grant)          42501    insufficient_privilege: the user's principal
                                                may not read the table
other ``SqlUnsupportedError``          0A000    feature_not_supported
``SqlLimitError`` (rows, size, page)   54000    program_limit_exceeded
``SqlLimitError`` code ``timeout``     57014    query_canceled (``SqlLimits.timeout_seconds``)
``StatementCanceledError``             57014    query_canceled (the client's cancel request)
``SqlPartitionError``                  57P03    cannot_connect_now: a partition could not
                                                answer; retry later (the connection is fine)
other ``InvalidQueryError``            22023    invalid_parameter_value
node unreachable, other sparkiq fault  58000    system_error
anything else                          XX000    internal_error (logged with an id)
=====================================  =======  ============================================

Every error but the password one leaves the connection usable: the next statement runs.
"""

from __future__ import annotations

import itertools
import logging

from sparkiq.errors import (
    AuthenticationError,
    ForbiddenError,
    InvalidQueryError,
    SparkiqError,
    UnknownStoreError,
)
from sparkiq.sql.errors import (
    SqlError,
    SqlLimitError,
    SqlPartitionError,
    SqlSyntaxError,
    SqlUnknownNameError,
    SqlUnsupportedError,
)

__all__ = ["StatementCanceledError", "error_fields", "sqlstate"]

log = logging.getLogger("sparkiq.server.pg")
_error_ids = itertools.count(1)


class StatementCanceledError(Exception):
    """The client canceled the running statement (a CancelRequest, psql's Ctrl-C)."""


_FORBIDDEN = frozenset({"forbidden_statement", "forbidden_table", "forbidden_function"})


def sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of ``exc`` (see the module's table)."""
    code = getattr(exc, "code", None)
    if isinstance(exc, AuthenticationError):
        return "28P01"
    if isinstance(exc, ForbiddenError):
        return "42501"
    if isinstance(exc, StatementCanceledError):
        return "57014"
    if isinstance(exc, SqlSyntaxError):
        return "42601"
    if isinstance(exc, SqlUnknownNameError):
        return {"unknown_column": "42703", "unknown_function": "42883"}.get(str(code), "42P01")
    if isinstance(exc, UnknownStoreError):
        return "42P01"
    if isinstance(exc, SqlUnsupportedError):
        return "42501" if code in _FORBIDDEN else "0A000"
    if isinstance(exc, SqlLimitError):
        return "57014" if code == "timeout" else "54000"
    if isinstance(exc, SqlPartitionError):
        return "57P03"
    if isinstance(exc, InvalidQueryError):
        return "22023"
    if isinstance(exc, SparkiqError):
        return "58000"
    return "XX000"


def error_fields(exc: BaseException, text: str | None = None) -> dict[str, str]:
    """``ErrorResponse`` fields for ``exc`` raised by statement ``text``: severity, SQLSTATE,
    message, and where sparkiq knows them the position, the detail (the caret snippet) and a
    hint (the closest names)."""
    state = sqlstate(exc)
    if state == "XX000":
        error_id = next(_error_ids)
        log.error("pg statement failed (error id %d)", error_id, exc_info=exc)
        message = f"internal error (error id {error_id}); see the node's log"
    else:
        message = getattr(exc, "message", None) or str(exc)
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
