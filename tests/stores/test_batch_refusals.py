"""A partition asked for a batch it cannot serve answers ``NOT_UP_TO_BOUND`` (a value the
router acts on by asking another replica), never an exception: a batch skipped by a
snapshot restore, and a batch that left the history while the read was starting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkiq import FailureReason, QueryResult, RangeQuery, register
from sparkiq.query.position import Position
from sparkiq.stores.dispatch import QueryContext, execute
from sparkiq.stores.history import History
from sparkiq.stores.memory import MemoryStore
from sparkiq.stores.partition import PartitionStore
from tests.stores.test_versions import SCHEMA, encode


def apply(store: PartitionStore, batch_id: int, changes: dict[str, int | None], **kw: Any) -> None:
    keys, values = encode(changes)
    position = Position.from_map({"t": {0: batch_id}})
    store.apply(zip(keys, values, strict=True), batch_id, position, **kw)


def rows_at(store: PartitionStore, batch_id: int) -> Any:
    result = execute(store, RangeQuery.with_no_bounds(), QueryContext(at_batch=batch_id))
    if result.is_failure:
        return result.failure_reason, result.failure_message
    return {k: row["n"] for k, row in result.result}


def test_a_batch_skipped_by_a_snapshot_restore_is_refused_as_a_value() -> None:
    store = PartitionStore("t", 0, SCHEMA, MemoryStore(), History(batches=100))
    apply(store, 0, {"a": 0, "b": 0})
    # The replica's next batches were deleted by retention: it restores the snapshot of
    # batch 5 (the whole partition, replacing everything), as PartitionReplica.load_snapshot.
    apply(store, 5, {"a": 5, "c": 5}, replace_all=True)
    assert rows_at(store, 0) == {"a": 0, "b": 0}
    assert rows_at(store, 5) == {"a": 5, "c": 5}
    reason, message = rows_at(store, 3)
    assert reason is FailureReason.NOT_UP_TO_BOUND, message
    assert "batch 3" in message and "partition 0 of 't'" in message, message


@dataclass(frozen=True, slots=True)
class SlowRange(RangeQuery):
    """A range read whose handler is slow to start: batches land before it reads."""


def test_a_batch_that_expires_as_the_read_starts_is_refused_as_a_value() -> None:
    store = PartitionStore("t", 0, SCHEMA, MemoryStore(), History(batches=1))
    apply(store, 0, {"a": 0})
    apply(store, 1, {"a": 1})

    @register(SlowRange, name="tests.SlowRange")
    def slow(store: PartitionStore, query: SlowRange, ctx: QueryContext) -> Any:
        for batch_id in (2, 3):  # the history (one batch back) moves past batch 1
            apply(store, batch_id, {"a": batch_id})
        iterator, position = store.scan(None, None, at_batch=ctx.at_batch)
        return QueryResult.for_result(list(store.decoded(iterator)), position)

    result = execute(store, SlowRange(), QueryContext(at_batch=1))
    assert result.failure_reason is FailureReason.NOT_UP_TO_BOUND, result
    assert "the oldest batch still readable is 2" in (result.failure_message or ""), result
