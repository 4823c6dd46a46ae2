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

This module imports nothing from the rest of the package, so every layer may use it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AuthenticationError",
    "ChangelogError",
    "ConfigError",
    "CorruptSegmentError",
    "ForbiddenError",
    "InvalidQueryError",
    "LayoutMismatchError",
    "NodeUnreachableError",
    "ReadOnlyError",
    "SchemaError",
    "SparkiqError",
    "StoreError",
    "UnknownStoreError",
]


class SparkiqError(Exception):
    """Root of every exception sparkiq raises on purpose.

    ``store``, ``partition`` and ``position`` say where the problem is, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        store: str | None = None,
        partition: int | None = None,
        position: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.store = store
        self.partition = partition
        self.position = position


class ConfigError(SparkiqError, ValueError):
    """An argument, option or environment variable has an invalid value."""


class SchemaError(ConfigError):
    """A DataFrame or schema cannot be materialized as requested."""


class LayoutMismatchError(ConfigError):
    """``state_dir`` already holds a table of this name with another layout."""


class UnknownStoreError(SparkiqError, LookupError):
    """No materialized table (store) has the requested name."""


class InvalidQueryError(SparkiqError, ValueError):
    """A query's key or bounds do not fit the table's key columns."""


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


class ForbiddenError(SparkiqError, PermissionError):
    """The caller is known but its principal has no grant for a table it asked to read."""


class NodeUnreachableError(SparkiqError):
    """A node did not answer (refused, reset, timed out); routers try another replica."""
