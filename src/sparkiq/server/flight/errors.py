"""The Flight errors the endpoint answers with.

pyarrow turns an exception raised by a handler into the call's gRPC status. A
``FlightError`` subclass goes out as its message alone, with its own status; any other
exception (``ArrowInvalid`` for INVALID_ARGUMENT, ``ArrowKeyError`` for NOT_FOUND...) goes
out with a Python traceback of the server appended, which a client shows to its user. So
every refusal is a Flight error, and a bad request is :func:`refused` (UNKNOWN) with
sparkiq's error code in brackets before the message instead of a finer status:

| error | status |
|---|---|
| wrong or missing credentials | UNAUTHENTICATED |
| a table outside the principal's grants | PERMISSION_DENIED |
| a statement over its time limit | DEADLINE_EXCEEDED |
| a node fault, too many statements at once | UNAVAILABLE |
| a bad statement, limit, write, command or ticket | UNKNOWN |
"""

from __future__ import annotations

from typing import Any

import pyarrow.flight as flight

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import AuthenticationError, ForbiddenError, SparkiqError

__all__ = ["flight_error", "read_only", "refused"]


def refused(text: str) -> Exception:
    """A refused request: UNKNOWN, ``text`` as the client sees it."""
    error: Exception = flight.FlightServerError(text)
    return error


def read_only(what: str) -> Exception:
    """The refusal of a write, ingestion, transaction or Substrait plan (``what``)."""
    return refused(
        f"[read_only] {what} is refused: sparkiq's Flight SQL endpoint is read-only (pull "
        "queries and catalog calls); the tables are written by their Spark queries"
    )


def flight_error(exc: SparkiqError) -> Exception:
    """The Flight error of a sparkiq error (see the module docstring)."""
    text = f"[{exc.code.wire}] {exc.message}"
    kind: Any = flight.FlightUnavailableError  # a node fault
    if isinstance(exc, ForbiddenError):
        kind = flight.FlightUnauthorizedError
    elif isinstance(exc, AuthenticationError):
        kind = flight.FlightUnauthenticatedError
    elif exc.code in (ErrorCode.TIMEOUT, ErrorCode.REQUEST_TIMEOUT):
        kind = flight.FlightTimedOutError
    elif 400 <= exc.code.status < 500:
        kind = flight.FlightServerError
    error: Exception = kind(text)
    return error
