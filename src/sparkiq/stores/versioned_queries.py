"""Handlers of the versioned key queries (:mod:`sparkiq.query.versioned`) on a partition.

They read the partition's :class:`~sparkiq.stores.versions.VersionedRows` -- one
:meth:`~sparkiq.stores.versions.VersionedRows.key_history` per query, so the versions, the
retained window and the batches' positions and commit times all come from one state -- never
RocksDB, which holds only the newest batch.

From the raw versions (one per batch that wrote the key) a handler builds the query's
versions: clipped to the retained window, cut at the batch the request reads at (a version
that ended after it is current as seen from there), and adjacent versions with equal rows
merged (see the module docstring of :mod:`sparkiq.query.versioned`).

Expected failures are values, as in :func:`~sparkiq.stores.dispatch.execute`:
``NOT_UP_TO_BOUND`` when the replica has not applied the batch asked for (after a bounded
wait) or no longer retains it -- another replica may still hold it -- with the oldest batch
still readable in the message. A table without history or with a window column is refused
with :class:`~sparkiq.errors.InvalidQueryError` (no replica can answer).

Importing :mod:`sparkiq.stores` registers these handlers, like the built-in ones.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sparkiq.errors import InvalidQueryError
from sparkiq.query.position import Position
from sparkiq.query.queries import ResultOrder
from sparkiq.query.result import FailureReason, QueryResult
from sparkiq.query.versioned import MultiVersionedKeyQuery, VersionedKeyQuery, VersionedRecord
from sparkiq.stores.dispatch import QueryContext, register
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.versions import OPEN, KeyHistory, VersionedRows

__all__: list[str] = []

#: A version as the handlers build it: ``(valid_from, valid_to or OPEN, encoded row)``.
_Raw = tuple[int, int, bytes]


@register(VersionedKeyQuery)
def _versioned_key_query(
    store: PartitionStore, query: VersionedKeyQuery, ctx: QueryContext
) -> QueryResult[Any]:
    versions = _history_of(store, type(query).__name__)
    encoded = store.keys.encode(store.keys.to_internal(query.key))
    history = versions.key_history(encoded)
    if history.newest < 0:
        return _nothing_applied(store)
    batch_id = query.as_of_batch
    if query.as_of_time is not None:
        batch_id = _batch_at_time(history, _utc(query.as_of_time))
        if batch_id is None:
            return _before_window(store, history, f"time {query.as_of_time.isoformat()}")
    elif batch_id is None:
        batch_id = ctx.at_batch if ctx.at_batch is not None else history.newest
    if batch_id > history.newest:
        if not versions.wait_for(batch_id, ctx.catch_up_wait):
            return _behind(store, versions, batch_id, ctx)
        history = versions.key_history(encoded)
    if batch_id < history.oldest:
        return _before_window(store, history, f"batch {batch_id}")
    position = _position_at(history, batch_id)
    # The interval as known now, or as known at the batch the request reads at.
    seen_at = history.newest if ctx.at_batch is None else max(ctx.at_batch, batch_id)
    for version in _merged(history, seen_at):
        if version[0] <= batch_id < version[1]:
            return QueryResult.for_result(_record(store, history, version), position)
    return QueryResult.for_result(None, position)


@register(MultiVersionedKeyQuery)
def _multi_versioned_key_query(
    store: PartitionStore, query: MultiVersionedKeyQuery, ctx: QueryContext
) -> QueryResult[Any]:
    versions = _history_of(store, type(query).__name__)
    encoded = store.keys.encode(store.keys.to_internal(query.key))
    history = versions.key_history(encoded)  # execute() waited for ctx.at_batch
    if history.newest < 0:
        return _nothing_applied(store)
    seen_at = ctx.at_batch if ctx.at_batch is not None else history.newest
    if query.batch_to is not None and query.batch_to < history.oldest:
        return _before_window(store, history, f"batch {query.batch_to}")
    time_from = None if query.time_from is None else _utc(query.time_from)
    time_to = None if query.time_to is None else _utc(query.time_to)
    oldest_time = _commit_time(history, history.oldest)
    if time_to is not None and oldest_time is not None and time_to < oldest_time:
        return _before_window(store, history, f"time {time_to.isoformat()}")
    chosen: list[_Raw] = []
    for version in _merged(history, seen_at):
        valid_from, valid_to, _ = version
        if query.batch_to is not None and valid_from > query.batch_to:
            continue
        if query.batch_from is not None and valid_to <= query.batch_from:
            continue
        if time_to is not None:
            started = _commit_time(history, valid_from)
            if started is not None and started > time_to:
                continue
        if time_from is not None and valid_to != OPEN:
            ended = _commit_time(history, valid_to)
            if ended is not None and ended <= time_from:
                continue
        chosen.append(version)
    if query.order is ResultOrder.DESCENDING:
        chosen.reverse()
    records = [_record(store, history, version) for version in chosen]
    return QueryResult.for_result(records, _position_at(history, seen_at))


# -- versions --------------------------------------------------------------------------------


def _history_of(store: PartitionStore, query_name: str) -> VersionedRows:
    if store.schema.window_column is not None:
        raise InvalidQueryError(
            f"{store.table!r} is windowed: {query_name} reads tables without a window column "
            "(use WindowKeyQuery with StateQueryRequest.as_of for a past batch)",
            store=store.table,
        )
    if store.versions is None:
        raise InvalidQueryError(
            f"{store.table!r} keeps no history, so {query_name} cannot read it: materialize "
            "it with history=...",
            store=store.table,
            partition=store.partition,
        )
    return store.versions


def _merged(history: KeyHistory, seen_at: int) -> list[_Raw]:
    """The key's versions as seen at batch ``seen_at``: clipped to the window, later ones
    dropped, one that ended after ``seen_at`` open, adjacent equal rows merged; ascending."""
    merged: list[_Raw] = []
    for valid_from, valid_to, raw in history.versions:
        if valid_from > seen_at:
            continue
        if valid_to > seen_at:
            valid_to = OPEN
        valid_from = max(valid_from, history.oldest)
        if merged and merged[-1][1] == valid_from and merged[-1][2] == raw:
            merged[-1] = (merged[-1][0], valid_to, raw)
        else:
            merged.append((valid_from, valid_to, raw))
    return merged


def _record(store: PartitionStore, history: KeyHistory, version: _Raw) -> VersionedRecord:
    valid_from, valid_to, raw = version
    open_ = valid_to == OPEN
    return VersionedRecord(
        store.rows.decode(raw),
        valid_from,
        None if open_ else valid_to,
        _commit_time(history, valid_from),
        None if open_ else _commit_time(history, valid_to),
    )


# -- batches and times -------------------------------------------------------------------------


def _commit_time(history: KeyHistory, batch_id: int) -> dt.datetime | None:
    """When ``batch_id`` was committed, as a UTC datetime (None: not retained, or its time
    is unknown). Every comparison with a query's times is between these datetimes, so a
    ``valid_from_time`` a record reports, given back to ``as_of``, finds that version
    (comparing the commit record's float seconds would miss by the sub-microsecond rest)."""
    found = history.batches.get(batch_id)
    if found is None or found[1] <= 0:
        return None
    return dt.datetime.fromtimestamp(found[1], dt.UTC)


def _utc(when: dt.datetime) -> dt.datetime:
    """``when`` as an aware UTC datetime (naive means local time, as PySpark shows it)."""
    return when.astimezone(dt.UTC)


def _batch_at_time(history: KeyHistory, when: dt.datetime) -> int | None:
    """The newest retained batch committed at or before ``when`` (None: none was)."""
    found = None
    for batch_id in sorted(history.batches):
        committed_at = _commit_time(history, batch_id)
        if committed_at is None:
            continue
        if committed_at > when:
            break
        found = batch_id
    return found


def _position_at(history: KeyHistory, batch_id: int) -> Position:
    """The position of the newest retained batch at or before ``batch_id``."""
    held = [b for b in history.batches if b <= batch_id]
    return history.batches[max(held)][0] if held else Position.empty()


# -- failures ----------------------------------------------------------------------------------


def _nothing_applied(store: PartitionStore) -> QueryResult[Any]:
    return QueryResult.for_failure(
        FailureReason.NOT_UP_TO_BOUND,
        f"partition {store.partition} of {store.table!r} has applied no batch yet: retry "
        "later or on another replica",
        store.position,
    )


def _behind(
    store: PartitionStore, versions: VersionedRows, batch_id: int, ctx: QueryContext
) -> QueryResult[Any]:
    return QueryResult.for_failure(
        FailureReason.NOT_UP_TO_BOUND,
        f"partition {store.partition} of {store.table!r} has applied batch {versions.newest}, "
        f"behind batch {batch_id} the query reads at (waited {ctx.catch_up_wait:g} s): retry "
        "later or on another replica",
        store.position,
    )


def _before_window(store: PartitionStore, history: KeyHistory, asked: str) -> QueryResult[Any]:
    oldest_time = _commit_time(history, history.oldest)
    committed = "" if oldest_time is None else f", committed at {oldest_time.isoformat()}"
    return QueryResult.for_failure(
        FailureReason.NOT_UP_TO_BOUND,
        f"{asked} of {store.table!r} is beyond partition {store.partition}'s retained "
        f"history: the oldest batch still readable is {history.oldest}{committed} (raise "
        "materialize(history=...) to keep more)",
        store.position,
    )
