"""The per-partition half of a SQL query: :class:`SqlFragmentQuery` and its store handler.

A fragment reads one partition's rows in an encoded key range at one batch -- the batch the
request is pinned to, else the newest -- from the partition's Arrow versions
(:mod:`sparkiq.stores.versions`: no decoding, one vectorized filter), keeps those whose window
start is in bounds and, when ``sql`` is set, runs it in a locked-down DuckDB over that table
(named ``__sq_part``): filter, projection, per-partition top-N or partial aggregate. A store
kept without versions is read from a store snapshot and decoded. The answer is a
``pyarrow.Table`` with the position of the batch it was read at.

A whole partition read by ``sql`` (no key range, window bounds or keys) is not filtered in
Arrow first: ``__sq_part`` is then a CTE over the version's unfiltered chunks, registered
without copying, that keeps the rows of the batch (:mod:`sparkiq.sql.visible`), and DuckDB
applies that filter in its scan. A node answering several partitions does the same over all
of them at once (one relation per batch read, usually one).

A fragment with ``keys`` (a SQL key lookup inside a larger statement: a join, an expression,
an aggregate) reads those keys only, each by key, and never scans the partition: from the
store's current state when the request is not pinned to a batch, else from the version of
that batch (a key's row through the version's key index). A windowed table's keys are key
prefixes, each read as a bounded range of the store; only at a pinned batch the store has
moved past is the version's key column filtered instead, as a ``WindowKeyQuery`` at a batch
does. The stored rows then become Arrow directly (no dicts on the way).

The query is a frozen dataclass of plain values (str, int, bytes, tuples), registered with
the wire protocol, so a router can send it to the node hosting the partition. A node never
trusts a fragment's SQL: it is parsed and checked with the same rules as a user's statement
(read-only, no table functions, no file or settings functions) and may name no table other
than ``__sq_part``.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from sparkiq.error_codes import ErrorCode
from sparkiq.query.queries import Query
from sparkiq.query.result import QueryResult
from sparkiq.schema.arrowrows import KEY_COLUMN, WINDOWSTART, ArrowRows
from sparkiq.schema.codec import prefix_end
from sparkiq.schema.types import TableSchema
from sparkiq.sql.duck import DuckPool, run
from sparkiq.sql.errors import SqlError, SqlLimitError, SqlUnsupportedError
from sparkiq.sql.limits import SqlLimits
from sparkiq.sql.parse import DIALECT, parse
from sparkiq.sql.visible import rows_at, with_ctes
from sparkiq.stores.dispatch import QueryContext, execute, register, register_combiner
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.versions import visible_mask

__all__ = ["PART", "SqlFragmentQuery"]

PART = "__sq_part"
_ALL = 1 << 62  # next_chunk size meaning every row: a fragment builds one table anyway
_second = itemgetter(1)


@dataclass(frozen=True, slots=True)
class SqlFragmentQuery(Query):
    """Rows of one partition as an Arrow table, optionally transformed by ``sql``.

    - ``columns``: table columns, ``WINDOWSTART``/``WINDOWEND`` or ``__sq_key`` to build.
    - ``lower``/``upper``: encoded store keys, ``lower <= key < upper`` (None: open).
    - ``window_from``/``window_to``: inclusive window-start bounds, internal microseconds.
    - ``sql``: a SELECT over ``__sq_part`` (None: return the columns as they are).
    - ``timeout_ms``: DuckDB's budget on the answering node, capped by that node's own
      ``SqlLimits.timeout_seconds`` (a caller cannot buy more time than a statement gets).
    - ``skip_below``: when fewer rows than this are in range, return the columns without
      running ``sql`` (a DuckDB run costs more than shipping a few rows). Only set it when
      ``sql`` selects exactly ``columns`` and the coordinator applies its effect again
      (a filter or a top-N, never a partial aggregate).
    - ``keys``: encoded store keys to read instead of a range (a windowed table: encoded key
      prefixes, every window of each, still within the window bounds); a key the partition
      does not hold is absent. ``lower``/``upper`` still apply (None: the keys only).
    - ``key_partitions``: the partition of each of ``keys``, in order, so that a partition
      reads only its own keys (None: every partition named reads every key).
    - ``combine``: a node answering several of the request's partitions may run ``sql`` once
      over all their rows (its first successful partition carries the answer, the others
      answer no rows with the same columns). Only set it when the coordinator applies
      ``sql``'s effect again over the concatenated answers (a filter, a top-N, a partial
      aggregate): it does, so a node pays one DuckDB run per request, not one per partition.
    """

    columns: tuple[str, ...]
    sql: str | None = None
    lower: bytes | None = None
    upper: bytes | None = None
    window_from: int | None = None
    window_to: int | None = None
    timeout_ms: int = 30_000
    skip_below: int = 0
    keys: tuple[bytes, ...] | None = None
    key_partitions: tuple[int, ...] | None = None
    combine: bool = False


_DEFAULT_LIMITS = SqlLimits()
_pool_lock = threading.Lock()  # guards _pools
_pools: dict[SqlLimits, DuckPool] = {}


def _fragment_pool(limits: object | None) -> tuple[SqlLimits, DuckPool]:
    """The answering node's limits (``QueryContext.sql_limits``; None: the defaults) and
    the pool its fragments run in (one DuckDB thread each: a node runs many fragments at
    once). Nodes of one process with equal limits share a pool."""
    chosen = limits if isinstance(limits, SqlLimits) else _DEFAULT_LIMITS
    pool = _pools.get(chosen)
    if pool is None:
        with _pool_lock:
            pool = _pools.get(chosen)
            if pool is None:
                pool = _pools[chosen] = DuckPool.for_limits(chosen, threads=1)
    return chosen, pool


_checked: OrderedDict[str, None] = OrderedDict()
_checked_lock = threading.Lock()
_builders: dict[tuple[int, tuple[str, ...]], tuple[TableSchema, ArrowRows]] = {}


def _check_fragment_sql(sql: str) -> None:
    """Refuse fragment SQL a user could not have written, or that names other tables."""
    with _checked_lock:
        if sql in _checked:
            _checked.move_to_end(sql)
            return
    parsed = parse(sql)
    if parsed.explain:
        raise SqlUnsupportedError(
            "a fragment cannot be EXPLAIN", code=ErrorCode.FORBIDDEN_STATEMENT
        )
    for table in parsed.tree.find_all(exp.Table):
        if table.name != PART:
            raise SqlUnsupportedError(
                f"a fragment may only read {PART}, not {table.name!r}",
                code=ErrorCode.FORBIDDEN_TABLE,
            )
    with _checked_lock:
        _checked[sql] = None
        if len(_checked) > 512:
            _checked.popitem(last=False)


def _check_keys(query: SqlFragmentQuery, limits: SqlLimits) -> None:
    """Refuse keys a statement could not have asked for: more than ``max_key_lookups`` (of
    the answering node), not encoded store keys, or partitions not one per key."""
    keys, partitions = query.keys, query.key_partitions
    if not isinstance(keys, tuple) or not all(isinstance(k, bytes) for k in keys):
        raise SqlError(
            "a fragment's keys must be a tuple of encoded store keys (bytes)",
            code=ErrorCode.INVALID_QUERY,
            field="keys",
        )
    if partitions is not None and (
        not isinstance(partitions, tuple)
        or len(partitions) != len(keys)
        or not all(type(p) is int for p in partitions)
    ):
        raise SqlError(
            "a fragment's key_partitions must be a tuple of ints, one per key",
            code=ErrorCode.INVALID_QUERY,
            field="key_partitions",
        )
    if len(keys) > limits.max_key_lookups:
        raise SqlLimitError(
            f"a fragment asks for {len(keys)} keys, more than this node's "
            f"SqlLimits.max_key_lookups={limits.max_key_lookups}; select fewer keys or a "
            "key range",
            code=ErrorCode.TOO_MANY_TERMS,
            field="keys",
        )


def _builder(schema: TableSchema, columns: tuple[str, ...]) -> ArrowRows:
    key = (id(schema), columns)
    found = _builders.get(key)
    if found is None or found[0] is not schema:
        if len(_builders) > 1024:
            _builders.clear()
        found = _builders[key] = (schema, ArrowRows(schema, columns))
    return found[1]


_gc_lock = threading.Lock()
_gc_holders = 0
_gc_was_enabled = False


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a scan builds millions of small objects.

    They hold no reference cycles (bytes, lists of plain values), yet their allocation
    would trigger full collections that scan them again and again, doubling a large scan's
    time. Reference counting still frees everything; the collector resumes when the last
    scan in the process ends, if it was running before.
    """
    global _gc_holders, _gc_was_enabled
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()


@dataclass(frozen=True, slots=True)
class _Candidates:
    """A partition's rows still to be filtered to ``batch_id``: every row of its version's
    chunks (``raw``, not copied), to be read through :func:`~sparkiq.sql.visible.rows_at`.
    Only a fragment's own DuckDB run reads one; it never leaves the process."""

    raw: pa.Table
    batch_id: int
    #: whether ``batch_id`` was the partition's newest once ``raw`` was taken: then no row
    #: of ``raw`` became valid after it (``valid_from`` needs no comparison)
    newest: bool = False

    def visible(self, columns: tuple[str, ...]) -> pa.Table:
        """The rows at the batch as a table of ``columns`` (a copy of those rows)."""
        raw = self.raw
        return raw.select(list(columns)).filter(visible_mask(raw, self.batch_id))


Rows: TypeAlias = "pa.Table | _Candidates"

#: Set by the combiner while it reads its partitions: their whole-partition reads are then
#: answered as :class:`_Candidates`, which its single DuckDB run filters (see
#: :func:`_fragments`). A context variable, not a query field: it never crosses the wire.
_deferring: contextvars.ContextVar[bool] = contextvars.ContextVar("sq_deferring", default=False)


def partition_table(
    store: PartitionStore, query: SqlFragmentQuery, at_batch: int | None = None
) -> tuple[pa.Table, Any]:
    """The partition's rows in the query's bounds as Arrow at ``at_batch`` (None: the
    newest), with that batch's position."""
    rows, position = _partition_rows(store, query, at_batch)
    return _materialized(rows, query.columns), position


def _partition_rows(
    store: PartitionStore, query: SqlFragmentQuery, at_batch: int | None
) -> tuple[Rows, Any]:
    """:func:`partition_table`, except that a whole partition read from its version comes
    as :class:`_Candidates` (no rows copied)."""
    if query.keys is not None:
        return _keys_table(store, query, at_batch)
    versions = store.versions
    if versions is not None:
        batch_id = versions.newest if at_batch is None else at_batch
        if batch_id >= 0:
            if (
                query.lower is None
                and query.upper is None
                and query.window_from is None
                and query.window_to is None
            ):
                version = versions.version(batch_id)
                # read after the version, of the same object: its chunks hold no row of a
                # batch applied later
                newest = versions.newest == batch_id
                return _Candidates(version.raw(), batch_id, newest), version.position
            return _version_table(store, query, batch_id)
    with _without_cyclic_gc():
        return _partition_table(store, query)


def _materialized(rows: Rows, columns: tuple[str, ...]) -> pa.Table:
    return rows.visible(columns) if isinstance(rows, _Candidates) else rows


def _version_table(
    store: PartitionStore, query: SqlFragmentQuery, batch_id: int
) -> tuple[pa.Table, Any]:
    version = store.version(batch_id)
    raw = version.raw()
    if not raw.num_rows:
        return _builder(store.schema, query.columns).out_schema.empty_table(), version.position
    mask = visible_mask(raw, batch_id)
    keys = raw.column(KEY_COLUMN)
    if query.keys is not None:  # a windowed table's key prefixes (see _keys_table)
        mask = pc.and_(mask, _prefix_mask(keys, query.keys))
    if query.lower is not None:
        mask = pc.and_(mask, pc.greater_equal(keys, pa.scalar(query.lower, pa.binary())))
    if query.upper is not None:
        mask = pc.and_(mask, pc.less(keys, pa.scalar(query.upper, pa.binary())))
    start = store.schema.window_start
    if start is not None and (query.window_from is not None or query.window_to is not None):
        starts = raw.column(WINDOWSTART)
        if query.window_from is not None:
            low = pa.scalar(start.from_internal(query.window_from), starts.type)
            mask = pc.and_(mask, pc.greater_equal(starts, low))
        if query.window_to is not None:
            high = pa.scalar(start.from_internal(query.window_to), starts.type)
            mask = pc.and_(mask, pc.less_equal(starts, high))
        mask = pc.and_(mask, pc.is_valid(starts))
    return raw.select(list(query.columns)).filter(mask), version.position


def _partition_table(store: PartitionStore, query: SqlFragmentQuery) -> tuple[pa.Table, Any]:
    iterator, position = store.scan(query.lower, query.upper, upper_exclusive=True)
    windowed = query.window_from is not None or query.window_to is not None
    with iterator:
        pairs = iterator.next_chunk(_ALL)
    if not windowed and KEY_COLUMN not in query.columns:  # the common scan: values only
        values = list(map(_second, pairs))
        return _builder(store.schema, query.columns).from_stored(values), position
    return _stored_table(store, query, pairs, store.schema.window_column is not None), position


def _keys_table(
    store: PartitionStore, query: SqlFragmentQuery, at_batch: int | None
) -> tuple[pa.Table, Any]:
    """The rows of ``query.keys`` (key prefixes on a windowed table), read key by key."""
    assert query.keys is not None
    keys: Any = query.keys
    if query.key_partitions is not None:
        mine = store.partition
        keys = [k for k, p in zip(keys, query.key_partitions, strict=True) if p == mine]
    wanted = [
        key
        for key in keys
        if (query.lower is None or key >= query.lower)
        and (query.upper is None or key < query.upper)
    ]
    windowed = store.schema.window_column is not None
    if at_batch is None or (windowed and store.batch_id == at_batch):
        current = _current_pairs(store, wanted, windowed)
        while current is None and at_batch is None:  # a batch landed between two reads
            current = _current_pairs(store, wanted, windowed)
        if current is not None and (at_batch is None or _batch(store, current[1]) == at_batch):
            pairs, position = current
            return _stored_table(store, query, pairs, windowed), position
    assert at_batch is not None
    if windowed:  # no index by key prefix in a version: one vectorized filter
        return _version_table(store, replace(query, keys=tuple(wanted)), at_batch)
    version = store.version(at_batch)
    found = [(key, version.row(key)) for key in wanted]
    pairs = [(key, row) for key, row in found if row is not None]
    return _stored_table(store, query, pairs, windowed), version.position


def _current_pairs(
    store: PartitionStore, keys: list[bytes], windowed: bool
) -> tuple[list[tuple[bytes, bytes]], Any] | None:
    """``(encoded key, encoded row)`` of ``keys`` in the store's current state (every
    window of each key prefix when ``windowed``) and the position they were read at; None
    when a batch was applied between two of the reads (their rows are of different batches)."""
    pairs: list[tuple[bytes, bytes]] = []
    position = None
    for key in keys:
        if windowed:
            iterator, read_at = store.scan(key, prefix_end(key), upper_exclusive=True)
            with iterator:
                pairs += iterator.next_chunk(_ALL)
        else:
            row, read_at = store.get_raw(key)
            if row is not None:
                pairs.append((key, row))
        if position is None:
            position = read_at
        elif read_at != position:
            return None
    return pairs, (store.position if position is None else position)


def _batch(store: PartitionStore, position: Any) -> int | None:
    """The batch of ``store``'s partition that ``position`` names."""
    found: int | None = position.to_map().get(store.table, {}).get(store.partition)
    return found


def _stored_table(
    store: PartitionStore,
    query: SqlFragmentQuery,
    pairs: list[tuple[bytes, bytes]],
    windowed: bool,
) -> pa.Table:
    """Arrow of stored ``pairs``: windows outside the query's bounds dropped, the store key
    kept as ``__sq_key`` when asked."""
    if windowed and (query.window_from is not None or query.window_to is not None):
        low, high = query.window_from, query.window_to
        decode = store.keys.decode_windowed
        kept = []
        for pair in pairs:
            start = decode(pair[0])[1]
            if start is None:
                continue
            if (low is None or start >= low) and (high is None or start <= high):
                kept.append(pair)
        pairs = kept
    rows = [row for _, row in pairs]
    keys = [key for key, _ in pairs] if KEY_COLUMN in query.columns else None
    return _builder(store.schema, query.columns).from_stored(rows, keys)


def _prefix_mask(keys: pa.ChunkedArray, prefixes: tuple[bytes, ...]) -> pa.ChunkedArray:
    """Which ``keys`` start with one of ``prefixes``: one vectorized pass per prefix length
    (a key's encoding is self-delimiting, so its leading bytes equal a whole key's encoding
    only when they are that key)."""
    by_length: dict[int, list[bytes]] = {}
    for prefix in prefixes:
        by_length.setdefault(len(prefix), []).append(prefix)
    mask: Any = None
    for length, group in by_length.items():
        leading = pc.binary_slice(keys, 0, length)
        found = pc.is_in(leading, value_set=pa.array(group, pa.binary()))
        mask = found if mask is None else pc.or_(mask, found)
    if mask is None:  # no prefixes: no rows
        return pc.is_in(keys, value_set=pa.array([], pa.binary()))
    return mask


@register(SqlFragmentQuery)
def _fragment(
    store: PartitionStore, query: SqlFragmentQuery, ctx: QueryContext
) -> QueryResult[Any]:
    limits, pool = _fragment_pool(ctx.sql_limits)
    if query.keys is not None:
        _check_keys(query, limits)
    rows, position = _partition_rows(store, query, ctx.at_batch)
    if query.sql is None:
        if _deferring.get():  # the combiner's read: its DuckDB run filters the rows
            return QueryResult.for_result(rows, position)
        return QueryResult.for_result(_materialized(rows, query.columns), position)
    return QueryResult.for_result(_run_over(query, [rows], limits, pool), position)


def _run_over(
    query: SqlFragmentQuery, parts: list[Rows], limits: SqlLimits, pool: DuckPool
) -> pa.Table:
    """``query.sql`` over the rows of ``parts`` (one partition's, or several of one node),
    or those rows as they are when fewer than ``query.skip_below`` (counted before the
    batch filter: the rows a DuckDB run would read)."""
    assert query.sql is not None
    columns = query.columns
    if sum(part.raw.num_rows if isinstance(part, _Candidates) else part.num_rows
           for part in parts) < query.skip_below:  # fmt: skip
        tables = [_materialized(part, columns) for part in parts]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    _check_fragment_sql(query.sql)
    timeout = min(query.timeout_ms / 1000, limits.timeout_seconds)
    by_batch: dict[tuple[int, bool], list[pa.Table]] = {}
    tables = []
    for part in parts:
        if isinstance(part, _Candidates):
            by_batch.setdefault((part.batch_id, part.newest), []).append(part.raw)
        else:
            tables.append(part)
    if not by_batch:
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
        return run(pool, query.sql, {PART: table}, timeout=timeout, arrow=True)[1]
    relations: dict[str, pa.Table] = {}
    params: dict[str, int] = {}
    for index, ((batch_id, _), raws) in enumerate(by_batch.items()):
        relations[f"{PART}_v{index}"] = raws[0] if len(raws) == 1 else pa.concat_tables(raws)
        params[f"sq_b{index}"] = batch_id
    if tables:
        relations[f"{PART}_rows"] = tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    newest = tuple(is_newest for _, is_newest in by_batch)
    sql = _over_versions(query.sql, columns, newest, bool(tables))
    return run(pool, sql, relations, timeout=timeout, arrow=True, params=params)[1]


_over: OrderedDict[tuple[Any, ...], str] = OrderedDict()
_over_lock = threading.Lock()


def _over_versions(sql: str, columns: tuple[str, ...], newest: tuple[bool, ...], rows: bool) -> str:
    """``sql`` with ``__sq_part`` the union of a relation ``__sq_part_vN`` per item of
    ``newest``, read at the batch in ``$sq_bN`` (:func:`~sparkiq.sql.visible.rows_at`,
    ``newest`` its flag), and, with ``rows``, the rows of ``__sq_part_rows`` as they are.
    Made once per shape (sqlglot takes about a millisecond to write a statement)."""
    key = (sql, columns, newest, rows)
    with _over_lock:
        found = _over.get(key)
        if found is not None:
            _over.move_to_end(key)
            return found
    parts: list[exp.Query] = [
        rows_at(f"{PART}_v{i}", columns, f"sq_b{i}", newest=flag) for i, flag in enumerate(newest)
    ]
    if rows:
        parts.append(
            exp.select(*[exp.column(c, quoted=True) for c in columns]).from_(f"{PART}_rows")
        )
    body = parts[0]
    for part in parts[1:]:
        body = exp.union(body, part, distinct=False)
    text = with_ctes(parse(sql).tree, {PART: body}).sql(dialect=DIALECT)
    with _over_lock:
        _over[key] = text
        if len(_over) > 512:
            _over.popitem(last=False)
    return text


@register_combiner(SqlFragmentQuery)
def _fragments(
    stores: Mapping[int, PartitionStore], query: SqlFragmentQuery, ctx: QueryContext
) -> dict[int, QueryResult[Any]]:
    """Several partitions of one node. With ``combine``, each partition's rows are read as
    :func:`_fragment` reads them (bound, batch and failures per partition, through
    :func:`execute`; whole partitions unfiltered, see :class:`_Candidates`), then ``sql``
    runs once over all of them."""
    if not query.combine or query.sql is None:
        return {partition: execute(store, query, ctx) for partition, store in stores.items()}
    rows_only = replace(query, sql=None, skip_below=0)
    token = _deferring.set(True)
    try:
        results = {p: execute(store, rows_only, ctx) for p, store in stores.items()}
    finally:
        _deferring.reset(token)
    read = [partition for partition, answer in results.items() if answer.is_success]
    if not read:
        return results
    limits, pool = _fragment_pool(ctx.sql_limits)
    table = _run_over(query, [results[partition].result for partition in read], limits, pool)
    first, *rest = read
    answer = results[first]
    results[first] = QueryResult.for_result(table, answer.position, answer.execution_info)
    empty = table.slice(0, 0)
    for partition in rest:
        answer = results[partition]
        results[partition] = QueryResult.for_result(empty, answer.position, answer.execution_info)
    return results
