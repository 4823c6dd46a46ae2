"""Reads: how a node answers key lookups and typed requests, locally or by routing.

Every key lookup -- :meth:`Lookup.get`, :meth:`Lookup.get_with_position`,
:meth:`Lookup.local_lookup`, the REST ``GET /stores/{s}/keys/{k}`` and a routed
``KeyQuery`` -- goes through one path: :meth:`Lookup.locate` finds the key's partition and
whether this node reads it itself, applying the handler registry's key-query rules first
(:func:`sparkiq.stores.dispatch.check_key_query`: a windowed table refuses a plain key lookup,
whichever entry point asked); then :meth:`Lookup.read_key` reads it here, or the router asks
the node that hosts it. When the registered ``KeyQuery`` handler is the built-in one, the read
skips building query and result objects: that is the microsecond fast path; a handler of the
user's own is called through :func:`~sparkiq.stores.dispatch.execute`.

A clustered node reads its own replica only when caught up, else routes
(:mod:`sparkiq.cluster.router`); a replica that has applied no batch yet answers nothing.

**One batch per request.** The node a request arrives at pins it to one batch of its table
(:meth:`Lookup.pin_batch`) before reading or routing: ``as_of_time`` becomes the batch then
current, and a request spanning partitions reads them all at the newest batch each can serve
-- the least of what the local replicas have applied and, for partitions read elsewhere, the
newest commit this node has seen -- and never below its bound. Every hosting node then serves
that batch from its partition's versions, waiting a bounded time if it has not applied it
yet (:mod:`sparkiq.stores.dispatch`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, NamedTuple

import pyarrow as pa

from sparkiq.errors import InvalidQueryError, SparkiqError, StoreError
from sparkiq.principals import check_read
from sparkiq.principals import current as current_principal
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import KeyQuery
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.serving.cluster_view import ClusterView, nodes_metadata
from sparkiq.serving.hosting import Hosting, TableRoute
from sparkiq.serving.metadata import HostInfo, KeyQueryMetadata, NodeMetadata
from sparkiq.serving.source_bounds import SOURCE_WAIT, SourceBounds, Unreached
from sparkiq.sql.errors import SqlPartitionError
from sparkiq.sql.limits import SqlLimits
from sparkiq.sql.source import LocalRows
from sparkiq.stores.dispatch import (
    CATCH_UP_WAIT,
    QueryContext,
    check_key_query,
    execute,
    execute_many,
    handler_for,
)
from sparkiq.stores.history import BatchOutOfHistory
from sparkiq.stores.partition import PartitionStore

__all__ = ["KeyLocation", "Lookup"]

_PLAIN_CONTEXT = QueryContext()


class KeyLocation(NamedTuple):
    """Where a key is: its internal form, its partition, the replica hosted here (None if
    not hosted), whether this node reads it itself (hosted, and caught up when clustered)
    and its encoded bytes. A named tuple: built on every lookup, in half a dataclass's time."""

    internal: tuple[Any, ...]
    partition: int
    store: PartitionStore | None
    here: bool
    encoded: bytes


class Lookup:
    """Answers reads for one node from ``hosting``'s replicas, routing through
    :attr:`coordinator` when it is set (the node sets it while clustered and started).

    It is also what the SQL engine reads from (a :class:`~sparkiq.sql.source.QuerySource`).
    """

    def __init__(
        self,
        hosting: Hosting,
        *,
        node_id: str,
        url: str | None = None,
        sql_limits: SqlLimits | None = None,
    ) -> None:
        self._hosting = hosting
        # the node's SQL limits travel with every read: they bound the SQL fragments run here
        self._plain_context = QueryContext(sql_limits=sql_limits)
        self._routes = hosting.live_routes  # read without a call on every key lookup
        self.node_id = node_id
        self.url = url
        self.coordinator: ClusterView | None = None
        self.sources = SourceBounds(hosting)
        #: How long a read whose bound names Kafka records waits for the writer to commit
        #: a batch that read them (see sparkiq.serving.source_bounds).
        self.source_wait = SOURCE_WAIT

    # -- what the SQL engine reads (QuerySource) -----------------------------------------------

    @property
    def tables(self) -> list[str]:
        return self._hosting.tables

    def schema(self, store: str) -> TableSchema:
        """The schema of the rows ``store`` answers with (a view's schema for a follower)."""
        return self._hosting.route(store).schema

    def partition_count(self, store: str) -> int:
        """How many partitions ``store`` has (hosted here or not)."""
        return self._hosting.route(store).partition_count

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer ``request``; failures are per partition.

        A standalone node answers from the partitions it hosts (``NOT_PRESENT`` for others); a
        clustered node routes each partition to a node hosting it."""
        return self.route(request)

    # -- keys --------------------------------------------------------------------------------

    def partitioner(self, store: str) -> Partitioner:
        """How ``store`` places keys in partitions (Spark's hash, or Kafka's murmur2 for a
        followed topic): what the SQL engine locates keys with."""
        return self._hosting.route(store).partitioner

    def partition_for_key(self, store: str, key: Any) -> int:
        """The partition holding ``key`` (validates the key against the table's key columns)."""
        return self._hosting.route(store).partition_of(key)[1]

    def locate(self, store: str, key: Any) -> KeyLocation:
        if current_principal.get() is not None:
            check_read((store,))
        route = self._routes.get(store) or self._hosting.route(store)  # unknown: raises
        # The built-in key rule refuses only windowed tables: the common case skips asking
        # the registry here (read_key asks it before reading).
        if route.windowed and handler_for.builtin_keys:
            check_key_query(route.schema, store, key)
        internal, partition, encoded = route.locate(key)
        hosted = route.stores[partition]
        coordinator = self.coordinator
        here = hosted is not None and (
            coordinator is None
            or (self._hosting.caught_up(store, partition) and coordinator.is_fresh())
        )
        return KeyLocation(internal, partition, hosted, here, encoded)

    def read_key(self, location: KeyLocation, key: Any) -> tuple[dict[str, Any] | None, Position]:
        """``(row, position)`` of a key this node reads itself (``location.here``): the
        built-in handler's read without building query and result objects, or a handler
        the user registered for ``KeyQuery`` through :func:`~sparkiq.stores.dispatch.execute`."""
        store = location.store
        assert store is not None
        if handler_for.builtin_keys:
            return store.get_encoded(location.encoded)
        result = execute(store, KeyQuery.with_key(key), _PLAIN_CONTEXT)
        if result.is_failure:
            raise SparkiqError(
                f"{store.table!r} key {key!r} (partition {location.partition}): "
                f"{result.failure_reason.name}: {result.failure_message}",  # type: ignore[union-attr]
                store=store.table,
                partition=location.partition,
            )
        return result.result, result.position

    def get(self, store: str, key: Any) -> dict[str, Any] | None:
        """The current row of ``key`` in ``store``, or None. The fast path of a KeyQuery.

        :meth:`get_with_position` inlined for a standalone node reading its own partition
        with the built-in handler (the microsecond path: one frame, the key located once);
        anything else takes the general path."""
        route = self._plain_route(store)
        if route is None or current_principal.get() is not None:
            return self.get_with_position(store, key)[0]
        _, partition, encoded = route.locate(key)
        hosted = route.stores[partition]
        if hosted is None:  # not hosted here: the general path raises, naming it
            return self.get_with_position(store, key)[0]
        return hosted.get_encoded(encoded)[0]

    def get_with_position(self, store: str, key: Any) -> tuple[dict[str, Any] | None, Position]:
        """Like :meth:`get`, with the position of the partition the row was read at (the
        pair is consistent: the row is exactly the state at that position). A key this node
        does not read itself is asked of the node hosting it; a partition no node can answer
        raises :class:`~sparkiq.errors.SparkiqError`."""
        return self.read_located(self.locate(store, key), store, key)

    def read_located(
        self, location: KeyLocation, store: str, key: Any
    ) -> tuple[dict[str, Any] | None, Position]:
        """``(row, position)`` of a key :meth:`locate` found: read here when ``location.here``
        (:meth:`read_key`'s built-in read inlined: a frame less on every REST GET), else asked
        of the node hosting it. The caller locates once and passes the location on."""
        if location.here:
            if location.store is not None and handler_for.builtin_keys:
                return location.store.get_encoded(location.encoded)
            return self.read_key(location, key)
        return self._get_routed(store, key, location)

    def local_lookup(
        self, store: str, key: Any
    ) -> tuple[dict[str, Any] | None, Position, int] | None:
        """``(row, position, partition)`` when this node reads the key's partition itself,
        else None (another node must be asked). Never blocks on the network."""
        location = self.locate(store, key)
        if not location.here:
            return None
        row, position = self.read_key(location, key)
        return row, position, location.partition

    def read_here(self, store: str, key: Any) -> tuple[dict[str, Any] | None, Position, int] | int:
        """``(row, position, partition)`` when this node reads the key's partition itself
        with the built-in key handler (what a ``KeyQuery`` would be answered with here),
        else the partition: the SQL engine's key lookups then send a request naming it
        (:class:`~sparkiq.sql.source.LocalKeySource`)."""
        location = self.locate(store, key)
        if not location.here or not handler_for.builtin_keys:
            return location.partition
        assert location.store is not None
        row, position = location.store.get_encoded(location.encoded)
        return row, position, location.partition

    def _get_routed(
        self, store: str, key: Any, location: KeyLocation
    ) -> tuple[dict[str, Any] | None, Position]:
        partition, coordinator = location.partition, self.coordinator
        if coordinator is None:
            raise SparkiqError(
                f"partition {partition} of {store!r}, which holds key {key!r}, is not hosted on "
                f"node {self.node_id!r}; use query() to get a NOT_PRESENT result instead",
                store=store,
                partition=partition,
            )
        request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
        result = coordinator.router.route(request, [partition])
        answer = result.partition_results[partition]
        if answer.is_failure:
            if location.store is not None and location.store.batch_id >= 0:
                return self.read_key(location, key)  # our own replica, restoring: a past state
            raise SparkiqError(
                f"{store!r} key {key!r} (partition {partition}): {answer.failure_reason.name}: "  # type: ignore[union-attr]
                f"{answer.failure_message}",
                store=store,
                partition=partition,
            )
        return answer.result, answer.position

    # -- requests ----------------------------------------------------------------------------

    def route(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Answer ``request``, routing to the nodes that host its partitions (a standalone
        node answers locally)."""
        check_read((request.store,))
        if (
            request.query.__class__ is KeyQuery
            and request.partitions is None
            and request.bound.position is None
            and request.at_batch is None
            and request.at_time is None
            and not request.is_execution_info_enabled
        ):
            answer = self._plain_key_request(request.store, request.query.key)
            if answer is not None:
                return answer
        if request.bound.position is not None:
            resolved = self.sources.resolve(request.store, request.bound, self.source_wait)
            if isinstance(resolved, Unreached):
                return self._not_up_to_bound(request, resolved.message)
            request = replace(request, bound=resolved)
        beyond = self._beyond_the_changelog(request)
        if beyond is not None:
            return beyond
        partitions, missing = self._partitions(request)  # once: pinning and reading use them
        request = self.pin_batch(request, partitions)
        coordinator = self.coordinator
        if coordinator is None:
            return self._query_local(request, partitions, missing, CATCH_UP_WAIT)
        results = coordinator.router.route(request, partitions) if partitions else None
        merged = dict(results.partition_results) if results is not None else {}
        merged.update(missing)
        return StateQueryResult(merged)

    def _plain_route(self, store: str) -> TableRoute | None:
        """The route of ``store`` when a key of it can take the fast path: a table this node
        knows, not windowed, on a standalone node, with the built-in key handler; else
        None (the general path answers)."""
        route = self._routes.get(store)
        if (
            route is None
            or route.windowed
            or self.coordinator is not None
            or not handler_for.builtin_keys
        ):
            return None
        return route

    def _plain_key_request(self, store: str, key: Any) -> StateQueryResult[Any] | None:
        """The answer of an unbounded ``KeyQuery`` of ``key`` on a standalone node hosting
        its partition, with the built-in handler (the commonest request): the key located
        once and read at once, the answer what :func:`~sparkiq.stores.dispatch.execute`
        gives. None for anything else (a windowed table, a clustered node, a partition not
        hosted here, a handler of the user's own): the general path answers it."""
        route = self._plain_route(store)
        if route is None:
            return None
        _, partition, encoded = route.locate(key)
        hosted = route.stores[partition]
        if hosted is None:
            return None
        try:
            row, position = hosted.get_encoded(encoded)
        except (StoreError, OSError):  # execute() turns it into STORE_EXCEPTION
            return None
        return StateQueryResult.of_one(partition, QueryResult.for_result(row, position))

    def _beyond_the_changelog(self, request: StateQueryRequest) -> StateQueryResult[Any] | None:
        """``NOT_UP_TO_BOUND`` for every partition of a request whose bound asks for a batch
        the writer has not committed yet: no replica can have it, so waiting for one would
        only hold a thread (None when the bound can be met)."""
        if request.bound.position is None:  # unbounded: the common case costs nothing
            return None
        floor = bound_batch(request.store, request.bound)
        if floor <= self._hosting.latest_batch(request.store):
            return None
        head = self._hosting.committed_head(request.store)  # the last poll may be behind
        if head is None or floor <= head:  # None: unknown now, so no shortcut
            return None
        return self._not_up_to_bound(
            request,
            f"the bound asks for batch {floor} of {request.store!r}, but its newest "
            f"committed batch is {head}: no replica can have it yet; retry once the "
            "writer has committed it",
        )

    def _not_up_to_bound(self, request: StateQueryRequest, message: str) -> StateQueryResult[Any]:
        """``NOT_UP_TO_BOUND`` with ``message`` for every partition ``request`` reads."""
        partitions, results = self._partitions(request)
        for partition in partitions:
            results[partition] = QueryResult.for_failure(FailureReason.NOT_UP_TO_BOUND, message)
        return StateQueryResult(results)

    def query_local(
        self, request: StateQueryRequest, *, catch_up_wait: float = CATCH_UP_WAIT
    ) -> StateQueryResult[Any]:
        """Answer ``request`` from the partitions hosted here only (``NOT_PRESENT`` for the
        others; ``NOT_ACTIVE`` for standbys when the request requires the active). A
        partition behind the batch the request reads at, or bounds it to, is waited for up
        to ``catch_up_wait`` seconds (0: answered at once, as an event loop must)."""
        check_read((request.store,))
        partitions, missing = self._partitions(request)
        return self._query_local(request, partitions, missing, catch_up_wait)

    def _query_local(
        self,
        request: StateQueryRequest,
        partitions: list[int],
        results: dict[int, QueryResult[Any]],
        catch_up_wait: float,
    ) -> StateQueryResult[Any]:
        """:meth:`query_local` of the valid ``partitions`` of ``request`` (``results``
        holds the failures of the ones that do not exist)."""
        coordinator = self.coordinator
        if coordinator is not None and not coordinator.wait_fresh(catch_up_wait):
            # Just resumed from a stall (view and replicas may be old): a caller that may wait
            # waited catch_up_wait for the resynchronization (after a whole cluster's stall,
            # refusing at once left the router no replica); now refuse, so it asks another.
            for partition in partitions:
                results[partition] = QueryResult.for_failure(
                    FailureReason.NOT_PRESENT,
                    f"node {self.node_id!r} is resynchronizing after a stall: ask another "
                    f"replica of partition {partition} of {request.store!r}",
                )
            return StateQueryResult(results)
        stores = self._hosting.route(request.store).stores
        if (
            request.bound.is_unbounded
            and not request.is_execution_info_enabled
            and request.at_batch is None
        ):
            ctx = self._plain_context
        else:
            if request.at_time is not None:
                request = self.pin_batch(request, partitions)
            ctx = QueryContext(
                request.bound,
                request.is_execution_info_enabled,
                at_batch=request.at_batch,
                catch_up_wait=catch_up_wait,
                sql_limits=self._plain_context.sql_limits,
            )
        answerable: dict[int, Any] = {}
        refused: dict[int, QueryResult[Any]] = {}
        for partition in partitions:
            hosted = stores[partition]
            if hosted is None:
                refused[partition] = QueryResult.for_failure(
                    FailureReason.NOT_PRESENT,
                    f"partition {partition} of {request.store!r} is not hosted on node "
                    f"{self.node_id!r}: ask the node that hosts it",
                )
            elif (
                request.is_require_active
                and coordinator is not None
                and coordinator.assignment.active(request.store, partition) != self.node_id
            ):
                refused[partition] = QueryResult.for_failure(
                    FailureReason.NOT_ACTIVE,
                    f"node {self.node_id!r} holds partition {partition} of {request.store!r} "
                    "as a standby and the request requires the active replica: ask "
                    f"{coordinator.assignment.active(request.store, partition)!r}",
                    hosted.position,
                )
            elif coordinator and hosted.batch_id < 0 and self._hosting.has_batch(request.store):
                # restoring, nothing applied: its empty state is no state of the table
                refused[partition] = QueryResult.for_failure(
                    FailureReason.NOT_PRESENT,
                    f"partition {partition} of {request.store!r} is restoring on node "
                    f"{self.node_id!r} and has applied no batch yet: ask another replica",
                )
            else:
                answerable[partition] = hosted
        answered = execute_many(answerable, request.query, ctx)
        for partition in partitions:  # in the request's order, as before
            failure = refused.get(partition)
            results[partition] = answered[partition] if failure is None else failure
        return StateQueryResult(results)

    def pin_batch(
        self, request: StateQueryRequest, partitions: list[int] | None = None
    ) -> StateQueryRequest:
        """``request`` with the batch it reads at (see the module docstring); unchanged for
        a single-partition request that did not ask for one, or a table with no batch yet.
        ``partitions`` are the request's valid partitions, when the caller has them."""
        if request.at_time is not None:
            when = request.at_time.timestamp()
            batch_id = self._hosting.batch_at_time(request.store, when)
            return replace(request, at_batch=batch_id, at_time=None)
        if request.at_batch is not None:
            floor = bound_batch(request.store, request.bound)
            if floor > request.at_batch:
                raise InvalidQueryError(
                    f"the request reads {request.store!r} as of batch {request.at_batch} but its "
                    f"bound asks for batch {floor} or later: drop one of them",
                    store=request.store,
                )
            return request
        if partitions is None:
            partitions, _ = self._partitions(request)
        if len(partitions) < 2:
            return request
        batch_id = self.consistent_batch(request.store, partitions, request.bound)
        return request if batch_id < 0 else replace(request, at_batch=batch_id)

    def local_rows(
        self, store: str, at_batch: int | None, bound: PositionBound
    ) -> LocalRows | None:
        """Every partition of ``store`` as Arrow at one batch, when this node hosts them all
        and can read them itself (see :class:`~sparkiq.sql.source.ColumnarSource`)."""
        hosting = self._hosting
        stores = hosting.route(store).stores
        held = [s for s in stores if s is not None and s.versions is not None]
        if len(held) != len(stores) or not held:
            return None
        coordinator = self.coordinator
        if coordinator is not None and not (
            coordinator.is_fresh() and all(hosting.caught_up(store, p) for p in range(len(stores)))
        ):
            return None
        batch_id = at_batch
        if batch_id is None:
            resolved = self.sources.resolve(store, bound, self.source_wait)
            if isinstance(resolved, Unreached):  # waited already: not again partition-wise
                raise SqlPartitionError(
                    f"{store!r} could not answer (NOT_UP_TO_BOUND): {resolved.message}",
                    reason=FailureReason.NOT_UP_TO_BOUND.name,
                    store=store,
                )
            batch_id = self.consistent_batch(store, range(len(stores)), resolved)
        if batch_id < 0:
            return None
        chunks: list[pa.Table] = []
        position = Position.empty()
        for partition_store in held:
            versions = partition_store.versions
            assert versions is not None
            if not versions.wait_for(batch_id, CATCH_UP_WAIT):
                return None  # the per-partition path waits again, then names the partition
            try:
                version = versions.version(batch_id)
            except BatchOutOfHistory:
                return None
            chunks.extend(version.chunks)
            position = position.merge(version.position)
        schema = held[0].versions.arrow_schema  # type: ignore[union-attr]
        raw = pa.concat_tables(chunks) if chunks else schema.empty_table()
        return LocalRows(raw, batch_id, position)

    def batch_at_time(self, store: str, when: dt.datetime) -> int:
        """The newest batch of ``store`` committed at or before ``when`` (naive: local)."""
        return self._hosting.batch_at_time(store, when.timestamp())

    def consistent_batch(self, store: str, partitions: Iterable[int], bound: PositionBound) -> int:
        """The newest batch of ``store`` that every one of ``partitions`` can serve now, as
        far as this node knows, and not below ``bound`` (-1: the table has no batch yet)."""
        hosting = self._hosting
        stores = hosting.route(store).stores
        coordinator = self.coordinator
        newest = hosting.latest_batch(store) if coordinator is not None else None
        for partition in partitions:
            held = stores[partition]
            applied: int | None
            if coordinator is not None and not hosting.caught_up(store, partition):
                # The router reads it elsewhere: the latest commit stands for it, unless no
                # replica reports being caught up (stuck on a batch everywhere, or all
                # restoring), where the newest batch a replica has applied is what it serves.
                applied = self._applied_elsewhere(coordinator, store, partition, held)
            elif held is None or held.versions is None:
                continue
            else:
                applied = held.versions.newest
            if applied is not None:
                newest = applied if newest is None else min(newest, applied)
        if newest is None:
            newest = hosting.latest_batch(store)
        return max(newest, bound_batch(store, bound))

    @staticmethod
    def _applied_elsewhere(
        coordinator: ClusterView, store: str, partition: int, held: PartitionStore | None
    ) -> int | None:
        """The newest batch of a partition its replicas have applied, from their last
        heartbeats and the replica held here; None when one of them reports it caught up
        (or nothing is known), so the latest commit stands for it."""
        membership = coordinator.membership
        applied = -1 if held is None or held.versions is None else held.versions.newest
        for member in membership.hosting(store, partition):
            state = membership.hosted_state(member).get(store, {}).get(partition)
            if state is None:
                continue
            if state[1] == "live":
                return None
            applied = max(applied, state[0])
        return applied if applied >= 0 else None

    def _partitions(
        self, request: StateQueryRequest
    ) -> tuple[list[int], dict[int, QueryResult[Any]]]:
        """The valid partitions ``request`` reads, and failures for the ones that do not exist."""
        route: TableRoute = self._hosting.route(request.store)
        count = route.partition_count
        query = request.query
        wanted: Iterable[int]
        if request.partitions is not None:
            wanted = sorted(request.partitions)
        elif query.single_key:
            wanted = (route.partition_of(query.routing_key())[1],)
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

    # -- metadata ----------------------------------------------------------------------------

    def metadata_for_key(self, store: str, key: Any) -> KeyQueryMetadata:
        """Which partition holds ``key`` and which nodes host it (active first)."""
        partition = self.partition_for_key(store, key)
        coordinator = self.coordinator
        if coordinator is None:
            return KeyQueryMetadata(partition, HostInfo(self.node_id, self.url or ""), ())
        replicas = coordinator.assignment.replicas(store, partition)
        hosts = [HostInfo(m, coordinator.membership.url_of(m) or "") for m in replicas]
        return KeyQueryMetadata(partition, hosts[0] if hosts else None, tuple(hosts[1:]))

    def all_metadata(self) -> list[NodeMetadata]:
        """Per live node: its active and standby partitions and what it last said it hosts."""
        tables = {name: route.partition_count for name, route in self._hosting.routes().items()}
        hosted = self._hosting.hosted_state()
        return nodes_metadata(self.coordinator, tables, self.node_id, self.url or "", hosted)


def bound_batch(table: str, bound: PositionBound) -> int:
    """The batch of ``table`` a bound asks for at least (-1: none)."""
    if bound.position is None:
        return -1
    return max(bound.position.to_map().get(table, {}).values(), default=-1)
