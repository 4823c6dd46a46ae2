"""A serving node: hosts replicas of the tables in a ``state_dir`` and answers queries.

This node hosts every partition of every table it finds (the embedded mode the
:class:`~sparkiq.App` starts). A background thread tails the changelog; an in-process writer
may also :meth:`Node.notify` it right after a commit so that new batches become queryable
without waiting for the next poll.

Queries never block on the tailer: each partition answers from its last applied batch, with
the position it is at.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog import Changelog, list_tables, open_storage
from sparkiq.changelog.replica import (
    ReplicaStatus,
    RowTransform,
    StoreFactory,
    TableReplica,
    memory_factory,
    rocksdb_factory,
)
from sparkiq.errors import ConfigError, SparkiqError, UnknownStoreError
from sparkiq.query.position import Position
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.stores.dispatch import QueryContext, execute
from sparkiq.stores.partition import PartitionStore

__all__ = ["Node", "TableView"]

log = logging.getLogger("sparkiq.node")

_PLAIN_CONTEXT = QueryContext()


@dataclass(frozen=True, slots=True)
class TableView:
    """How a node holds one table when not as stored: ``schema`` is the schema of the rows it
    keeps and ``transform`` maps each changelog row to such a row, or to None to drop it (see
    :data:`~sparkiq.changelog.replica.RowTransform`; it must be deterministic). Followers use
    it to keep a filtered and projected subset."""

    schema: TableSchema | None = None
    transform: RowTransform | None = None


_AS_STORED = TableView()


class Node:
    """Hosts replicas of the tables under ``state_dir`` and answers queries on them.

    ``local_dir`` holds the replicas' RocksDB files (default: ``<state_dir>/replicas/<node_id>``
    for a local ``state_dir``; required for a remote one). ``store="memory"`` keeps replicas
    in memory instead (nothing survives a restart). ``poll_interval`` is how often, in seconds,
    the changelog is checked for new commits. ``partitions`` limits what is hosted:
    ``{"table": [0, 3]}`` hosts only those partitions of that table (tables not named are
    hosted whole); queries for other partitions fail with ``NOT_PRESENT``. ``tables`` limits
    the hosted tables to those named (default: every table in ``state_dir``); ``views`` holds
    a table as a :class:`TableView` instead of as stored. Nodes never write the changelog:
    by default (``read_only=True``) every changelog is opened read-only, so any write
    through a node raises :class:`~sparkiq.errors.ReadOnlyError`.
    """

    def __init__(
        self,
        state_dir: str,
        *,
        node_id: str = "local",
        local_dir: str | None = None,
        store: str = "rocksdb",
        poll_interval: float = 0.02,
        partitions: Mapping[str, Iterable[int]] | None = None,
        tables: Iterable[str] | None = None,
        views: Mapping[str, TableView] | None = None,
        read_only: bool = True,
    ) -> None:
        self.state_dir = state_dir
        self._hosted_tables = None if tables is None else frozenset(tables)
        self._views = dict(views or {})
        self._read_only = read_only
        self._only = {t: frozenset(ps) for t, ps in (partitions or {}).items()}
        self.node_id = node_id
        storage = open_storage(state_dir)
        if store not in ("rocksdb", "memory"):
            raise ConfigError(f"store must be 'rocksdb' or 'memory', got {store!r}")
        if local_dir is None and store == "rocksdb":
            if not storage.is_local:
                raise ConfigError(
                    f"state_dir {state_dir!r} is remote: pass local_dir= (or SPARKIQ_LOCAL_DIR) "
                    "for the replicas' local RocksDB files"
                )
            local_dir = os.path.join(storage.root, "replicas", node_id)
        self.local_dir = local_dir
        self.store_kind = store
        if not (isinstance(poll_interval, int | float) and poll_interval > 0):
            raise ConfigError(f"poll_interval must be a positive number, got {poll_interval!r}")
        self.poll_interval = float(poll_interval)
        self._tables: dict[str, TableReplica] = {}
        # Per table: the key codec, the partitioner and the hosted partitions by number
        # (None where not hosted): everything a key lookup needs, in one dict lookup.
        self._routes: dict[str, tuple[KeyCodec, Partitioner, list[PartitionStore | None]]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._applied = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()
        self._poll_lock = threading.Lock()
        self._sql: Any = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Node:
        """Open the replicas of every table in ``state_dir`` and start tailing. Idempotent."""
        with self._lock:
            if self._thread is not None:
                return self
            self.refresh_tables()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"sparkiq-tailer-{self.node_id}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop tailing and close every replica. Idempotent."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join()
        with self._lock:
            for replica in self._tables.values():
                replica.close()
            self._tables.clear()
            self._routes.clear()

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refresh_tables(self) -> list[str]:
        """Host any table that appeared in ``state_dir`` since the last call; return new ones."""
        added = []
        for name in list_tables(self.state_dir):
            if self._hosted_tables is not None and name not in self._hosted_tables:
                continue
            if name not in self._tables:
                self._host(name)
                added.append(name)
        return added

    def _host(self, name: str) -> None:
        changelog = Changelog(self.state_dir, name, read_only=self._read_only)
        manifest = changelog.manifest()
        factory: StoreFactory
        if self.store_kind == "memory":
            factory = memory_factory
        else:
            assert self.local_dir is not None
            factory = rocksdb_factory(self.local_dir, manifest)
        hosted = self._only.get(name, range(manifest.partitions))
        view = self._views.get(name, _AS_STORED)
        replica = TableReplica(
            changelog,
            hosted,
            factory,
            on_progress=self.write_status_file,
            schema=view.schema,
            transform=view.transform,
        )
        with self._lock:
            self._tables[name] = replica
            stores: list[PartitionStore | None] = [None] * manifest.partitions
            for partition, hosted_replica in replica.partitions.items():
                stores[partition] = hosted_replica.store
            self._routes[name] = (
                KeyCodec(replica.schema),
                Partitioner(replica.schema.key_types, manifest.partitions),
                stores,
            )

    def notify(self, table: str | None = None) -> None:
        """Tell the tailer a batch was just committed, so it polls now."""
        self._wake.set()

    def _run(self) -> None:
        last_refresh = time.monotonic()
        while not self._stop.is_set():
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.poll_once()
            if time.monotonic() - last_refresh > 1.0:
                last_refresh = time.monotonic()
                self.write_status_file()
                try:
                    self.refresh_tables()
                except Exception:  # a half-created table: try again next time
                    log.exception("refreshing tables of %s failed", self.state_dir)

    def poll_once(self) -> int:
        """Apply whatever was committed since the last poll; return the applications made.

        Safe to call while the background tailer runs: polls are serialized (each table has
        one writer thread at a time), so when this returns, everything committed before the
        call has been applied or has failed visibly in :meth:`status`.
        """
        applied = 0
        with self._poll_lock:
            for replica in list(self._tables.values()):
                try:
                    applied += replica.poll()
                except Exception:
                    log.exception("tailing %s failed; retrying on the next poll", replica.table)
        if applied:
            with self._applied:
                self._applied.notify_all()
        return applied

    def wait_for(self, table: str, batch_id: int, timeout: float | None = None) -> bool:
        """Block until every hosted partition of ``table`` applied ``batch_id``."""
        replica = self._table(table)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._applied:
            while (
                min((r.batch_id for r in replica.partitions.values()), default=batch_id) < batch_id
            ):
                if any(r.error for r in replica.partitions.values()):
                    return False
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._wake.set()
                self._applied.wait(0.05 if remaining is None else min(0.05, remaining))
        return True

    # -- queries -----------------------------------------------------------------------------

    @property
    def tables(self) -> list[str]:
        return sorted(self._tables)

    def schema(self, store: str) -> TableSchema:
        """The schema of the rows ``store`` answers with (a view's schema for a follower)."""
        return self._route(store)[0].schema

    def partition_count(self, store: str) -> int:
        """How many partitions ``store`` has (hosted here or not)."""
        return len(self._route(store)[2])

    def replica(self, store: str) -> TableReplica:
        """The hosted replica of table ``store`` (its changelog, partitions and stores)."""
        return self._table(store)

    def _table(self, store: str) -> TableReplica:
        try:
            return self._tables[store]
        except KeyError:
            raise self._unknown(store) from None

    def _unknown(self, store: str) -> UnknownStoreError:
        return UnknownStoreError(
            f"unknown store {store!r}; this node serves {sorted(self._tables)}", store=store
        )

    def partition_for_key(self, store: str, key: Any) -> int:
        """The partition holding ``key`` (validates the key against the table's key columns)."""
        codec, partitioner, _ = self._route(store)
        return partitioner(codec.to_internal(key))

    def _route(self, store: str) -> tuple[KeyCodec, Partitioner, list[PartitionStore | None]]:
        try:
            return self._routes[store]
        except KeyError:
            raise self._unknown(store) from None

    def get(self, store: str, key: Any) -> dict[str, Any] | None:
        """The current row of ``key`` in ``store``, or None. The fast path of a KeyQuery."""
        route = self._routes.get(store) or self._route(store)
        internal = route[0].to_internal(key)
        partition = route[1](internal)
        hosted = route[2][partition]
        if hosted is None:
            raise self._not_hosted(store, partition, key)
        return hosted.get(internal)[0]

    def get_with_position(self, store: str, key: Any) -> tuple[dict[str, Any] | None, Position]:
        """Like :meth:`get`, with the position of the partition the row was read at (the
        pair is consistent: the row is exactly the state at that position)."""
        route = self._routes.get(store) or self._route(store)
        internal = route[0].to_internal(key)
        partition = route[1](internal)
        hosted = route[2][partition]
        if hosted is None:
            raise self._not_hosted(store, partition, key)
        return hosted.get(internal)

    def _not_hosted(self, store: str, partition: int, key: Any) -> SparkiqError:
        return SparkiqError(
            f"partition {partition} of {store!r}, which holds key {key!r}, is not hosted on "
            f"node {self.node_id!r}; use query() to get a NOT_PRESENT result instead",
            store=store,
            partition=partition,
        )

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer ``request`` from the partitions hosted here; failures are per partition."""
        codec, partitioner, stores = self._route(request.store)
        count = len(stores)
        query = request.query
        if request.partitions is not None:
            partitions: Iterable[int] = sorted(request.partitions)
        elif query.single_key:
            partitions = (partitioner(codec.to_internal(query.routing_key())),)
        else:
            partitions = range(count)
        if request.bound.is_unbounded and not request.is_execution_info_enabled:
            ctx = _PLAIN_CONTEXT
        else:
            ctx = QueryContext(request.bound, request.is_execution_info_enabled)
        results: dict[int, QueryResult[Any]] = {}
        for partition in partitions:
            hosted = stores[partition] if 0 <= partition < count else None
            if hosted is not None:
                results[partition] = execute(hosted, query, ctx)
            elif 0 <= partition < count:
                results[partition] = QueryResult.for_failure(
                    FailureReason.NOT_PRESENT,
                    f"partition {partition} of {request.store!r} is not hosted on node "
                    f"{self.node_id!r}: ask the node that hosts it",
                )
            else:
                results[partition] = QueryResult.for_failure(
                    FailureReason.DOES_NOT_EXIST,
                    f"{request.store!r} has partitions 0..{count - 1}; partition {partition} "
                    "does not exist",
                )
        return StateQueryResult(results)

    def sql(self, text: str, **options: Any) -> Any:
        """Run a SQL pull query (or ``EXPLAIN``) over the tables this node serves.

        See :meth:`sparkiq.sql.SqlEngine.execute` for ``options`` and the result type.
        """
        engine = self._sql
        if engine is None:
            from sparkiq.sql import SqlEngine

            engine = self._sql = SqlEngine(self)
        return engine.execute(text, **options)

    def status(self) -> list[ReplicaStatus]:
        return [s for r in self._tables.values() for s in r.status()]

    def write_status_file(self) -> None:
        """Write ``<local_dir>/status.json`` (what ``sparkiq status`` shows for this node).

        Format: ``{"node_id", "updated_at", "partitions": [{table, partition, state,
        batch_id, latest_batch_id, lag_batches, restored_rows, restored_bytes, eta_seconds,
        error}]}``. Nodes without a local directory (memory stores) write nothing.
        """
        if self.local_dir is None or self.store_kind != "rocksdb":
            return
        doc = {
            "node_id": self.node_id,
            "updated_at": time.time(),
            "partitions": [
                {
                    "table": s.table,
                    "partition": s.partition,
                    "state": s.state,
                    "batch_id": s.batch_id,
                    "latest_batch_id": s.latest_batch_id,
                    "lag_batches": s.lag_batches,
                    "restored_rows": s.restored_rows,
                    "restored_bytes": s.restored_bytes,
                    "eta_seconds": s.eta_seconds,
                    "error": s.error,
                }
                for s in self.status()
            ],
        }
        path = os.path.join(self.local_dir, "status.json")
        try:
            os.makedirs(self.local_dir, exist_ok=True)
            tmp = f"{path}.tmp"
            with open(tmp, "w") as handle:
                json.dump(doc, handle)
            os.replace(tmp, path)
        except OSError:
            log.debug("cannot write %s", path, exc_info=True)

    def position(self, store: str) -> Position:
        merged = Position.empty()
        for replica in self._table(store).partitions.values():
            merged = merged.merge(replica.store.position)
        return merged
