"""What the read-only handles on local replicas share: a follower
(:class:`~sparkiq.serving.follower.Follower`), an attached checkpoint
(:class:`~sparkiq.serving.attach.Attached`) and a followed Kafka topic
(:class:`~sparkiq.serving.topic.FollowedTopic`).

Each holds a :class:`~sparkiq.serving.hosting.Hosting` of its own and, for RocksDB stores
without a ``local_dir``, a temporary directory that only it uses; closing the handle closes
the hosting and deletes that directory. Subclasses define :meth:`close` (what stops first
differs) and call :meth:`_release` from it. :class:`QueryableHandle` adds what a handle
answering every query path through a :class:`~sparkiq.serving.lookup.Lookup` offers.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any, Self

from sparkiq.changelog.replica import ReplicaStatus
from sparkiq.errors import SparkiqError
from sparkiq.query.position import Position
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.serving.hosting import Hosting
from sparkiq.serving.lookup import Lookup
from sparkiq.sql import SqlEngine, SqlLimits, SqlResult

__all__ = ["QueryableHandle", "ReplicaHandle"]


class ReplicaHandle:
    """The lifecycle a read-only handle on local replicas shares with the others."""

    _hosting: Hosting
    _temporary: str | None = None

    def _local_dir(self, local_dir: str | None, store: str, prefix: str) -> str | None:
        """``local_dir``, or, for RocksDB stores given none, a new temporary directory that
        :meth:`_release` deletes."""
        if store == "rocksdb" and local_dir is None:
            local_dir = self._temporary = tempfile.mkdtemp(prefix=prefix)
        return local_dir

    def close(self) -> None:
        raise NotImplementedError

    def _release(self) -> None:
        """Close the hosting (if it was built) and delete a temporary ``local_dir``."""
        hosting = getattr(self, "_hosting", None)
        if hosting is not None:
            hosting.close()
        if self._temporary is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QueryableHandle(ReplicaHandle):
    """A handle answering typed queries and SQL over its own replicas (an attached
    checkpoint, a followed topic). Subclasses set ``_lookup`` and ``_sql_limits`` and say in
    :meth:`_closed_message` what was closed."""

    _lookup: Lookup
    _sql_limits: SqlLimits
    _sql: SqlEngine | None = None
    _closed = False

    def _closed_message(self) -> str:
        raise NotImplementedError

    def _require_open(self) -> None:
        if self._closed:
            raise SparkiqError(self._closed_message())

    def start(self) -> Self:
        """Start tailing in a background thread."""
        self._require_open()
        self._hosting.start_tailing()
        return self

    @property
    def tables(self) -> list[str]:
        """The tables it holds, sorted."""
        return self._hosting.tables

    @property
    def batch_id(self) -> int:
        """The newest batch every partition of every table has applied (-1: none)."""
        self._require_open()
        applied = [r.batch_id for t in self._hosting.replicas() for r in t.partitions.values()]
        return min(applied, default=-1)

    def status(self) -> list[ReplicaStatus]:
        """Progress and health of each partition (``error`` names what it cannot read)."""
        return self._hosting.status()

    def get(self, table: str, key: Any) -> dict[str, Any] | None:
        """The row of ``key`` in ``table``, or None."""
        self._require_open()
        return self._lookup.get(table, key)

    def get_with_position(self, table: str, key: Any) -> tuple[dict[str, Any] | None, Position]:
        self._require_open()
        return self._lookup.get_with_position(table, key)

    def partition_for_key(self, table: str, key: Any) -> int:
        """The partition holding ``key``, by the table's own placement (Spark's Murmur3 for
        Spark's state, Kafka's murmur2 over the key bytes for a followed topic)."""
        return self._lookup.partition_for_key(table, key)

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer an IQv2-style request (bounded by ``PositionBound.after(...)`` for
        read-your-writes)."""
        self._require_open()
        return self._lookup.query(request)

    def sql(self, text: str, **options: Any) -> SqlResult:
        """A SQL pull query over its tables, like :meth:`sparkiq.Node.sql`."""
        self._require_open()
        engine = self._sql
        if engine is None:  # a race builds two engines; either serves
            engine = self._sql = SqlEngine(self._lookup, self._sql_limits)
        return engine.execute(text, **options)
