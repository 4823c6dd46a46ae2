"""What the SQL engine reads from: anything that names tables and answers state queries.

A :class:`~sparkiq.Node` is one (it answers from its own replicas and, in a cluster, routes
per-partition sub-requests to other nodes); so is any object with these four members. The
engine sends every read through :meth:`QuerySource.query` with a typed query object, so
whatever it pushes down reaches the node hosting each partition.

A source that reads a key it holds itself (:class:`LocalKeySource`) lets a key lookup skip
the request: the engine asks it first and sends a request only for a key it does not read
itself.

A source that can also hand over every partition of a table as Arrow, at one batch, where
the engine runs (:class:`ColumnarSource`: a node hosting the whole table) lets the engine run
a statement as one DuckDB query over those rows, without per-partition fragments.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from sparkiq.query.position import Position, PositionBound
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema

__all__ = ["ColumnarSource", "LocalKeySource", "LocalRows", "QuerySource", "partitioner_of"]


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


def partitioner_of(source: QuerySource, store: str, schema: TableSchema) -> Partitioner:
    """How ``store`` places keys in partitions: what the source says when it says
    (``source.partitioner(store)``: a table followed from a Kafka topic places keys by
    Kafka's murmur2), else Spark's hash partitioning of the key columns."""
    placed = getattr(source, "partitioner", None)
    if placed is not None:
        return placed(store)  # type: ignore[no-any-return]
    return Partitioner(schema.key_types, source.partition_count(store))


@dataclass(frozen=True, slots=True)
class LocalRows:
    """Every partition of a table at ``batch_id``, without copying: ``raw`` holds each
    candidate row with its validity columns
    (:data:`~sparkiq.stores.versions.VALID_FROM` / :data:`~sparkiq.stores.versions.VALID_TO`);
    the table's rows at the batch are those with ``valid_from <= batch_id < valid_to``."""

    raw: pa.Table
    batch_id: int
    position: Position


@runtime_checkable
class ColumnarSource(Protocol):
    """A source that can read a whole table where the engine runs."""

    def local_rows(
        self, store: str, at_batch: int | None, bound: PositionBound
    ) -> LocalRows | None:
        """Every partition of ``store`` at ``at_batch`` (None: the newest batch all of them
        can serve, not below ``bound``), or None when this source cannot read them all
        here now (the engine then reads per partition, which reports why)."""
        ...

    def batch_at_time(self, store: str, when: dt.datetime) -> int:
        """The batch of ``store`` that was current at ``when`` (``AS OF TIMESTAMP``)."""
        ...


@runtime_checkable
class LocalKeySource(Protocol):
    """A source that reads a key without a request when it holds the key's partition."""

    def read_here(self, store: str, key: Any) -> tuple[dict[str, Any] | None, Position, int] | int:
        """``(row, position, partition)`` of ``key`` when this source holds its partition
        and reads it now exactly as a ``KeyQuery`` request would be answered (caught up,
        the built-in key handler, no bound or batch asked); otherwise the key's partition,
        which the engine's request then names (the key is located once)."""
        ...
