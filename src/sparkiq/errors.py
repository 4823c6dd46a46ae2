"""Exceptions raised by sparkiq.

Expected query outcomes (a bound not reached, a partition not hosted, an unknown query type)
are *values*: a :class:`~sparkiq.query.QueryResult` with a
:class:`~sparkiq.query.FailureReason`. Exceptions are raised only for programming errors
(bad arguments, unknown stores) and for infrastructure faults (a corrupted changelog file).

Hierarchy::

    SparkiqError                      root; carries store / partition / position when known
    ├── ConfigError (ValueError)      an argument or setting is invalid
    │   ├── SchemaError               a DataFrame or schema cannot be materialized as asked
    │   └── LayoutMismatchError       state_dir holds a table with another layout
    ├── UnknownStoreError (LookupError)   no materialized table has that name
    ├── InvalidQueryError (ValueError)    a key or bound has the wrong type or arity
    ├── ChangelogError                the changelog cannot be read or written
    │   └── CorruptSegmentError       a file's checksum or framing is wrong
    ├── ReadOnlyError (PermissionError)   a reader (follower, node) tried to write a changelog
    ├── StoreError                    a local store (RocksDB) failed
    ├── AuthenticationError (PermissionError)  a missing or wrong bearer token
    ├── ForbiddenError (PermissionError)  the caller's principal may not read a table
    └── NodeUnreachableError          a node did not answer (routers try another replica)

Every error carries an :class:`~sparkiq.error_codes.ErrorCode` (``code``: its class's
default or the raiser's choice) and, where one request field is at fault, ``field``. The
code's row in the table says its HTTP status, SQLSTATE, whether retrying may help and what
to do; every renderer reads it through :func:`error_code`.

This module imports only :mod:`sparkiq.error_codes`, so every layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Self

from sparkiq.error_codes import ErrorCode

__all__ = [
    "AuthenticationError",
    "ChangelogError",
    "ConfigError",
    "CorruptSegmentError",
    "ErrorCode",
    "ForbiddenError",
    "InvalidQueryError",
    "LayoutMismatchError",
    "NodeUnreachableError",
    "ReadOnlyError",
    "SchemaError",
    "SparkiqError",
    "StoreError",
    "UnknownStoreError",
    "as_sparkiq_error",
    "error_code",
    "exception_class",
]


class SparkiqError(Exception):
    """Root of every exception sparkiq raises on purpose.

    ``store``, ``partition`` and ``position`` say where the problem is, when known;
    ``code`` is the error's row in the :class:`ErrorCode` table (the class's default unless
    the raiser names a finer one) and ``field`` the request field at fault, if one is.
    """

    #: A sparkiq fault that is not the caller's: a REST ``503 unavailable``.
    code: ErrorCode = ErrorCode.UNAVAILABLE
    field: str | None = None

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        field: str | None = None,
        store: str | None = None,
        partition: int | None = None,
        position: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = ErrorCode.parse(code)  # a member; a plain string from user code too
        if field is not None:
            self.field = field
        self.store = store
        self.partition = partition
        self.position = position

    @property
    def reply_code(self) -> ErrorCode:
        """The code of this node's answer about the error: its own ``code``, except for an
        error relayed from another node (:class:`~sparkiq.wire.protocol.RemoteError`)."""
        return self.code

    @classmethod
    def from_answer(cls, code: ErrorCode, doc: Mapping[str, Any], status: int) -> Self:
        """The error a client raises for an error answer of HTTP ``status`` whose body's
        ``error`` member is ``doc`` (``code``, ``message``, ``field``...); ``cls`` is the
        code's ``raises`` (see :func:`exception_class`)."""
        field = doc.get("field")
        return cls(
            str(doc.get("message", "")),
            code=code,
            field=field if isinstance(field, str) else None,
        )

    @property
    def retryable(self) -> bool:
        """Whether asking again unchanged (later, or elsewhere) may succeed."""
        return self.code.retryable


class ConfigError(SparkiqError, ValueError):
    """An argument, option or environment variable has an invalid value."""


class SchemaError(ConfigError):
    """A DataFrame or schema cannot be materialized as requested."""


class LayoutMismatchError(ConfigError):
    """``state_dir`` already holds a table of this name with another layout."""


class UnknownStoreError(SparkiqError, LookupError):
    """No materialized table (store) has the requested name."""

    code = ErrorCode.UNKNOWN_STORE
    field = "store"


class InvalidQueryError(SparkiqError, ValueError):
    """A query's key or bounds do not fit the table's key columns."""

    code = ErrorCode.INVALID_QUERY


class ChangelogError(SparkiqError):
    """The changelog cannot be read or written."""


class CorruptSegmentError(ChangelogError):
    """A changelog file failed its checksum or could not be decoded; it is never applied."""


class ReadOnlyError(SparkiqError, PermissionError):
    """A write was attempted through a read-only changelog (a follower's): only the table's
    own Spark query writes its changelog, so readers can never disturb it."""


class StoreError(SparkiqError):
    """A local store failed (I/O error, RocksDB error, closed store)."""


class AuthenticationError(SparkiqError, PermissionError):
    """A request carried no bearer token, or the wrong one, where one is configured."""

    code = ErrorCode.UNAUTHORIZED


class ForbiddenError(SparkiqError, PermissionError):
    """The caller is known but its principal has no grant for a table it asked to read."""

    code = ErrorCode.FORBIDDEN


class NodeUnreachableError(SparkiqError):
    """A node did not answer (refused, reset, timed out); routers try another replica."""

    code = ErrorCode.UPSTREAM_UNAVAILABLE


def as_sparkiq_error(exc: BaseException) -> SparkiqError | None:
    """``exc`` as the sparkiq error an answer reports: itself; for a ``RecursionError`` (only
    input nests that deeply, and the stack has unwound: nothing is broken) a
    ``NESTING_TOO_DEEP`` error; None for anything else, an unexpected fault."""
    if isinstance(exc, SparkiqError):
        return exc
    if isinstance(exc, RecursionError):
        return InvalidQueryError(
            "the request nests too deeply to be read; flatten it", code=ErrorCode.NESTING_TOO_DEEP
        )
    return None


def error_code(exc: BaseException) -> ErrorCode:
    """The code of an answer about ``exc``: its :attr:`~SparkiqError.reply_code`, or
    ``INTERNAL_ERROR`` for an unexpected fault (see :func:`as_sparkiq_error`)."""
    error = as_sparkiq_error(exc)
    return ErrorCode.INTERNAL_ERROR if error is None else error.reply_code


def exception_class(code: ErrorCode) -> type[SparkiqError]:
    """The class a client raises for ``code`` (the table's ``raises``), imported when first
    asked for: the SQL and protocol classes live in modules that import this one."""
    module, _, name = code.raises.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not (isinstance(found, type) and issubclass(found, SparkiqError)):
        raise TypeError(f"{code.raises} is not a SparkiqError")
    return found
