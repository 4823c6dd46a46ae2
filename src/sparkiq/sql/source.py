"""What the SQL engine reads from: anything that names tables and answers state queries.

A :class:`~sparkiq.Node` is one (it answers from its own replicas and, in a cluster, routes
per-partition sub-requests to other nodes); so is any object with these four members. The
engine sends every read through :meth:`QuerySource.query` with a typed query object, so
whatever it pushes down reaches the node hosting each partition.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.types import TableSchema

__all__ = ["QuerySource"]


@runtime_checkable
class QuerySource(Protocol):
    """The engine's view of a node (or router)."""

    @property
    def tables(self) -> list[str]:
        """Names of the materialized tables that can be queried."""
        ...

    def schema(self, store: str) -> TableSchema:
        """Columns, key columns and window column of ``store``."""
        ...

    def partition_count(self, store: str) -> int:
        """The number of partitions of ``store`` (hosted anywhere)."""
        ...

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Per-partition results of ``request``; failures are values, never exceptions."""
        ...
