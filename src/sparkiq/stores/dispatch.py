"""Query dispatch: a registry of handlers keyed by (store type, query type).

A handler answers one query type on one kind of store::

    @register(MyQuery)                 # for PartitionStore, the built-in store
    def count_prefix(store, query, ctx) -> QueryResult: ...

    @register(MyQuery, MyCustomStore)  # or for a store class of your own
    def ...

Registering a handler also records the query type under its name (its class name, or
``name=``) in :mod:`sparkiq.query.registry`, which is how the wire protocol knows which types
it may carry between nodes: one registration, in every process that sends or answers the
query, makes a custom type work in-process and across a cluster.

Lookup walks the method resolution order of both the store's and the query's class, so a
handler registered for a base class serves its subclasses. A query with no handler fails with
``FailureReason.UNKNOWN_QUERY_TYPE``; registering never affects other query types.

:func:`execute` wraps every handler with what all queries share: the position-bound check,
reads at a batch (``QueryContext.at_batch``: wait a bounded time for a replica that is behind,
refuse a batch outside its history), store-failure capture (``STORE_EXCEPTION``) and execution
info. A handler reading at ``ctx.at_batch`` passes it to :meth:`PartitionStore.scan
<sparkiq.stores.partition.PartitionStore.scan>` (the built-in handlers do).

A query type may also have a *combiner* (:func:`register_combiner`): when one node answers
it for several partitions at once, :func:`execute_many` hands the combiner the partitions'
stores instead of calling the handler once per partition. SQL fragments use it to run their
statement once over the rows of every partition a node holds, not once per partition.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

from sparkiq.errors import InvalidQueryError, StoreError
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import (
    KeyQuery,
    Query,
    RangeQuery,
    ResultOrder,
    WindowKeyQuery,
    WindowRangeQuery,
)
from sparkiq.query.registry import register_query_type
from sparkiq.query.result import FailureReason, QueryResult, RowIterator
from sparkiq.schema.codec import prefix_end
from sparkiq.schema.types import TableSchema
from sparkiq.stores.history import BatchOutOfHistory
from sparkiq.stores.partition import PartitionStore

_UNBOUNDED = PositionBound.unbounded()

__all__ = [
    "Combiner",
    "QueryContext",
    "Handler",
    "check_key_query",
    "execute",
    "execute_many",
    "handler_for",
    "register",
    "register_combiner",
]


#: How long a partition that has not applied the batch a request reads at is waited for.
CATCH_UP_WAIT = 2.0


@dataclass(frozen=True, slots=True)
class QueryContext:
    """What a handler may need besides the store and the query: the bound, whether to
    collect execution info, and ``at_batch`` -- the batch to read at (None: the newest) --
    with how long to wait for a replica that has not applied it yet; ``sql_limits``, the
    answering node's :class:`~sparkiq.sql.SqlLimits` (None: their defaults), bounds the SQL
    a fragment runs here (typed ``object``: this layer sits below ``sql``)."""

    bound: PositionBound = _UNBOUNDED
    collect_execution_info: bool = False
    at_batch: int | None = None
    catch_up_wait: float = CATCH_UP_WAIT
    sql_limits: object | None = None


Handler = Callable[[Any, Any, QueryContext], QueryResult[Any]]
H = TypeVar("H", bound=Handler)
#: Answers one query for several partitions of one node: ``(stores by partition, query,
#: ctx) -> results by partition``, a result for every partition it was given.
Combiner = Callable[[Mapping[int, Any], Any, QueryContext], dict[int, QueryResult[Any]]]
C = TypeVar("C", bound=Combiner)

_registry: dict[tuple[type, type], Handler] = {}
_combiners: dict[type, Combiner] = {}
_lock = threading.Lock()  # guards _registry and _combiners (writers; readers use the memo)


def register(
    query_type: type[Query], store_type: type = PartitionStore, *, name: str | None = None
) -> Callable[[H], H]:
    """Register the decorated function as the handler of ``query_type`` on ``store_type``.

    The query type is recorded for the wire under ``name`` (default: its class name), so
    nodes and clients can send it to each other; a name taken by another class raises
    :class:`ValueError` at once.
    """
    if not (isinstance(query_type, type) and issubclass(query_type, Query)):
        raise TypeError(f"register() takes a Query subclass, got {query_type!r}")
    register_query_type(query_type, name)

    def decorate(fn: H) -> H:
        with _lock:
            _registry[(store_type, query_type)] = fn
            handler_for.cache_clear()
        return fn

    return decorate


def register_combiner(query_type: type[Query]) -> Callable[[C], C]:
    """Register the decorated function as ``query_type``'s combiner (see the module
    docstring); the type needs a handler too, for a single partition and for other nodes."""

    def decorate(fn: C) -> C:
        with _lock:
            _combiners[query_type] = fn
        return fn

    return decorate


def _lookup(store_type: type, query_type: type) -> Handler | None:
    for s in store_type.__mro__:
        for q in query_type.__mro__:
            found = _registry.get((s, q))
            if found is not None:
                return found
    return None


class _HandlerCache:
    """A tiny memo of handler lookups, cleared whenever the registry changes.

    :attr:`builtin_keys` says whether a ``KeyQuery`` on a :class:`PartitionStore` is answered
    by the built-in handler: key lookups read that one attribute instead of looking the
    handler up on every call, and skip building query and result objects when it holds."""

    def __init__(self) -> None:
        self._memo: dict[tuple[type, type], Handler | None] = {}
        self._builtin_key: Handler | None = None
        self.builtin_keys = False

    def __call__(self, store_type: type, query_type: type) -> Handler | None:
        key = (store_type, query_type)
        try:
            return self._memo[key]
        except KeyError:
            found = self._memo[key] = _lookup(store_type, query_type)
            return found

    def cache_clear(self) -> None:
        self._memo = {}
        builtin = self._builtin_key
        self.builtin_keys = builtin is not None and _lookup(PartitionStore, KeyQuery) is builtin

    def set_builtin_key(self, handler: Handler) -> None:
        """Record the built-in ``KeyQuery`` handler (once, below its definition)."""
        self._builtin_key = handler
        self.cache_clear()


handler_for = _HandlerCache()


def execute(store: Any, query: Query, ctx: QueryContext) -> QueryResult[Any]:
    """Answer ``query`` on one partition ``store``; failures come back as values."""
    started = time.perf_counter_ns() if ctx.collect_execution_info else 0
    handler = handler_for(type(store), type(query))
    if handler is None:
        return QueryResult.for_failure(
            FailureReason.UNKNOWN_QUERY_TYPE,
            f"store {getattr(store, 'table', type(store).__name__)!r} has no handler for "
            f"{type(query).__name__}; register one with sparkiq.register()",
        )
    table = getattr(store, "table", "")
    if ctx.at_batch is not None:
        refused = _refuse_batch(store, table, ctx)
        if refused is not None:
            return refused
    elif ctx.bound.position is not None and not _admitted(store, table, ctx):
        position = getattr(store, "position", Position.empty())
        return QueryResult.for_failure(
            FailureReason.NOT_UP_TO_BOUND,
            f"partition {getattr(store, 'partition', '?')} of {table!r} is at {position!r}, "
            f"behind the requested bound {ctx.bound!r}: retry later or on another replica",
            position,
        )
    try:
        result = handler(store, query, ctx)
    except BatchOutOfHistory as exc:  # a batch a snapshot skipped, or one that just expired
        return QueryResult.for_failure(
            FailureReason.NOT_UP_TO_BOUND,
            f"partition {getattr(store, 'partition', '?')} of {table!r}: {exc.message}",
            getattr(store, "position", Position.empty()),
        )
    except InvalidQueryError:
        raise
    except (StoreError, OSError) as exc:
        return QueryResult.for_failure(
            FailureReason.STORE_EXCEPTION,
            f"store {table!r} partition {getattr(store, 'partition', '?')} failed: {exc}",
        )
    if ctx.collect_execution_info:
        took_us = (time.perf_counter_ns() - started) / 1000
        result = result.with_execution_info(
            f"{type(query).__name__} on {table}[{getattr(store, 'partition', '?')}] "
            f"by {getattr(handler, '__qualname__', handler)} in {took_us:.1f} us"
        )
    return result


def execute_many(
    stores: Mapping[int, Any], query: Query, ctx: QueryContext
) -> dict[int, QueryResult[Any]]:
    """Answer ``query`` on several partitions of one node: through its combiner when it has
    one and there is more than one partition, else :func:`execute` on each."""
    combiner = _combiners.get(type(query)) if len(stores) > 1 else None
    if combiner is not None:
        return combiner(stores, query, ctx)
    return {partition: execute(store, query, ctx) for partition, store in stores.items()}


def _admitted(store: Any, table: str, ctx: QueryContext) -> bool:
    """Whether ``store`` has reached the request's bound, waiting ``ctx.catch_up_wait`` for
    a batch of the table's clock the bound names that the partition has not applied yet
    (the node the request entered checked it is committed: the replica is just behind)."""
    bound = ctx.bound
    if bound.admits(table, getattr(store, "position", Position.empty())):
        return True
    assert bound.position is not None
    floor = max(bound.position.partition_offsets(table).values(), default=-1)
    versions = getattr(store, "versions", None)
    if floor < 0 or versions is None or not versions.wait_for(floor, ctx.catch_up_wait):
        return False
    return bound.admits(table, getattr(store, "position", Position.empty()))


def _refuse_batch(store: Any, table: str, ctx: QueryContext) -> QueryResult[Any] | None:
    """A failure when ``store`` cannot read at ``ctx.at_batch`` (after waiting for it to be
    applied), else None. ``NOT_UP_TO_BOUND`` either way: another replica may have it."""
    batch_id = ctx.at_batch
    assert batch_id is not None
    partition = getattr(store, "partition", "?")
    versions = getattr(store, "versions", None)
    position = getattr(store, "position", Position.empty())
    if versions is None:
        return QueryResult.for_failure(
            FailureReason.NOT_UP_TO_BOUND,
            f"partition {partition} of {table!r} keeps no history and cannot read at batch "
            f"{batch_id}: ask a replica that does",
            position,
        )
    if not versions.wait_for(batch_id, ctx.catch_up_wait):
        return QueryResult.for_failure(
            FailureReason.NOT_UP_TO_BOUND,
            f"partition {partition} of {table!r} has applied batch {versions.newest}, behind "
            f"batch {batch_id} the request reads at (waited {ctx.catch_up_wait:g} s): retry "
            "later or on another replica",
            position,
        )
    if batch_id < versions.oldest:
        return QueryResult.for_failure(
            FailureReason.NOT_UP_TO_BOUND,
            f"batch {batch_id} of {table!r} is beyond partition {partition}'s retained "
            f"history: the oldest batch still readable is {versions.oldest} (raise "
            "materialize(history=...) to keep more)",
            position,
        )
    return None


# -- built-in handlers --------------------------------------------------------------------------


def check_key_query(schema: TableSchema, table: str, key: Any) -> None:
    """The built-in ``KeyQuery`` rule, which depends on the table only: a windowed table
    refuses a plain key lookup. Nodes check it once per lookup, before deciding where to
    read (locally or on another node), so every entry point refuses the same way. The
    message names the SQL statement and the REST body that read ``key``'s windows (the REST
    key route and the console meet it, not only Python callers)."""
    if schema.window_column is not None:
        raise InvalidQueryError(_windowed_message(schema, table, key), store=table)


def _windowed_message(schema: TableSchema, table: str, key: Any) -> str:
    values = tuple(key) if isinstance(key, tuple | list) else (key,)
    if len(values) != len(schema.key_columns):
        values = (key,) * len(schema.key_columns)  # the key is refused later, as any bad key
    where = " AND ".join(
        f"{_ident(c)} = {_sql_literal(v)}" for c, v in zip(schema.key_columns, values, strict=True)
    )
    body = json.dumps(
        {"query": {"type": "window_key", "key": key, "from": None, "to": None}}, default=str
    )
    return (
        f"{table!r} is windowed: a key has one row per window, so it has no single row to "
        f"look up. Read its windows with SQL: SELECT * FROM {_ident(table)} WHERE {where} "
        "(add WINDOWSTART >= TIMESTAMP '...' for a time range); or POST "
        f"/stores/{table}/query with {body} (from/to: window starts as ISO timestamps, "
        "null for unbounded); in Python, WindowKeyQuery.with_key_and_window_starts"
    )


def _ident(name: str) -> str:
    if name.isidentifier() and name.islower():
        return name
    return '"' + name.replace('"', '""') + '"'


def _sql_literal(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).upper()
    if isinstance(value, int | float | Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat(sep=' ')}'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    return "'" + str(value).replace("'", "''") + "'"


@register(KeyQuery)
def _key_query(store: PartitionStore, query: KeyQuery, ctx: QueryContext) -> QueryResult[Any]:
    check_key_query(store.schema, store.table, query.key)
    internal = store.keys.to_internal(query.key)
    row, position = store.get(internal)
    # RocksDB holds the newest batch only; its position, consistent with the row, says
    # whether that is the batch asked for (the common case, kept on the fast path).
    if (
        ctx.at_batch is not None
        and position.to_map().get(store.table, {}).get(store.partition) != ctx.at_batch
    ):
        raw, position = store.get_at(store.keys.encode(internal), ctx.at_batch)
        row = None if raw is None else store.rows.decode(raw)
    return QueryResult.for_result(row, position)


handler_for.set_builtin_key(_key_query)


@register(RangeQuery)
def _range_query(store: PartitionStore, query: RangeQuery, ctx: QueryContext) -> QueryResult[Any]:
    keys = store.keys
    lower = keys.key_prefix(keys.to_internal(query.lower)) if query.has_lower else None
    upper_exclusive = False
    upper: bytes | None = None
    if query.has_upper:
        upper_prefix = keys.key_prefix(keys.to_internal(query.upper))
        if store.schema.window_column is None:
            upper = upper_prefix
        else:  # every window of the upper key is inside the range
            upper, upper_exclusive = prefix_end(upper_prefix), True
    reverse = query.order is ResultOrder.DESCENDING
    iterator, position = store.scan(
        lower, upper, reverse=reverse, upper_exclusive=upper_exclusive, at_batch=ctx.at_batch
    )
    return QueryResult.for_result(_rows(store, iterator), position)


@register(WindowKeyQuery)
def _window_key_query(
    store: PartitionStore, query: WindowKeyQuery, ctx: QueryContext
) -> QueryResult[Any]:
    _require_windowed(store)
    prefix = store.keys.key_prefix(store.keys.to_internal(query.key))
    return _window_scan(store, prefix, prefix, query.time_from, query.time_to, ctx.at_batch)


@register(WindowRangeQuery)
def _window_range_query(
    store: PartitionStore, query: WindowRangeQuery, ctx: QueryContext
) -> QueryResult[Any]:
    _require_windowed(store)
    return _window_scan(store, None, None, query.time_from, query.time_to, ctx.at_batch)


def _require_windowed(store: PartitionStore) -> None:
    if store.schema.window_column is None:
        raise InvalidQueryError(
            f"{store.table!r} is not windowed: use KeyQuery or RangeQuery", store=store.table
        )


def _window_scan(
    store: PartitionStore,
    lower_prefix: bytes | None,
    upper_prefix: bytes | None,
    time_from: dt.datetime | None,
    time_to: dt.datetime | None,
    at_batch: int | None,
) -> QueryResult[Any]:
    keys = store.keys
    to_internal, _ = _window_time_codec(store)
    start_us = to_internal(time_from) if time_from is not None else None
    end_us = to_internal(time_to) if time_to is not None else None
    upper = prefix_end(upper_prefix) if upper_prefix is not None else None
    iterator, position = store.scan(
        lower_prefix, upper, upper_exclusive=upper is not None, at_batch=at_batch
    )

    def items() -> Any:
        decode_windowed, from_internal, decode_row = (
            keys.decode_windowed,
            keys.from_internal,
            store.rows.decode,
        )
        _, window_from_internal = _window_time_codec(store)
        for raw_key, raw_row in iterator:
            internal_key, window_start = decode_windowed(raw_key)
            if start_us is not None and window_start < start_us:
                continue
            if end_us is not None and window_start > end_us:
                continue
            yield (
                (from_internal(internal_key), window_from_internal(window_start)),
                decode_row(raw_row),
            )

    return QueryResult.for_result(RowIterator(items(), iterator.close), position)


def _rows(store: PartitionStore, iterator: Any) -> RowIterator:
    if store.schema.window_column is None:
        return RowIterator(store.decoded(iterator), iterator.close)
    keys = store.keys
    _, window_from_internal = _window_time_codec(store)

    def windowed() -> Any:
        for raw_key, raw_row in iterator:
            internal_key, window_start = keys.decode_windowed(raw_key)
            yield (
                (keys.from_internal(internal_key), window_from_internal(window_start)),
                store.rows.decode(raw_row),
            )

    return RowIterator(windowed(), iterator.close)


def _window_time_codec(store: PartitionStore) -> tuple[Any, Any]:
    """Converters between window starts as PySpark returns them and internal microseconds."""
    start = store.schema.window_start
    assert start is not None  # only windowed tables' queries get here
    return start.to_internal, _optional(start.from_internal)


def _optional(convert: Any) -> Any:
    return lambda value: None if value is None else convert(value)
