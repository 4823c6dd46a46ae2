"""SQL results as Arrow: which type each column gets, and the IPC stream they travel in.

The rule (sparkiq.wire.arrowipc): a column named like a table column, holding what that
column holds, gets the column's Arrow type; anything else gets the type Arrow infers from
its values, never a silently lossy conversion.
"""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sparkiq.schema.types import TableSchema
from sparkiq.wire.arrowipc import ipc_chunks, read_table, result_table, table_rows


def schema(*columns: tuple[str, Any]) -> TableSchema:
    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in columns]
    return TableSchema.from_spark_json({"type": "struct", "fields": fields}, [columns[0][0]])


POINT = {
    "type": "struct",
    "fields": [
        {"name": "x", "type": "integer", "nullable": True, "metadata": {}},
        {"name": "y", "type": "integer", "nullable": True, "metadata": {}},
    ],
}
TABLE = schema(
    ("k", "string"),
    ("i8", "byte"),
    ("f32", "float"),
    ("day", "date"),
    ("price", "decimal(6,2)"),
    ("p", POINT),
    ("m", {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}),
)


def typed(column: str, values: list[Any]) -> pa.DataType:
    table = result_table([column], [{column: v} for v in values], [TABLE])
    assert table_rows(table) == [{column: v} for v in values]
    return table.schema.field(column).type


def test_table_columns_keep_their_spark_types() -> None:
    assert typed("i8", [1, None, -128]) == pa.int8()
    assert typed("f32", [1.5, float("inf"), None]) == pa.float32()
    assert typed("day", [dt.date(2024, 1, 1)]) == pa.date32()
    assert typed("price", [Decimal("12.50"), Decimal("-0.01")]) == pa.decimal128(6, 2)
    assert typed("p", [{"x": 1, "y": 2}, {"x": 3, "y": None}]) == pa.struct(
        [("x", pa.int32()), ("y", pa.int32())]
    )
    assert pa.types.is_map(typed("m", [{"a": 1}, {}]))
    assert typed("k", [None, None]) == pa.string()  # only nulls: the declared type


def test_nan_survives_float32() -> None:
    table = result_table(["f32"], [{"f32": float("nan")}, {"f32": 2.5}], [TABLE])
    assert table.schema.field("f32").type == pa.float32()
    assert math.isnan(table_rows(table)[0]["f32"])


@pytest.mark.parametrize(
    ("column", "values", "expected"),
    [
        ("i8", [1000, 5], pa.int64()),  # i8 * 1000 AS i8: does not fit int8
        ("i8", [1.5], pa.float64()),  # avg(i8) AS i8: Arrow would truncate to 1
        ("i8", [True], pa.bool_()),  # a bool is an int in Python, not in the column
        ("f32", [0.1], pa.float64()),  # a double renamed like the float column
        ("day", [dt.datetime(2024, 1, 1, 5)], pa.timestamp("us")),  # a datetime is a date
        ("price", [Decimal("123456.789")], pa.decimal128(9, 3)),  # outside decimal(6,2)
        ("p", [{"zz": 1}], pa.struct([("zz", pa.int64())])),  # Arrow would make nulls
        ("k", [7], pa.int64()),
        ("computed", [1, None], pa.int64()),
        ("computed", [None], pa.null()),
    ],
)
def test_values_of_another_class_are_typed_by_their_values(
    column: str, values: list[Any], expected: pa.DataType
) -> None:
    table = result_table([column], [{column: v} for v in values], [TABLE])
    assert table.schema.field(column).type == expected
    assert table_rows(table) == [{column: v} for v in values]


def test_a_name_two_tables_type_differently_is_typed_by_its_values() -> None:
    other = schema(("id", "long"), ("i8", "string"))
    table = result_table(["i8"], [{"i8": 3}], [TABLE, other])
    assert table.schema.field("i8").type == pa.int64()


def test_shapes_of_results() -> None:
    empty = result_table(["i8", "k"], [], [TABLE])
    assert empty.num_rows == 0 and empty.schema.field("i8").type == pa.int8()
    assert result_table([], []).num_columns == 0
    twice = result_table(["k", "k"], [{"k": "a"}], [TABLE])  # SELECT k, k: one dict entry
    assert twice.column_names == ["k", "k"] and table_rows(twice) == [{"k": "a"}]
    missing = result_table(["k", "x"], [{"k": "a"}, {"k": "b", "x": 1}], [TABLE])
    assert missing.column("x").to_pylist() == [None, 1]
    mixed = result_table(["v"], [{"v": 1}, {"v": "a"}])  # not from DuckDB, but not a crash
    assert mixed.column("v").to_pylist() == ["1", "a"]


def test_the_stream_round_trips_in_pieces() -> None:
    table = result_table(["k", "i8"], [{"k": f"k{i}", "i8": i % 100} for i in range(1000)], [TABLE])
    pieces = list(ipc_chunks(table, rows_per_batch=300))
    assert len(pieces) == 5  # 4 batches, the first with the schema, and the end marker
    back = read_table(b"".join(pieces))
    assert back.equals(table)
    assert [b.num_rows for b in back.to_batches()] == [300, 300, 300, 100]
    empty = read_table(b"".join(ipc_chunks(table.slice(0, 0))))
    assert empty.num_rows == 0 and empty.schema == table.schema
