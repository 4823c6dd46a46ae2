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
import shutil
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog import Changelog, list_tables, open_storage
from sparkiq.changelog.replica import (
    PartitionReplica,
    ReplicaStatus,
    RowTransform,
    StoreFactory,
    TableReplica,
    memory_factory,
    rocksdb_factory,
)
from sparkiq.cluster.assignment import Assignment
from sparkiq.cluster.coordinator import Coordinator
from sparkiq.cluster.membership import HostedState
from sparkiq.cluster.metadata import HostInfo, KeyQueryMetadata, NodeMetadata
from sparkiq.cluster.transport import HttpTransport, LocalTransport, Transport
from sparkiq.errors import ConfigError, SparkiqError, UnknownStoreError
from sparkiq.query.position import Position
from sparkiq.query.queries import KeyQuery
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
_ENV: Any = object()  # "not given": read the SPARKIQ_* variable


def _env(value: Any, name: str, default: Any) -> Any:
    if value is not _ENV:
        return value
    return os.environ.get(name, default)


def _url(address: str) -> str:
    address = address.strip().rstrip("/")
    return address if "://" in address else f"http://{address}"


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

    **Clustered.** With ``listen`` (``"host:port"``, port 0 picks a free one) the node serves
    the REST API and the node protocol over HTTP; with ``peers`` (seed addresses) or a
    ``transport`` it joins a cluster: partitions are assigned to one active and ``standbys``
    standby nodes by rendezvous hashing over the live members (heartbeats every
    ``heartbeat_interval`` s; a member silent for ``failure_timeout`` s is gone), the node
    hosts only its share, and :meth:`query`/:meth:`get` route to whichever node hosts a
    partition (see :mod:`sparkiq.cluster.router`). ``token`` turns on bearer-token
    authentication for HTTP callers and between nodes. ``advertise`` is the URL other nodes
    and clients use to reach this one (default: from ``listen``). ``listen``, ``peers``
    (comma-separated), ``standbys``, ``token`` and ``node_id`` default to
    ``SPARKIQ_LISTEN``, ``SPARKIQ_PEERS``, ``SPARKIQ_STANDBYS``, ``SPARKIQ_TOKEN`` and
    ``SPARKIQ_NODE_ID``; pass ``None`` to ignore the variable.
    """

    def __init__(
        self,
        state_dir: str,
        *,
        node_id: str = _ENV,
        listen: str | None = _ENV,
        peers: Iterable[str] | None = _ENV,
        standbys: int = _ENV,
        token: str | None = _ENV,
        advertise: str | None = None,
        transport: Transport | None = None,
        heartbeat_interval: float = 0.5,
        failure_timeout: float = 3.0,
        release_grace: float = 5.0,
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
        self.node_id = node_id = _env(node_id, "SPARKIQ_NODE_ID", "local")
        self.listen: str | None = _env(listen, "SPARKIQ_LISTEN", None) or None
        raw_peers = _env(peers, "SPARKIQ_PEERS", "")
        if isinstance(raw_peers, str):
            raw_peers = [p for p in raw_peers.split(",") if p.strip()]
        self.peers = [_url(p) for p in (raw_peers or [])]
        try:
            self.standbys = int(_env(standbys, "SPARKIQ_STANDBYS", 1))
        except ValueError:
            raise ConfigError(f"standbys must be an int, got {standbys!r}") from None
        if self.standbys < 0:
            raise ConfigError(f"standbys must be >= 0, got {self.standbys}")
        self.token: str | None = _env(token, "SPARKIQ_TOKEN", None) or None
        self._advertise = advertise
        self._transport = transport
        self.clustered = bool(self.listen or self.peers or transport is not None)
        if self.clustered and partitions is not None:
            raise ConfigError(
                "partitions= pins what a standalone node hosts; a clustered node (listen=, "
                "peers=) hosts what the assignment gives it"
            )
        self.heartbeat_interval = heartbeat_interval
        self.failure_timeout = failure_timeout
        self.release_grace = release_grace
        self.url: str | None = None
        self.coordinator: Coordinator | None = None
        self._server: Any = None
        # Released partitions, closed once reads in flight are done: (due, table, replica, dir)
        self._retired: list[tuple[float, str, PartitionReplica, str | None]] = []
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
        self._refresh_lock = threading.RLock()
        self._sql: Any = None
        self._hub: Any = None  # push-query subscriptions, created by the first stream()

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Node:
        """Open the replicas of every table in ``state_dir`` and start tailing. Idempotent."""
        with self._lock:
            if self._thread is not None:
                return self
            self.refresh_tables()
            if self.clustered:
                self._start_cluster()
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name=f"sparkiq-tailer-{self.node_id}", daemon=True
            )
            self._thread.start()
        return self

    def _start_cluster(self) -> None:
        import sparkiq.sql  # noqa: F401  (registers SQL fragments, which routers send here)

        sock = None
        if self.listen:
            sock = _bind(self.listen)
            host, port = sock.getsockname()[:2]
            if host in ("0.0.0.0", "::", ""):
                host = socket.gethostname()
            self.url = _url(self._advertise or f"{host}:{port}")
        else:
            self.url = _url(self._advertise or f"local://{self.node_id}")
        transport = self._transport
        if transport is None:
            transport = HttpTransport()
        elif isinstance(transport, LocalTransport):
            transport.register(self.url, self)
        self.coordinator = Coordinator(
            node_id=self.node_id,
            url=self.url,
            seeds=self.peers,
            standbys=self.standbys,
            token=self.token,
            transport=transport,
            heartbeat_interval=self.heartbeat_interval,
            failure_timeout=self.failure_timeout,
            local_answer=self.query_local,
            local_caught_up=self._caught_up,
            hosted_state=self.hosted_state,
            rebalance=self.rebalance,
        )
        if sock is not None:
            from sparkiq.server import start_server

            self._server = start_server(self, sock)
        self.coordinator.start()

    def stop(self) -> None:
        """Stop tailing and close every replica. Idempotent."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            self._wake.set()
            thread.join()
        if self._server is not None:
            self._server.stop()
            self._server = None
        hub, self._hub = self._hub, None
        if hub is not None:  # ends every open subscription with an error carrying its position
            hub.close()
        if self.coordinator is not None:
            if isinstance(self._transport, LocalTransport) and self.url:
                self._transport.unregister(self.url)
            self.coordinator.stop()
            self.coordinator = None
        with self._lock:
            for replica in self._tables.values():
                replica.close()
            self._tables.clear()
            self._routes.clear()
            self._close_retired(force=True)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def refresh_tables(self) -> list[str]:
        """Host any table that appeared in ``state_dir`` since the last call; return new ones.

        A table whose changelog was deleted (``DROP TABLE ... DELETE CHANGELOG``) is released;
        one deleted and created again under the same name (a new incarnation) is released and
        hosted anew, so old local state is never mixed with the new changelog. Safe to call
        from any thread (calls are serialized)."""
        with self._refresh_lock:
            present = set(list_tables(self.state_dir))
            for name, replica in list(self._tables.items()):
                if name not in present or not self._same_incarnation(replica):
                    self._drop(name)
            added = []
            for name in sorted(present):
                if self._hosted_tables is not None and name not in self._hosted_tables:
                    continue
                if name not in self._tables:
                    self._host(name)
                    added.append(name)
            return added

    def _same_incarnation(self, replica: TableReplica) -> bool:
        try:
            fresh = Changelog(self.state_dir, replica.table, read_only=True).manifest()
        except SparkiqError:  # deleted while we looked: the next refresh drops it
            return True
        return fresh.incarnation == replica.manifest.incarnation

    def _drop(self, name: str) -> None:
        log.info(
            "%s: table %r was dropped or recreated; releasing its replicas", self.node_id, name
        )
        with self._poll_lock, self._lock:
            replica = self._tables.pop(name)
            self._routes.pop(name, None)
            for entry in [r for r in self._retired if r[1] == name]:
                entry[2].store.close()
                self._retired.remove(entry)
            replica.close()  # a read racing this fails with a StoreError, never a wrong row

    def _host(self, name: str) -> None:
        changelog = Changelog(self.state_dir, name, read_only=self._read_only)
        manifest = changelog.manifest()
        factory: StoreFactory
        if self.store_kind == "memory":
            factory = memory_factory
        else:
            assert self.local_dir is not None
            factory = rocksdb_factory(self.local_dir, manifest)
        hosted: Iterable[int] = self._only.get(name, range(manifest.partitions))
        if self.clustered:
            coordinator = self.coordinator
            hosted = (
                ()
                if coordinator is None
                else coordinator.assignment.hosted_by(self.node_id, name, manifest.partitions)
            )
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

    # -- cluster: hosting what the assignment says ---------------------------------------------

    def rebalance(self, assignment: Assignment) -> None:
        """Open newly assigned partitions; release those handed off (see the coordinator)."""
        coordinator = self.coordinator
        if coordinator is None:
            return
        added = False
        with self._poll_lock, self._lock:
            for name, replica in self._tables.items():
                count = replica.manifest.partitions
                want = assignment.hosted_by(self.node_id, name, count)
                stores = self._routes[name][2]
                for partition in sorted(want - set(replica.partitions)):
                    log.info("%s: now hosting %s[%d]", self.node_id, name, partition)
                    revived = self._revive(name, partition)
                    if revived is not None:  # released a moment ago: take it back as it is
                        replica.partitions[partition] = revived
                    else:
                        revived = replica.add_partition(partition)
                    stores[partition] = revived.store
                    added = True
                for partition in sorted(set(replica.partitions) - want):
                    held = replica.partitions[partition]
                    if coordinator.handed_off(name, partition, held.batch_id):
                        log.info("%s: released %s[%d]", self.node_id, name, partition)
                        stores[partition] = None
                        del replica.partitions[partition]
                        path = None
                        if self.store_kind == "rocksdb" and self.local_dir is not None:
                            path = os.path.join(self.local_dir, name, f"{partition:05d}")
                        self._retired.append(
                            (time.monotonic() + self.release_grace, name, held, path)
                        )
            self._close_retired()
        if added:
            self._wake.set()

    def _revive(self, table: str, partition: int) -> PartitionReplica | None:
        for entry in self._retired:
            if entry[1] == table and entry[2].partition == partition:
                self._retired.remove(entry)
                return entry[2]
        return None

    def _close_retired(self, force: bool = False) -> None:
        now = time.monotonic()
        keep = []
        for entry in self._retired:
            due, _, held, path = entry
            if force or now >= due:
                held.store.close()
                if path is not None and not force:
                    shutil.rmtree(path, ignore_errors=True)
            else:
                keep.append(entry)
        self._retired = keep

    def _caught_up(self, table: str, partition: int) -> bool:
        replica = self._tables.get(table)
        held = None if replica is None else replica.partitions.get(partition)
        if replica is None or held is None or held.error is not None:
            return False
        return held.batch_id >= replica.latest_batch_id

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

    def check_token(self, token: str | None) -> None:
        """Raise :class:`~sparkiq.errors.AuthenticationError` unless ``token`` is accepted."""
        if self.coordinator is not None:
            self.coordinator.check_token(token)

    def on_heartbeat(self, doc: dict[str, Any]) -> dict[str, Any]:
        """A heartbeat from another member; returns this node's."""
        if self.coordinator is None:
            raise SparkiqError(f"node {self.node_id!r} is not clustered")
        return self.coordinator.on_heartbeat(doc)

    def notify(self, table: str | None = None) -> None:
        """Tell the tailer (and push subscriptions) a batch was just committed."""
        self._wake.set()
        hub = self._hub
        if hub is not None:
            hub.notify(table)

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

    def _locate(
        self, store: str, key: Any
    ) -> tuple[tuple[Any, ...], int, PartitionStore | None, bool]:
        """``(internal key, partition, local replica or None, whether to read it here)``:
        a clustered node reads its own replica only when it is caught up."""
        route = self._routes.get(store) or self._route(store)
        internal = route[0].to_internal(key)
        partition = route[1](internal)
        hosted = route[2][partition]
        here = hosted is not None and (
            self.coordinator is None or self._caught_up(store, partition)
        )
        return internal, partition, hosted, here

    def get(self, store: str, key: Any) -> dict[str, Any] | None:
        """The current row of ``key`` in ``store``, or None. The fast path of a KeyQuery.

        A clustered node asks the node hosting the key's partition when it does not hold it
        caught up itself; a partition no node can answer raises :class:`SparkiqError`."""
        internal, partition, hosted, here = self._locate(store, key)
        if not here:
            return self._get_routed(store, key, partition, hosted)[0]
        return hosted.get(internal)[0]  # type: ignore[union-attr]

    def get_with_position(self, store: str, key: Any) -> tuple[dict[str, Any] | None, Position]:
        """Like :meth:`get`, with the position of the partition the row was read at (the
        pair is consistent: the row is exactly the state at that position)."""
        internal, partition, hosted, here = self._locate(store, key)
        if not here:
            return self._get_routed(store, key, partition, hosted)
        return hosted.get(internal)  # type: ignore[union-attr]

    def local_lookup(
        self, store: str, key: Any
    ) -> tuple[dict[str, Any] | None, Position, int] | None:
        """``(row, position, partition)`` when this node holds the key's partition caught up,
        else None (another node must be asked). Never blocks on the network."""
        internal, partition, hosted, here = self._locate(store, key)
        if not here:
            return None
        row, position = hosted.get(internal)  # type: ignore[union-attr]
        return row, position, partition

    def _get_routed(
        self, store: str, key: Any, partition: int, hosted: PartitionStore | None
    ) -> tuple[dict[str, Any] | None, Position]:
        if self.coordinator is None:
            raise SparkiqError(
                f"partition {partition} of {store!r}, which holds key {key!r}, is not hosted on "
                f"node {self.node_id!r}; use query() to get a NOT_PRESENT result instead",
                store=store,
                partition=partition,
            )
        request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
        result = self.coordinator.router.route(request, [partition], self.token)
        answer = result.partition_results[partition]
        if answer.is_failure:
            if hosted is not None:  # our own replica is restoring, but it can answer
                return hosted.get(self._routes[store][0].to_internal(key))
            raise SparkiqError(
                f"{store!r} key {key!r} (partition {partition}): {answer.failure_reason.name}: "  # type: ignore[union-attr]
                f"{answer.failure_message}",
                store=store,
                partition=partition,
            )
        return answer.result, answer.position

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer ``request``; failures are per partition.

        A standalone node answers from the partitions it hosts (``NOT_PRESENT`` for others); a
        clustered node routes each partition to a node hosting it (see
        :mod:`sparkiq.cluster.router`)."""
        if self.coordinator is None:
            return self.query_local(request)
        return self.route(request, self.token)

    def route(self, request: StateQueryRequest, token: str | None) -> StateQueryResult[Any]:
        """:meth:`query` on behalf of a caller whose ``token`` is forwarded to other nodes."""
        coordinator = self.coordinator
        if coordinator is None:
            return self.query_local(request)
        partitions, missing = self._partitions(request)
        results = coordinator.router.route(request, partitions, token) if partitions else None
        merged = dict(results.partition_results) if results is not None else {}
        merged.update(missing)
        return StateQueryResult(merged)

    def _partitions(
        self, request: StateQueryRequest
    ) -> tuple[list[int], dict[int, QueryResult[Any]]]:
        codec, partitioner, stores = self._route(request.store)
        count = len(stores)
        query = request.query
        if request.partitions is not None:
            wanted: Iterable[int] = sorted(request.partitions)
        elif query.single_key:
            wanted = (partitioner(codec.to_internal(query.routing_key())),)
        else:
            wanted = range(count)
        valid, missing = [], {}
        for partition in wanted:
            if 0 <= partition < count:
                valid.append(partition)
            else:
                missing[partition] = QueryResult.for_failure(
                    FailureReason.DOES_NOT_EXIST,
                    f"{request.store!r} has partitions 0..{count - 1}; partition {partition} "
                    "does not exist",
                )
        return valid, missing

    def query_local(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer ``request`` from the partitions hosted here only (``NOT_PRESENT`` for the
        others; ``NOT_ACTIVE`` for standbys when the request requires the active)."""
        partitions, results = self._partitions(request)
        stores = self._route(request.store)[2]
        if request.bound.is_unbounded and not request.is_execution_info_enabled:
            ctx = _PLAIN_CONTEXT
        else:
            ctx = QueryContext(request.bound, request.is_execution_info_enabled)
        coordinator = self.coordinator
        for partition in partitions:
            hosted = stores[partition]
            if hosted is None:
                results[partition] = QueryResult.for_failure(
                    FailureReason.NOT_PRESENT,
                    f"partition {partition} of {request.store!r} is not hosted on node "
                    f"{self.node_id!r}: ask the node that hosts it",
                )
            elif (
                request.is_require_active
                and coordinator is not None
                and coordinator.assignment.active(request.store, partition) != self.node_id
            ):
                results[partition] = QueryResult.for_failure(
                    FailureReason.NOT_ACTIVE,
                    f"node {self.node_id!r} holds partition {partition} of {request.store!r} "
                    "as a standby and the request requires the active replica: ask "
                    f"{coordinator.assignment.active(request.store, partition)!r}",
                    hosted.position,
                )
            else:
                results[partition] = execute(hosted, request.query, ctx)
        return StateQueryResult(results)

    # -- metadata ----------------------------------------------------------------------------

    def metadata_for_key(self, store: str, key: Any) -> KeyQueryMetadata:
        """Which partition holds ``key`` and which nodes host it (active first)."""
        partition = self.partition_for_key(store, key)
        return self._partition_metadata(store, partition)

    def _partition_metadata(self, store: str, partition: int) -> KeyQueryMetadata:
        coordinator = self.coordinator
        if coordinator is None:
            me = HostInfo(self.node_id, self.url or "")
            return KeyQueryMetadata(partition, me, ())
        replicas = coordinator.assignment.replicas(store, partition)
        hosts = [HostInfo(m, coordinator.membership.url_of(m) or "") for m in replicas]
        return KeyQueryMetadata(partition, hosts[0] if hosts else None, tuple(hosts[1:]))

    def all_metadata(self) -> list[NodeMetadata]:
        """Per live node: the partitions it is active and standby for, and what it hosts
        (batch id, state) as of its last heartbeat (this node: now)."""
        coordinator = self.coordinator
        tables = {name: len(route[2]) for name, route in self._routes.items()}
        if coordinator is None:
            return [
                NodeMetadata(
                    self.node_id,
                    self.url or "",
                    {t: tuple(range(n)) for t, n in tables.items()},
                    {t: () for t in tables},
                    self.hosted_state(),
                )
            ]
        assignment = coordinator.assignment
        out = []
        for member in assignment.members:
            active = {
                t: tuple(p for p in range(n) if assignment.active(t, p) == member)
                for t, n in tables.items()
            }
            standby = {
                t: tuple(p for p in range(n) if member in assignment.replicas(t, p)[1:])
                for t, n in tables.items()
            }
            hosted = (
                self.hosted_state()
                if member == self.node_id
                else coordinator.membership.hosted_state(member)
            )
            url = coordinator.membership.url_of(member) or ""
            out.append(NodeMetadata(member, url, active, standby, hosted))
        return out

    def is_ready(self) -> bool:
        """Whether every hosted partition is caught up with the changelog (readiness)."""
        return all(s.state == "live" for s in self.status())

    def sql(self, text: str, **options: Any) -> Any:
        """Run a SQL pull query (or ``EXPLAIN``) over the tables this node serves.

        See :meth:`sparkiq.sql.SqlEngine.execute` for ``options`` and the result type.
        """
        engine = self._sql
        if engine is None:
            from sparkiq.sql import SqlEngine, SqlLimits

            # limits: SPARKIQ_SQL_* variables (docs/sql.md#limits), e.g. for `sparkiq serve`
            engine = self._sql = SqlEngine(self, SqlLimits.from_env())
        return engine.execute(text, **options)

    def stream(self, text: str, **options: Any) -> Any:
        """Run a SQL push query (``SELECT ... FROM t [WHERE ...] EMIT CHANGES``).

        Returns a :class:`sparkiq.sql.push.Subscription` (a closeable iterator of changes);
        see :meth:`sparkiq.sql.push.SubscriptionHub.subscribe` for ``options``. Every
        subscription of this node shares one changelog tail per table.
        """
        hub = self._hub
        if hub is None:
            from sparkiq.sql.push import SubscriptionHub

            with self._lock:
                hub = self._hub
                if hub is None:
                    hub = self._hub = SubscriptionHub(self.state_dir, source=self)
        return hub.subscribe(text, **options)

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


def _bind(listen: str) -> socket.socket:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"listen must be 'host:port' (port 0 picks a free one), got {listen!r}")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {listen!r}: {exc}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock
