"""Reading one table reference through the source: point lookups or per-partition fragments.

Every read goes through :meth:`QuerySource.query` with a typed query, so in a cluster each
sub-request reaches the node hosting its partition:

- :func:`read_table` reads a table reference for DuckDB as Arrow: one
  :class:`~sparkiq.sql.fragment.SqlFragmentQuery` request for the whole reference -- over
  every partition for a range or a scan, or, for exact keys, over the partitions the keys
  map to, each answering the keys it holds as Arrow built from its stored rows (no dicts);
- :func:`lookup_rows` reads exact keys as rows (dicts), one ``KeyQuery`` (``WindowKeyQuery``)
  per key: the Python fast path, which answers a single-table lookup without DuckDB; it reads
  a key this node holds without a request, and keys that landed on partitions at different
  batches again at the oldest of them;
- :func:`range_rows` reads a one-column key range as rows through ``RangeQuery``.

A read spanning partitions is pinned by the source to one batch of the table (or to
``at_batch`` when given: a statement reading a table twice reads it at the same batch both
times). A partition that fails (bound not reached, not hosted, store error) fails the whole
statement with :class:`~sparkiq.sql.errors.SqlPartitionError`: an answer is never silently
missing rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sparkiq.error_codes import ErrorCode
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import KeyQuery, Query, RangeQuery, WindowKeyQuery
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.arrowrows import ArrowRows
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.sql.errors import SqlPartitionError
from sparkiq.sql.fragment import SqlFragmentQuery
from sparkiq.sql.keys import KeyAccess
from sparkiq.sql.source import QuerySource

__all__ = ["Read", "batch_of", "check", "lookup_rows", "range_rows", "read_table"]


@dataclass(frozen=True, slots=True)
class Read:
    """A table reference's rows (or fragment results), their position and the partitions
    that answered."""

    table: pa.Table
    position: Position
    partitions: tuple[int, ...]


def check(store: str, result: StateQueryResult[Any]) -> None:
    """Raise SqlPartitionError for the first failed partition of ``result``."""
    for partition, answer in result.partition_results.items():
        if answer.failure_reason is not None:
            reason = answer.failure_reason.name
            raise SqlPartitionError(
                f"partition {partition} of {store!r} could not answer ({reason}): "
                f"{answer.failure_message}; the statement was refused rather than answered "
                "without that partition's rows",
                reason=reason,
                code=ErrorCode.PARTITION_FAILED,
                store=store,
                partition=partition,
                position=answer.position,
            )


def _request(
    store: str,
    query: Query,
    bound: PositionBound,
    at_batch: int | None = None,
    partitions: frozenset[int] | None = None,
) -> StateQueryRequest:
    request = StateQueryRequest(store, query, partitions, False, bound)
    return request if at_batch is None else request.as_of(at_batch)


def batch_of(store: str, position: Position) -> int | None:
    """The batch of ``store`` a read was served at (None: no partition answered)."""
    offsets = position.partition_offsets(store)  # a view: to_map would copy every component
    return max(offsets.values()) if offsets else None


class NotHere(Exception):
    """Raised by :func:`lookup_rows` with ``here_only`` when a key must be asked of another
    node, or read again at an older batch: something that may block."""


def lookup_rows(
    source: QuerySource,
    store: str,
    schema: TableSchema,
    access: KeyAccess,
    bound: PositionBound,
    at_batch: int | None = None,
    *,
    here_only: bool = False,
) -> tuple[list[dict[str, Any]], Position, list[int]]:
    """Rows of the access's keys (every window in bounds, for a windowed table), all read
    at one batch of the table. With ``here_only``, every key is read by the source itself
    at once or :class:`NotHere` is raised (nothing that could block is attempted)."""
    rows, position, partitions, batches = _lookup_rows(
        source, store, schema, access, bound, at_batch, here_only
    )
    # Read while a batch landed (two keys of one partition count: merged positions would
    # hide that): read every key again at the oldest batch seen.
    if at_batch is None and len(batches) > 1:
        if here_only:  # a read at a batch may wait for a replica
            raise NotHere
        rows, position, partitions, _ = _lookup_rows(
            source, store, schema, access, bound, min(batches)
        )
    return rows, position, partitions


def _lookup_rows(
    source: QuerySource,
    store: str,
    schema: TableSchema,
    access: KeyAccess,
    bound: PositionBound,
    at_batch: int | None,
    here_only: bool = False,
) -> tuple[list[dict[str, Any]], Position, list[int], set[int]]:
    """Rows, merged position, partitions and the table batch of every answer."""
    assert access.keys is not None
    batches: set[int] = set()
    rows: list[dict[str, Any]] = []
    position = Position.empty()
    partitions: list[int] = []
    windowed = schema.window_column is not None
    if windowed:
        start = schema.window_start
        assert start is not None
        convert = start.from_internal
        time_from = None if access.window_from is None else convert(access.window_from)
        time_to = None if access.window_to is None else convert(access.window_to)
    # A key this source holds itself, read now with the built-in handler, needs no request
    # (no query or result objects, the key encoded once): what Node.get does.
    # (duck-typed: isinstance against a runtime Protocol costs more than the read)
    read_here = None
    if not windowed and at_batch is None and bound.is_unbounded:
        read_here = getattr(source, "read_here", None)  # a LocalKeySource
    if here_only and read_here is None:
        raise NotHere
    for key in access.keys:
        located = None
        if read_here is not None:
            here = read_here(store, key)
            if isinstance(here, int):  # read elsewhere: the request names the partition
                if here_only:
                    raise NotHere
                located = frozenset((here,))
            else:
                row, read_at, partition = here
                partitions.append(partition)
                position = position.merge(read_at)
                served = read_at.partition_offsets(store).get(partition)
                if served is not None:
                    batches.add(served)
                if row is not None:
                    rows.append(row)
                continue
        query: Query = WindowKeyQuery(key, time_from, time_to) if windowed else KeyQuery(key)
        result = source.query(_request(store, query, bound, at_batch, located))
        check(store, result)
        for partition, answer in result.partition_results.items():
            partitions.append(partition)
            position = position.merge(answer.position)
            served = answer.position.partition_offsets(store).get(partition)
            if served is not None:
                batches.add(served)
            if windowed:
                assert answer.result is not None
                rows.extend(row for _, row in answer.result)
            elif answer.result is not None:
                rows.append(answer.result)
    return rows, position, partitions, batches


def range_rows(
    source: QuerySource,
    store: str,
    access: KeyAccess,
    bound: PositionBound,
    at_batch: int | None = None,
) -> tuple[list[dict[str, Any]], Position]:
    """Rows of a one-column key range (``access.range_bounds``) through ``RangeQuery`` on
    every partition: inclusive bounds in the stores, exclusive ends and null keys filtered
    here (a comparison with NULL is never true)."""
    assert access.range_bounds is not None
    low, high = access.range_bounds
    query = RangeQuery(
        None if low is None else low[0],
        None if high is None else high[0],
        low is not None,
        high is not None,
    )
    result = source.query(_request(store, query, bound, at_batch))
    check(store, result)
    rows: list[dict[str, Any]] = []
    for answer in result.partition_results.values():
        assert answer.result is not None
        with answer.result as items:
            for key, row in items:
                if key is None:
                    continue
                if low is not None and not low[1] and key == low[0]:
                    continue
                if high is not None and not high[1] and key == high[0]:
                    continue
                rows.append(row)
    return rows, result.position


def read_table(
    source: QuerySource,
    store: str,
    codecs: tuple[TableSchema, KeyCodec, Partitioner],
    columns: Sequence[str],
    fragment_sql: str | None,
    access: KeyAccess,
    bound: PositionBound,
    timeout: float,
    *,
    lookup_fragment: bool = True,
    skip_below: int = 0,
    at_batch: int | None = None,
) -> Read:
    """The table reference's rows after its fragment, from every partition it touches.

    ``codecs`` are the table's schema, key codec and partitioner. Exact keys
    (``access.keys``) are read by one request naming the partitions they map to; each of
    those partitions reads the keys it holds. Looked-up rows go through the fragment only with
    ``lookup_fragment`` (a partial aggregate needs it; a filter is redundant there since the
    final query filters again).
    """
    schema, codec, partitioner = codecs
    timeout_ms = max(1, int(timeout * 1000))
    partitions: frozenset[int] | None = None
    if access.keys is not None:
        encoded: list[bytes] = []
        located: list[int] = []
        for key in access.keys:
            internal = codec.to_internal(key)
            encoded.append(codec.encode(internal))  # a windowed table's: the key prefix
            located.append(partitioner(internal))
        # An empty key set (k = 'a' AND k IN ('b')) still asks one partition: its fragment
        # gives the relation the shape the final query reads (a partial aggregate's).
        partitions = frozenset(located) if located else frozenset((0,))
        query = SqlFragmentQuery(
            tuple(columns),
            fragment_sql if lookup_fragment else None,
            window_from=access.window_from,
            window_to=access.window_to,
            timeout_ms=timeout_ms,
            keys=tuple(encoded),
            key_partitions=tuple(located),
            combine=True,
        )
    else:
        query = SqlFragmentQuery(
            tuple(columns),
            fragment_sql,
            access.lower,
            access.upper,
            access.window_from,
            access.window_to,
            timeout_ms,
            skip_below,
            combine=True,  # the final query merges fragments however rows were split
        )
    result = source.query(_request(store, query, bound, at_batch, partitions))
    check(store, result)
    tables = [answer.result for answer in result.partition_results.values()]
    if not tables:
        table = ArrowRows(schema, columns).out_schema.empty_table()
    elif len(tables) == 1:
        table = tables[0]
    else:
        table = pa.concat_tables(tables, promote_options="permissive")
    return Read(table, result.position, tuple(result.partition_results))
