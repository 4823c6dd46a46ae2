"""SQL results as Arrow IPC streams: the pieces they travel in and the rows read back.

Which type each column has is the result's own (tests/sql/test_result_schema.py)."""

from __future__ import annotations

import math

import pyarrow as pa

from sparkiq.wire.arrowipc import ipc_chunks, read_table, table_rows


def test_nan_and_nested_values_round_trip() -> None:
    table = pa.table(
        {
            "f32": pa.array([float("nan"), 2.5], pa.float32()),
            "m": pa.array([[("a", 1)], []], pa.map_(pa.string(), pa.int64())),
        }
    )
    rows = table_rows(read_table(b"".join(ipc_chunks(table))))
    assert math.isnan(rows[0]["f32"]) and rows[1]["f32"] == 2.5
    assert [r["m"] for r in rows] == [{"a": 1}, {}]  # maps as dicts, as Node.sql gives them


def test_the_stream_round_trips_in_pieces() -> None:
    table = pa.table(
        {
            "k": [f"k{i}" for i in range(1000)],
            "i8": pa.array([i % 100 for i in range(1000)], pa.int8()),
        }
    )
    pieces = list(ipc_chunks(table, rows_per_batch=300))
    assert len(pieces) == 5  # 4 batches, the first with the schema, and the end marker
    back = read_table(b"".join(pieces))
    assert back.equals(table)
    assert [b.num_rows for b in back.to_batches()] == [300, 300, 300, 100]
    empty = read_table(b"".join(ipc_chunks(table.slice(0, 0))))
    assert empty.num_rows == 0 and empty.schema == table.schema
