"""Hosting: the replicas a node holds, and the tailer thread that keeps them current.

:class:`Hosting` discovers the tables its catalogs offer (every table under a ``state_dir``,
and the state stores of attached Spark checkpoints: see :mod:`sparkiq.changelog.source`), opens a
:class:`~sparkiq.changelog.replica.TableReplica` for the partitions it is told to hold, applies
committed batches in a background thread (or when :meth:`Hosting.poll_once` is called), and
reports where each partition is. It knows nothing of routing or of other nodes: *which*
partitions to hold comes from a ``placement`` function (all of them, a pinned subset, or a
cluster assignment).

Per table it keeps a :class:`TableRoute`: the key codec, the partitioner and the hosted
partition stores by number -- everything a key lookup needs, in one dict lookup.

Locks, in the order they are taken (never the other way round):

1. ``_refresh_lock`` serializes :meth:`Hosting.refresh_tables` (discovering, hosting and
   dropping whole tables).
2. ``_poll_lock`` serializes applying batches with every change to *which* partitions a
   replica holds (dropping a table, :meth:`Hosting.changing_partitions` for rebalancing): a
   poll never races a partition being added or closed under it. It also guards
   ``_poll_failures`` (the tailing failures logged lately).
3. ``_lock`` guards the ``_tables`` and ``_routes`` dicts themselves (readers take no lock:
   they read a dict entry once, which is atomic, and a closed store fails a racing read with
   a :class:`~sparkiq.errors.StoreError`, never a wrong row).

``_status_file_lock`` serializes writing ``status.json``: the tailer, a restore's progress and
callers of :meth:`Hosting.write_status_file` write it through one temporary file, and two
writers interleaved there left a file a reader could not parse (``sparkiq status`` then said
the node had none). It is taken last, around the file's write only.

``_applied`` (a Condition on its own lock, taken with none of the above held) wakes
:meth:`Hosting.wait_for` after a poll applied something. ``_wake`` and ``_stop`` are Events
that wake and stop the tailer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from sparkiq.changelog.replica import (
    ReplicaStatus,
    RowTransform,
    StoreFactory,
    TableReplica,
    memory_factory,
    rocksdb_factory,
)
from sparkiq.changelog.source import SourceCatalog, StateDirCatalog
from sparkiq.errors import ChangelogError, InvalidQueryError, UnknownStoreError
from sparkiq.query.position import Position
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.keypath import KeyLocator, key_locator
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.serving.metadata import HostedState
from sparkiq.stores.partition import PartitionStore
from sparkiq.topics.keys import table_partitioner

__all__ = ["Hosting", "Placement", "TableRoute", "TableView", "pinned_placement"]

log = logging.getLogger("sparkiq.node")
#: A tailing failure that repeats unchanged is logged again only after this long.
_REPEAT_LOG_SECONDS = 60.0

#: ``placement(table, partition_count)``: the partitions of ``table`` this node should hold.
Placement = Callable[[str, int], Iterable[int]]


def pinned_placement(only: Mapping[str, frozenset[int]]) -> Placement:
    """Placement of a standalone node: every partition, or the ones pinned per table."""

    def placement(table: str, partition_count: int) -> Iterable[int]:
        return only.get(table, range(partition_count))

    return placement


@dataclass(frozen=True, slots=True)
class TableView:
    """How a node holds one table when not as stored: ``schema`` is the schema of the rows it
    keeps and ``transform`` maps each changelog row to such a row, or to None to drop it (see
    :data:`~sparkiq.changelog.replica.RowTransform`; it must be deterministic). Followers use
    it to keep a filtered and projected subset."""

    schema: TableSchema | None = None
    transform: RowTransform | None = None


_AS_STORED = TableView()


@dataclass(frozen=True, slots=True)
class TableRoute:
    """What locating a key of one table needs: its codec and partitioner, and per partition
    number the store hosted here (None where not hosted). ``stores`` is updated in place when
    partitions are added or released (under the hosting's ``_poll_lock``)."""

    codec: KeyCodec
    partitioner: Partitioner
    stores: list[PartitionStore | None]
    windowed: bool  # a plain field, not a property: every key lookup reads it
    #: The table's compiled key path: ``key -> (internal, partition, encoded key)``.
    locate: KeyLocator

    @property
    def schema(self) -> TableSchema:
        return self.codec.schema

    @property
    def partition_count(self) -> int:
        return len(self.stores)

    def partition_of(self, key: object) -> tuple[tuple[object, ...], int]:
        """``(internal key, partition)`` of a user-facing key (validated against the key
        columns: a wrong type raises :class:`~sparkiq.errors.InvalidQueryError`)."""
        internal = self.codec.to_internal(key)
        return internal, self.partitioner(internal)


class Hosting:
    """The replicas of the tables under ``state_dir`` (and in ``catalogs``) that ``placement``
    assigns here.

    ``state_dir`` None hosts only what ``catalogs`` offer; a name offered twice is hosted
    from the first place that offers it (``state_dir`` first). ``local_dir`` holds RocksDB
    files (``store="rocksdb"``); ``store="memory"`` keeps
    nothing on disk. ``tables`` limits which tables are hosted (default: all); ``views``
    holds a table as a :class:`TableView`. Changelogs are opened read-only unless
    ``read_only=False``. ``on_drop(table)`` is called when a table is released because its
    changelog was deleted or recreated. ``status_extra()`` adds its keys to each
    ``status.json`` (the node's Kafka sources).
    """

    def __init__(
        self,
        state_dir: str | None,
        *,
        node_id: str,
        placement: Placement,
        local_dir: str | None,
        store: str,
        poll_interval: float,
        tables: Iterable[str] | None = None,
        views: Mapping[str, TableView] | None = None,
        read_only: bool = True,
        on_drop: Callable[[str], None] | None = None,
        catalogs: Sequence[SourceCatalog] = (),
        status_extra: Callable[[], Mapping[str, object]] | None = None,
    ) -> None:
        self.state_dir = state_dir
        # where tables come from, and which one each hosted table came from: changed under
        # _refresh_lock (and _lock, for _catalog_of)
        self._catalogs: list[SourceCatalog] = [
            *([] if state_dir is None else [StateDirCatalog(state_dir, read_only=read_only)]),
            *catalogs,
        ]
        self._catalog_of: dict[str, SourceCatalog] = {}
        self.node_id = node_id
        self.local_dir = local_dir
        self.store_kind = store
        self.poll_interval = poll_interval
        self._placement = placement
        self._only_tables = None if tables is None else frozenset(tables)
        self._views = dict(views or {})
        self._read_only = read_only
        self._on_drop = on_drop
        self._status_extra = status_extra
        self._tables: dict[str, TableReplica] = {}
        self._routes: dict[str, TableRoute] = {}
        self._refresh_lock = threading.RLock()
        self._poll_lock = threading.Lock()
        # Guarded by _poll_lock: per table, the kind of the last tailing failure logged and
        # when, so a failure that repeats on every poll is logged once a minute, not 20 times
        # a second.
        self._poll_failures: dict[str, tuple[str, float]] = {}
        self._lock = threading.RLock()
        self._status_file_lock = threading.Lock()
        self._applied = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- tables ------------------------------------------------------------------------------

    @property
    def tables(self) -> list[str]:
        return sorted(self._tables)

    def route(self, store: str) -> TableRoute:
        """The route of table ``store``; raises :class:`UnknownStoreError` if not hosted."""
        try:
            return self._routes[store]
        except KeyError:
            raise self.unknown(store) from None

    def routes(self) -> dict[str, TableRoute]:
        """A copy of the routes by table name."""
        return dict(self._routes)

    @property
    def live_routes(self) -> Mapping[str, TableRoute]:
        """The routes by table name, live: the same dict for the hosting's lifetime, its
        entries replaced under ``_lock`` (a reader reads an entry once, atomically)."""
        return self._routes

    def replica(self, store: str) -> TableReplica:
        """The hosted replica of table ``store`` (its changelog, partitions and stores)."""
        try:
            return self._tables[store]
        except KeyError:
            raise self.unknown(store) from None

    def replicas(self) -> list[TableReplica]:
        return list(self._tables.values())

    def unknown(self, store: str) -> UnknownStoreError:
        return UnknownStoreError(
            f"unknown store {store!r}; this node serves {sorted(self._tables)}", store=store
        )

    def refresh_tables(self) -> list[str]:
        """Host any table that appeared in a catalog since the last call; return new ones.

        A table whose changelog was deleted (``DROP TABLE ... DELETE CHANGELOG``) is released;
        one deleted and created again under the same name (a new incarnation) is released and
        hosted anew, so old local state is never mixed with the new changelog. Safe to call
        from any thread (calls are serialized)."""
        with self._refresh_lock:
            present: dict[str, SourceCatalog] = {}
            for catalog in self._catalogs:
                try:
                    names = catalog.names()
                except Exception:  # unreadable for now: keep what it offered before
                    log.exception("%s: cannot list the tables of %r", self.node_id, catalog)
                    names = [n for n, c in self._catalog_of.items() if c is catalog]
                for name in names:
                    present.setdefault(name, catalog)
            for name, replica in list(self._tables.items()):
                offered = present.get(name)
                if offered is not self._catalog_of.get(name) or not self._same_incarnation(
                    offered, replica
                ):
                    self._drop(name)
            added = []
            for name, catalog in sorted(present.items()):
                if self._only_tables is not None and name not in self._only_tables:
                    continue
                if name not in self._tables:
                    self._host(name, catalog)
                    added.append(name)
            return added

    @staticmethod
    def _same_incarnation(catalog: SourceCatalog | None, replica: TableReplica) -> bool:
        fresh = None if catalog is None else catalog.incarnation(replica.table)
        # None: deleted while we looked; the next refresh drops it
        return fresh is None or fresh == replica.manifest.incarnation

    def add_catalog(self, catalog: SourceCatalog) -> list[str]:
        """Offer the tables of one more catalog (an attached checkpoint) and host them now;
        return the tables newly hosted."""
        with self._refresh_lock:
            self._catalogs.append(catalog)
            return self.refresh_tables()

    def _drop(self, name: str) -> None:
        log.info(
            "%s: table %r was dropped or recreated; releasing its replicas", self.node_id, name
        )
        with self._poll_lock, self._lock:
            replica = self._tables[name]
            # Closed before it leaves `tables`: whoever waits for the table to go (DROP TABLE
            # ... DELETE CHANGELOG) then deletes its files, and a store still closing would
            # flush into a directory being deleted. A read racing this fails with a
            # StoreError, never a wrong row.
            try:
                replica.close()
            except Exception:  # released either way: its files are of no further use
                log.warning(
                    "%s: closing the replicas of %r failed", self.node_id, name, exc_info=True
                )
            del self._tables[name]
            self._routes.pop(name, None)
            self._catalog_of.pop(name, None)
            if self._on_drop is not None:
                self._on_drop(name)

    def _host(self, name: str, catalog: SourceCatalog) -> None:
        source = catalog.open(name)
        manifest = source.manifest()
        factory: StoreFactory
        if self.store_kind == "memory":
            factory = memory_factory
        else:
            assert self.local_dir is not None
            factory = rocksdb_factory(self.local_dir, manifest)
        view = self._views.get(name, _AS_STORED)
        replica = TableReplica(
            source,
            self._placement(name, manifest.partitions),
            factory,
            on_progress=self.write_status_file,
            schema=view.schema,
            transform=view.transform,
        )
        stores: list[PartitionStore | None] = [None] * manifest.partitions
        for partition, held in replica.partitions.items():
            stores[partition] = held.store
        codec = KeyCodec(replica.schema)
        partitioner = table_partitioner(replica.schema, manifest.partitions, manifest.partitioning)
        route = TableRoute(
            codec,
            partitioner,
            stores,
            windowed=replica.schema.window_column is not None,
            locate=key_locator(codec, partitioner),
        )
        with self._lock:
            self._tables[name] = replica
            self._routes[name] = route
            self._catalog_of[name] = catalog

    @contextlib.contextmanager
    def changing_partitions(self) -> Iterator[dict[str, TableReplica]]:
        """Hold polls off while the caller adds or releases partitions of the hosted tables
        (the dict it yields; keep each table's :class:`TableRoute` ``stores`` in step)."""
        with self._poll_lock, self._lock:
            yield self._tables

    def close(self) -> None:
        """Stop the tailer, write a last status saying the node stopped (``sparkiq status``
        then tells a stopped node from a live one) and close every replica."""
        self.stop_tailing()
        self.write_status_file(stopped=True)
        with self._poll_lock, self._lock:
            for replica in self._tables.values():
                replica.close()
            self._tables.clear()
            for catalog in self._catalogs:  # one holding resources (a topic's consumer)
                close = getattr(catalog, "close", None)
                if close is not None:
                    close()
            self._routes.clear()

    # -- tailing -----------------------------------------------------------------------------

    def start_tailing(self) -> None:
        """Start the background thread applying new batches (every ``poll_interval`` s or at
        :meth:`wake`) and re-discovering tables every second. Idempotent."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"sparkiq-tailer-{self.node_id}", daemon=True
            )
            self._thread.start()

    def stop_tailing(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join()

    def wake(self) -> None:
        """Make the tailer poll now (a batch was just committed, or partitions were added)."""
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
                    log.exception("refreshing the tables of %s failed", self.node_id)

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
                except Exception as exc:
                    self._log_poll_failure(replica.table, exc)
        if applied:
            with self._applied:
                self._applied.notify_all()
        return applied

    def _log_poll_failure(self, table: str, exc: Exception) -> None:
        # By kind, not by message: a flaky store fails on a different file each poll.
        kind, now = type(exc).__qualname__, time.monotonic()
        last = self._poll_failures.get(table)
        if last is not None and last[0] == kind and now - last[1] < _REPEAT_LOG_SECONDS:
            return
        self._poll_failures[table] = (kind, now)
        log.error(
            "tailing %s failed; retrying on the next poll (failures of this kind are logged "
            "again at most every %.0f s)",
            table,
            _REPEAT_LOG_SECONDS,
            exc_info=exc,
        )

    def wait_for(self, table: str, batch_id: int, timeout: float | None = None) -> bool:
        """Block until every hosted partition of ``table`` applied ``batch_id``; False on
        timeout or when a partition failed."""
        replica = self.replica(table)
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

    def wait_for_commit(self, table: str, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for this node to see a commit of ``table`` newer
        than the newest it has seen (returns early when one is applied, or at the timeout)."""
        replica = self.replica(table)
        seen = replica.latest_batch_id
        deadline = time.monotonic() + timeout
        with self._applied:
            while replica.latest_batch_id <= seen:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._wake.set()
                self._applied.wait(remaining)

    # -- which batch -------------------------------------------------------------------------

    def latest_batch(self, table: str) -> int:
        """The newest batch of ``table`` this node knows is committed (-1: none)."""
        replica = self.replica(table)
        if replica.partitions:
            return replica.latest_batch_id
        return max(replica.source.committed_batch_ids(), default=-1)

    def has_batch(self, table: str) -> bool:
        """Whether ``table`` has a committed batch: the changelog is listed only when no
        poll has seen one yet (a replica that applied none asks, to refuse reads)."""
        if self.latest_batch(table) >= 0:
            return True
        head = self.committed_head(table)
        return head is not None and head >= 0

    def committed_head(self, table: str) -> int | None:
        """The newest batch of ``table`` committed in the changelog now, read from it rather
        than remembered from the last poll (-1: none); None when the changelog cannot be
        listed just now (a storage fault: the caller goes by what the replicas hold, as it
        would have without this look)."""
        try:
            return max(self.replica(table).source.committed_batch_ids(), default=-1)
        except (OSError, ChangelogError) as exc:
            log.info("cannot list %r's commits now: %s", table, exc)
            return None

    def batch_at_time(self, table: str, when: float) -> int:
        """The newest batch of ``table`` committed at or before ``when`` (epoch seconds);
        raises :class:`~sparkiq.errors.InvalidQueryError` when none was. Commit times grow
        with batch ids (one writer per table), so a binary search reads few commit records."""
        source = self.replica(table).source
        batches = source.committed_batch_ids()
        # Compared as datetimes (microseconds), the resolution a caller's time has: a
        # commit time shown as a datetime, given back, must find its own batch.
        at = dt.datetime.fromtimestamp(when, dt.UTC)
        low, high, found = 0, len(batches) - 1, -1
        while low <= high:
            middle = (low + high) // 2
            record = source.read_commit(batches[middle])
            if record is not None and dt.datetime.fromtimestamp(record.committed_at, dt.UTC) <= at:
                found, low = batches[middle], middle + 1
            else:
                high = middle - 1
        if found < 0:
            oldest = batches[0] if batches else None
            raise InvalidQueryError(
                f"no batch of {table!r} was committed at or before "
                f"{dt.datetime.fromtimestamp(when).isoformat()}"
                + (
                    f": the oldest batch in the changelog is {oldest}"
                    if oldest is not None
                    else ": the table has no committed batch yet"
                ),
                store=table,
            )
        return found

    # -- where each partition is -------------------------------------------------------------

    def caught_up(self, table: str, partition: int) -> bool:
        """Whether this node holds ``partition`` of ``table`` healthy and at the newest batch."""
        replica = self._tables.get(table)
        held = None if replica is None else replica.partitions.get(partition)
        if replica is None or held is None or held.error is not None:
            return False
        return held.batch_id >= replica.latest_batch_id

    def status(self) -> list[ReplicaStatus]:
        return [s for r in list(self._tables.values()) for s in r.status()]

    def hosted_state(self) -> HostedState:
        """Per table, per hosted partition: (batch id, state, lag) -- what heartbeats carry."""
        out: HostedState = {}
        for status in self.status():
            out.setdefault(status.table, {})[status.partition] = (
                status.batch_id,
                status.state,
                status.lag_batches,
            )
        return out

    def position(self, store: str) -> Position:
        """The merged position of every hosted partition of ``store``."""
        merged = Position.empty()
        for replica in self.replica(store).partitions.values():
            merged = merged.merge(replica.store.position)
        return merged

    def write_status_file(self, *, stopped: bool = False) -> None:
        """Write ``<local_dir>/status.json`` (what ``sparkiq status`` shows for this node).

        Format: ``{"node_id", "updated_at", "partitions": [{table, partition, state,
        batch_id, latest_batch_id, lag_batches, rows, restored_rows, restored_bytes,
        eta_seconds, error}]}``, and the keys of ``status_extra()``; ``stopped_at`` (epoch
        seconds) once the node has stopped (:meth:`close` writes a last status). Nodes
        without a local directory (memory stores) write nothing.
        """
        if self.local_dir is None or self.store_kind != "rocksdb":
            return
        rows = {
            (table, partition): count
            for table, replica in list(self._tables.items())
            for partition, count in replica.row_counts().items()
        }
        doc: dict[str, object] = {
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
                    "rows": rows.get((s.table, s.partition)),
                    "restored_rows": s.restored_rows,
                    "restored_bytes": s.restored_bytes,
                    "eta_seconds": s.eta_seconds,
                    "error": s.error,
                }
                for s in self.status()
            ],
        }
        if self._status_extra is not None:
            doc.update(self._status_extra())
        if stopped:
            doc["stopped_at"] = doc["updated_at"]
        path = os.path.join(self.local_dir, "status.json")
        try:
            with self._status_file_lock:
                os.makedirs(self.local_dir, exist_ok=True)
                tmp = f"{path}.tmp"
                with open(tmp, "w") as handle:
                    json.dump(doc, handle)
                os.replace(tmp, path)
        except OSError:
            log.debug("cannot write %s", path, exc_info=True)
