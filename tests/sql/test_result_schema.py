"""A SQL result's column types: decided where the result is made, read by every renderer.

Key lookups answered in Python are typed by the table's columns, statements DuckDB runs by
DuckDB, and neither is ever guessed back from values or names: a computed column renamed
like a table column keeps the computed type (sparkiq.sql.result_schema).
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sparkiq import Node
from sparkiq.server.pg.types import describe_columns
from sparkiq.sql.result import result_table
from sparkiq.sql.result_schema import SPARK_TYPE, from_duck, spark_type
from sparkiq.wire.arrowipc import table_rows

CK = {"region": pa.string(), "id": pa.int32(), "amount": pa.decimal128(10, 2)}


def types(node: Node, text: str) -> dict[str, pa.DataType]:
    result = node.sql(text)
    assert result.schema is not None and result.schema.names == result.columns
    table = result.to_arrow()  # the rows fit their declared types exactly
    assert table.schema.equals(result.schema)
    assert table_rows(table) == result.rows
    return {f.name: f.type for f in result.schema}


def pg(node: Node, text: str) -> list[str]:
    return [c.type.name for c in describe_columns(node.sql(text).schema)]


def test_a_key_lookup_and_a_scan_type_the_table_columns_alike(node: Node) -> None:
    lookup = types(node, "SELECT * FROM ck WHERE region = 'eu' AND id = 3")
    scan = types(node, "SELECT * FROM ck WHERE amount > 0")
    assert lookup == scan == {**CK, "ts": pa.timestamp("us")}
    assert pg(node, "SELECT * FROM ck WHERE region = 'eu' AND id = 3") == [
        "text",
        "int4",
        "numeric",
        "timestamptz",  # Spark's timestamp is an instant
    ]
    assert pg(node, "SELECT ts FROM ck") == pg(node, "SELECT max(ts) AS latest FROM ck")


def test_computed_columns_have_duckdb_types_whatever_their_names(node: Node) -> None:
    got = types(
        node,
        "SELECT id * 1000 AS id, avg(id) AS amount, count(*) AS c, sum(id) AS s, "
        "region || '!' AS region FROM ck GROUP BY id, region",
    )
    assert got == {
        "id": pa.int32(),  # not int32's range guessed from values: DuckDB's INTEGER
        "amount": pa.float64(),  # an average named like the decimal column is a double
        "c": pa.int64(),
        "s": pa.int64(),  # DuckDB's HUGEINT sum, an int64 as Spark's sum of ints
        "region": pa.string(),
    }
    assert pg(node, "SELECT count(*) AS c, sum(id) AS s, avg(id) AS a FROM ck") == [
        "int8",
        "int8",
        "float8",
    ]


def test_nested_and_explain_results(node: Node) -> None:
    got = types(node, "SELECT info, day FROM w WHERE k = 'k001'")
    assert got == {
        "info": pa.struct([("a", pa.int32()), ("tags", pa.list_(pa.string()))]),
        "day": pa.date32(),
    }
    assert pg(node, "SELECT info, day FROM w") == ["json", "date"]
    assert set(types(node, "EXPLAIN SELECT * FROM t").values()) == {pa.string()}


def test_a_timestamp_ntz_table_keeps_naive_timestamps() -> None:
    plain = pa.schema([pa.field("t", pa.timestamp("us")).with_metadata({b"duckdb.type": b"X"})])
    assert spark_type(from_duck(plain, zoned=False).field("t")) is None
    assert spark_type(from_duck(plain, zoned=True).field("t")) == "timestamp"
    assert [c.type.name for c in describe_columns(from_duck(plain, zoned=False))] == ["timestamp"]


def hugeint_schema() -> pa.Schema:
    field = pa.field("s", pa.decimal128(38, 0)).with_metadata({b"duckdb.type": b"HUGEINT"})
    return from_duck(pa.schema([field]), zoned=True)


def test_a_sum_beyond_int64_widens_its_column_exactly() -> None:
    schema = hugeint_schema()
    assert schema.field("s").type == pa.int64()
    assert schema.field("s").metadata == {SPARK_TYPE: b"hugeint"}
    small = result_table(["s"], [{"s": 5}], schema)
    assert small.schema.field("s").type == pa.int64()
    huge = 2**64 + 7
    wide = result_table(["s"], [{"s": huge}, {"s": None}], schema)
    assert wide.schema.field("s").type == pa.decimal128(38, 0)
    assert wide.column("s").to_pylist() == [Decimal(huge), None]


@pytest.mark.parametrize(
    ("duck", "arrow", "value", "back"),
    [
        ("UUID", pa.string(), uuid.UUID(int=7), str(uuid.UUID(int=7))),
        ("INTERVAL", pa.month_day_nano_interval(), dt.timedelta(days=2), None),
        ("MAP(VARCHAR, BIGINT)", pa.map_(pa.string(), pa.int64()), {"a": 1}, [("a", 1)]),
    ],
)
def test_duckdb_values_fit_the_arrow_types_duckdb_names(
    duck: str, arrow: pa.DataType, value: Any, back: Any
) -> None:
    schema = from_duck(
        pa.schema([pa.field("v", arrow).with_metadata({b"duckdb.type": duck})]), True
    )
    table = result_table(["v"], [{"v": value}], schema)
    assert table.schema.field("v").type == arrow
    if back is not None:
        assert table.column("v").to_pylist() == [back]


def test_rows_without_a_schema_are_typed_by_their_values() -> None:
    assert result_table([], []).num_columns == 0
    twice = result_table(["k", "k"], [{"k": "a"}])  # SELECT k, k: one dict entry
    assert twice.column_names == ["k", "k"] and table_rows(twice) == [{"k": "a"}]
    missing = result_table(["k", "x"], [{"k": "a"}, {"k": "b", "x": 1}])
    assert missing.column("x").to_pylist() == [None, 1]
    mixed = result_table(["v"], [{"v": 1}, {"v": "a"}])  # rows built by hand: not a crash
    assert mixed.column("v").to_pylist() == ["1", "a"]
