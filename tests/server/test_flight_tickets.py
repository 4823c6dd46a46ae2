"""The results a Flight SQL node holds between ``GetFlightInfo`` and ``DoGet``: good once,
for their owner, for a while, and bounded in count and bytes (the oldest go first)."""

from __future__ import annotations

import pyarrow as pa

from sparkiq.server.flight.tickets import PendingResults


def table(rows: int) -> pa.Table:
    return pa.table({"n": pa.array(range(rows), pa.int64())})  # 8 bytes a row


def test_a_result_is_taken_once_and_by_its_owner_only() -> None:
    results = PendingResults(1 << 20)
    handle = results.keep(table(3), "analyst")
    assert results.take(handle, "narrow") is None  # another principal's ticket
    assert results.take(b"x" * 16, "analyst") is None  # never given
    taken = results.take(handle, "analyst")
    assert taken is not None and taken.num_rows == 3
    assert results.take(handle, "analyst") is None  # fetched already
    assert len(results) == 0


def test_results_expire() -> None:
    now = [100.0]
    results = PendingResults(1 << 20, seconds=60, clock=lambda: now[0])
    kept = results.keep(table(1), None)
    now[0] += 61
    assert results.take(kept, None) is None
    # an expired one is pushed out when the next is kept
    results.keep(table(1), None)
    now[0] += 61
    fresh = results.keep(table(1), None)
    assert len(results) == 1 and results.take(fresh, None) is not None


def test_count_and_bytes_push_out_the_oldest() -> None:
    results = PendingResults(1 << 20, max_count=3)
    handles = [results.keep(table(1), None) for _ in range(5)]
    assert len(results) == 3
    assert [results.take(h, None) is not None for h in handles] == [False, False, True, True, True]
    small = PendingResults(8 * 1000)  # room for 1,000 rows
    first = small.keep(table(600), None)
    second = small.keep(table(600), None)  # pushes the first out
    assert small.take(first, None) is None and small.take(second, None) is not None
    alone = small.keep(table(5000), None)  # over the budget alone: kept for its DoGet
    assert small.take(alone, None) is not None
