"""Followers: a read-only copy of another application's table, kept current in any process.

The follower-store KIP's idea, for Spark: the application that materializes a table owns
its changelog; any other Python process (another service, a notebook, a second Spark
application's driver or executors) can *follow* it::

    follower = sparkiq.follow("/data/shop", "revenue_by_product",
                              where=lambda row: row["revenue"] > 100, columns=["revenue"])
    follower.get("p-17")        # {'product': 'p-17', 'revenue': 123.0}, or None
    follower.position           # what it has applied, as a Position

A follower restores from the newest snapshot plus the later segments, then keeps tailing in
a background thread, and answers the same typed queries as a :class:`~sparkiq.Node`, with
its own position. It may hold a *subset* of the table: some partitions, the rows a ``where``
filter accepts, some columns. Each changelog row is filtered and projected on its way in, so
the subset costs no more disk or memory than its size.

Guarantees: a follower opens the changelog read-only (every write raises
:class:`~sparkiq.errors.ReadOnlyError`) and never creates, changes or locks a file under the
owner's ``state_dir``; the owner never waits for, nor knows about, its followers, so their
existence, lag or crashes cannot affect it.

Local directory, format version 1 (:data:`MARKER_VERSION`)
    ``<local_dir>/<table>/follower.json`` records which subset the local files hold:
    ``{"format": "follower", "version": 1, "table", "columns", "where", "partitions"}``, where
    ``columns`` is the list of kept columns (null: all) and ``where`` identifies the filter
    (its qualified name and a hash of its bytecode; null: none). It is written after the
    partitions' stores are opened and before anything is applied; when it is missing or its
    ``columns``/``where`` differ from the follower being opened, ``<local_dir>/<table>`` is
    deleted (marker first, so an interrupted deletion is never mistaken for a valid copy)
    and rebuilt. ``partitions`` is informative only: each partition's store is independent
    of which others are followed, so following another set of partitions reuses what
    exists. Next to it, :func:`~sparkiq.changelog.replica.rocksdb_factory` keeps
    ``replica.json`` (the changelog incarnation) and one RocksDB per partition in
    ``<partition:05d>/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sparkiq.changelog import Changelog, open_storage
from sparkiq.changelog.replica import ReplicaStatus, TableReplica
from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.query.position import Position
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.codec import RowCodec
from sparkiq.serving.config import NOT_GIVEN, NodeConfig, resolve_group
from sparkiq.serving.handle import ReplicaHandle
from sparkiq.serving.hosting import Hosting, TableView
from sparkiq.serving.lookup import Lookup
from sparkiq.serving.subset import RowFilter, SubsetTransform, check_partitions, identify, project
from sparkiq.sql import SqlEngine, SqlLimits, SqlResult

__all__ = ["MARKER_VERSION", "Follower", "follow"]

log = logging.getLogger("sparkiq.follower")

MARKER_VERSION = 1
_MARKER = "follower.json"


def follow(
    state_dir: str,
    table: str,
    *,
    partitions: Iterable[int] | None = None,
    where: RowFilter | None = None,
    columns: Iterable[str] | None = None,
    local_dir: str | None = None,
    store: str = "rocksdb",
    poll_interval: float = 0.05,
    sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
    start: bool = True,
) -> Follower:
    """Follow table ``table`` of the application writing ``state_dir``; see :class:`Follower`."""
    return Follower(
        state_dir,
        table,
        partitions=partitions,
        where=where,
        columns=columns,
        local_dir=local_dir,
        store=store,
        poll_interval=poll_interval,
        sql_limits=sql_limits,
        start=start,
    )


class Follower(ReplicaHandle):
    """A read-only, optionally partial replica of one table, tailing its changelog.

    - ``partitions``: the partition numbers to follow (default: all). Queries for the others
      fail with ``NOT_PRESENT``; :meth:`get` raises for a key that lives in one of them.
    - ``where``: a function of the full row (a dict, as ``Row.asDict(recursive=True)``) that
      says whether to keep it. A row it rejects is stored as a deletion, so a key leaves the
      subset when its row stops matching and comes back when it matches again. It must be
      deterministic and must accept every row without raising: if it raises, the partition
      stops at the batch before (``status()`` says why) and keeps serving that state.
    - ``columns``: the columns to keep; the key columns and the window column are always
      kept. Rows are returned with the kept columns in table order.
    - ``local_dir``: where the RocksDB files live; never inside ``state_dir``. By default a
      fresh temporary directory, deleted by :meth:`close`, so every follower restores from
      the changelog. Pass a directory to resume across restarts from where the last run
      stopped instead. The subset (columns and filter) is recorded there and a directory
      built for another subset is rebuilt; a filter is recognized by its name and bytecode,
      not by the values it captures, so give a new ``local_dir`` when only those change.
    - ``store``: ``"rocksdb"`` (default) or ``"memory"`` (nothing on disk; no ``local_dir``).
    - ``poll_interval``: seconds between checks for new commits; ``start=False`` does not
      start the background thread (call :meth:`poll_once` or :meth:`start` yourself).
    - ``sql_limits``: the limits of :meth:`sql` (a :class:`~sparkiq.sql.SqlLimits`, or a
      mapping of some of its fields), then ``SPARKIQ_SQL_<NAME>`` variables, as a node's.

    Thread-safe: queries run concurrently with tailing, each partition answering from its
    last applied batch with the position it is at. :meth:`close` stops tailing and closes
    the stores; the follower cannot be used afterwards.
    """

    def __init__(
        self,
        state_dir: str,
        table: str,
        *,
        partitions: Iterable[int] | None = None,
        where: RowFilter | None = None,
        columns: Iterable[str] | None = None,
        local_dir: str | None = None,
        store: str = "rocksdb",
        poll_interval: float = 0.05,
        sql_limits: SqlLimits | Mapping[str, Any] | None = NOT_GIVEN,
        start: bool = True,
    ) -> None:
        self.changelog = Changelog(state_dir, table, read_only=True)
        manifest = self.changelog.manifest()  # UnknownStoreError naming the tables there
        self.state_dir = state_dir
        self.table = table
        self._partitions = check_partitions(table, manifest.partitions, partitions)
        if where is not None and not callable(where):
            raise ConfigError(
                f"where must be a function of a row dict returning a bool, got {where!r}",
                store=table,
            )
        self.schema, kept = project(table, manifest.schema, columns)
        self._subset = {
            "columns": None if kept is None else list(self.schema.column_names),
            "where": identify(where),
        }
        transform = None
        if where is not None or kept is not None:
            transform = SubsetTransform(table, RowCodec(manifest.schema), where, kept)
        # the same checks and messages as a node's settings; no SPARKIQ_* variable applies
        NodeConfig.resolve(state_dir, environ={}, store=store, poll_interval=poll_interval)
        # the SQL limits of a node: keyword, then SPARKIQ_SQL_<NAME>, then defaults
        self._sql_limits: SqlLimits = resolve_group("sql_limits", sql_limits)
        if store == "memory" and local_dir is not None:
            raise ConfigError(
                "local_dir is only used with store='rocksdb'; a memory follower keeps nothing "
                "on disk",
                store=table,
            )
        local_dir = self._local_dir(local_dir, store, prefix=f"sparkiq-follower-{table}-")
        self.local_dir = local_dir
        self.poll_interval = poll_interval
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        try:
            if local_dir is not None:
                _check_outside(state_dir, local_dir, table)
            followed = self._partitions
            self._hosting = Hosting(
                state_dir,
                node_id=f"follower-{table}",
                placement=lambda _table, _count: followed,
                local_dir=local_dir,
                store=store,
                poll_interval=poll_interval,
                tables=[table],
                views={table: TableView(self.schema, transform)},
                read_only=True,
            )
            self._lookup = Lookup(
                self._hosting, node_id=f"follower-{table}", sql_limits=self._sql_limits
            )
            self._sql: SqlEngine | None = None
            if local_dir is not None:
                self._discard_other_subset(local_dir)
            self._hosting.refresh_tables()  # opens the stores; nothing is applied yet
            self._replica: TableReplica = self._hosting.replica(table)
            if local_dir is not None:
                self._write_marker(local_dir)
        except BaseException:
            self._release()
            raise
        if start:
            self.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Follower:
        """Start tailing in a background thread (done on creation unless ``start=False``)."""
        self._require_open()
        with self._poll_lock:
            if self._thread is None:
                self._stop.clear()
                self._thread = threading.Thread(
                    target=self._run, name=f"sparkiq-follower-{self.table}", daemon=True
                )
                self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self.poll_once()

    def poll_once(self) -> int:
        """Apply what was committed since the last poll, now; return the (partition, batch)
        applications made. Safe to call while the background thread runs."""
        with self._poll_lock:
            if self._closed:
                return 0
            return self._hosting.poll_once()

    def close(self) -> None:
        """Stop tailing, close the stores and delete a temporary ``local_dir``. Idempotent."""
        with self._poll_lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None:
            thread.join()
        self._release()

    def _require_open(self) -> None:
        if self._closed:
            raise SparkiqError(f"the follower of {self.table!r} is closed", store=self.table)

    # -- what it holds -----------------------------------------------------------------------

    @property
    def partitions(self) -> tuple[int, ...]:
        """The followed partition numbers, ascending."""
        return self._partitions

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of the rows this follower returns, in table order."""
        return self.schema.column_names

    @property
    def position(self) -> Position:
        """The merged position of the followed partitions (what has been applied)."""
        self._require_open()
        return self._hosting.position(self.table)

    @property
    def batch_id(self) -> int:
        """The newest batch every followed partition has applied (-1: none yet)."""
        self._require_open()
        return min(r.batch_id for r in self._replica.partitions.values())

    def status(self) -> list[ReplicaStatus]:
        """Progress and health of each followed partition."""
        return self._hosting.status()

    def wait_for(self, batch_id: int, timeout: float | None = None) -> bool:
        """Block until every followed partition applied ``batch_id``; False on timeout or
        when a partition is stuck on an error (see :meth:`status`)."""
        self._require_open()
        if self._thread is not None:
            return self._hosting.wait_for(self.table, batch_id, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self.poll_once()
            replicas = self._replica.partitions.values()
            if min(r.batch_id for r in replicas) >= batch_id:
                return True
            if any(r.error for r in replicas):
                return False
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_interval)

    # -- queries -----------------------------------------------------------------------------

    def get(self, key: Any) -> dict[str, Any] | None:
        """The row of ``key`` in the subset, or None (absent, or filtered out)."""
        self._require_open()
        return self._lookup.get(self.table, key)

    def get_with_position(self, key: Any) -> tuple[dict[str, Any] | None, Position]:
        """The row of ``key`` (or None) and the position of its partition it was read at."""
        self._require_open()
        return self._lookup.get_with_position(self.table, key)

    def get_encoded(self, key: Any) -> tuple[bytes | None, Position]:
        """Like :meth:`get_with_position`, with the row in the changelog's row encoding
        (:mod:`sparkiq.schema.rowcodec`, the columns of :attr:`schema`), undecoded."""
        self._require_open()
        location = self._lookup.locate(self.table, key)
        partition, hosted = location.partition, location.store
        if hosted is None:
            raise SparkiqError(
                f"partition {partition} of {self.table!r}, which holds key {key!r}, is not "
                f"followed here (partitions {list(self._partitions)})",
                store=self.table,
                partition=partition,
            )
        return hosted.get_raw(hosted.keys.encode(location.internal))

    def partition_for_key(self, key: Any) -> int:
        return self._lookup.partition_for_key(self.table, key)

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer an IQv2-style request on this table; failures are per partition
        (``NOT_PRESENT`` for partitions not followed)."""
        self._require_open()
        return self._lookup.query(request)

    def sql(self, text: str, **options: Any) -> SqlResult:
        """A SQL pull query over the followed subset (its columns, the rows its filter keeps),
        like :meth:`sparkiq.Node.sql`. A statement that must read a partition this follower
        does not follow fails with :class:`sparkiq.sql.SqlPartitionError` naming it."""
        self._require_open()
        engine = self._sql
        if engine is None:  # a race builds two engines; either serves
            engine = self._sql = SqlEngine(self._lookup, self._sql_limits)
        return engine.execute(text, **options)

    # -- local directory ---------------------------------------------------------------------

    def _marker_path(self, local_dir: str) -> str:
        return os.path.join(local_dir, self.table, _MARKER)

    def _discard_other_subset(self, local_dir: str) -> None:
        table_dir = os.path.join(local_dir, self.table)
        if not os.path.isdir(table_dir):
            return
        marker = self._marker_path(local_dir)
        try:
            with open(marker) as handle:
                built = json.load(handle)
        except (FileNotFoundError, ValueError):
            built = None
        if (
            built is not None
            and built.get("version") == MARKER_VERSION
            and all(built.get(k) == v for k, v in self._subset.items())
        ):
            return
        log.warning(
            "%s: discarding %s, built for another subset (%s; now %s)",
            self.table,
            table_dir,
            None if built is None else {k: built.get(k) for k in self._subset},
            self._subset,
        )
        if os.path.exists(marker):
            os.remove(marker)
        shutil.rmtree(table_dir)

    def _write_marker(self, local_dir: str) -> None:
        doc = {
            "format": "follower",
            "version": MARKER_VERSION,
            "table": self.table,
            **self._subset,
            "partitions": list(self._partitions),
        }
        path = self._marker_path(local_dir)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as handle:
            json.dump(doc, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    def __repr__(self) -> str:
        return (
            f"Follower({self.state_dir!r}, {self.table!r}, partitions={list(self._partitions)}, "
            f"columns={list(self.columns)}, local_dir={self.local_dir!r})"
        )


def _check_outside(state_dir: str, local_dir: str, table: str) -> None:
    storage = open_storage(state_dir)
    if not storage.is_local:
        return
    root = os.path.realpath(storage.root)
    mine = os.path.realpath(local_dir)
    if os.path.commonpath([root, mine]) == root:
        raise ConfigError(
            f"local_dir {local_dir!r} is inside state_dir {state_dir!r}: a follower never "
            "writes under the owner's state_dir; choose a directory outside it",
            store=table,
        )
