"""Every Spark type sparkiq supports, in state keys and values, decodes exactly as PySpark
collects it from Spark's State Data Source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from sparkiq.checkpoint import Checkpoint, RowDecoder
from sparkiq.checkpoint.unsaferow import UnsafeRowDecoder, UnsafeRowError
from sparkiq.errors import ChangelogError
from sparkiq.schema.types import parse_type
from tests.checkpoint.streams import Stream, spark_state, sparkiq_state

INPUT = "s string, i long, f double, d string, t string, dec string"


def typed(frame: Any) -> Any:
    return frame.select(
        F.col("s"),
        F.col("i").cast("byte").alias("i8"),
        F.col("i").cast("short").alias("i16"),
        F.col("i").cast("int").alias("i32"),
        F.col("i").alias("i64"),
        (F.col("i") % 2 == 0).alias("flag"),
        F.col("f").cast("float").alias("f32"),
        F.col("f").alias("f64"),
        F.to_date("d").alias("day"),
        F.to_timestamp("t").alias("ts"),
        F.to_timestamp_ntz("t").alias("ntz"),
        F.col("f").cast("decimal(10,2)").alias("small"),
        F.col("dec").cast("decimal(30,5)").alias("big"),
        F.col("s").cast("binary").alias("bin"),
    ).select(
        "*",
        F.struct("s", "i32", "big").alias("st"),
        F.array("i32", F.lit(None).cast("int")).alias("ints"),
        F.array("s", F.lit(None).cast("string")).alias("strs"),
        F.create_map(F.coalesce("s", F.lit("?")), "f64").alias("m"),
        F.array(F.struct("s", "big", "day")).alias("rows"),
        F.array("f32").alias("floats"),
    )


def aggregate_every_type(frame: Any) -> Any:
    keys = ["s", "i8", "i16", "i32", "i64", "flag", "f32", "f64", "day", "ts", "ntz"]
    keys += ["small", "big", "bin", "st", "ints"]
    values = ["s", "i8", "i16", "flag", "f32", "day", "ts", "ntz", "small", "big", "bin"]
    values += ["st", "ints", "strs", "m", "rows", "floats"]
    return (
        typed(frame)
        .groupBy(*keys)
        .agg(
            *(F.first(c).alias(f"first_{c}") for c in values),
            F.max("big").alias("max_big"),
            F.max("ts").alias("max_ts"),
        )
    )


ROWS = [
    {"s": "a", "i": 1, "f": 1.25, "d": "2024-02-29", "t": "2024-03-01T12:34:56.789012",
     "dec": "12345678901234567890.12345"},
    {"s": "ünïcødé ✓", "i": -128, "f": -0.0, "d": "1969-12-31", "t": "1960-01-01T00:00:00",
     "dec": "-0.00001"},
    {"s": "", "i": 127, "f": 65504.125, "d": "9999-12-31", "t": "2262-04-11T23:47:16.854775",
     "dec": "-1234567890123456789012345.6789"},
    {"s": None, "i": None, "f": None, "d": None, "t": None, "dec": None},
]  # fmt: skip


def test_every_type_in_keys_and_values(spark: Any, tmp_path: Path) -> None:
    stream = Stream(spark, tmp_path, INPUT, aggregate_every_type)
    stream.batch(ROWS[:2])
    stream.batch(ROWS[2:])
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    names = {f.type.name for f in (*store.key_schema.fields, *store.value_schema.fields)}
    assert {"decimal", "binary", "struct", "array", "map", "timestamp_ntz", "float"} <= names
    for batch in (0, 1):
        expected = spark_state(spark, ck.path, batch)
        assert len(expected) == 2 * (batch + 1)
        assert sparkiq_state(ck, store, batch) == expected


def test_a_type_sparkiq_cannot_decode_is_refused_naming_operator_and_field(
    spark: Any, tmp_path: Path
) -> None:
    def build(frame: Any) -> Any:
        interval = F.make_interval(F.lit(0), F.lit(0), F.lit(0), F.col("i").cast("int"))
        return frame.groupBy("s").agg(F.first(interval).alias("span"))

    stream = Stream(spark, tmp_path, INPUT, build)
    stream.batch(ROWS[:1])
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    with pytest.raises(ChangelogError) as caught:
        RowDecoder(store)
    message = str(caught.value)
    assert "operator 0 (stateStoreSave)" in message and "interval" in message
    assert "supported:" in message


def schema(*fields: tuple[str, str]) -> Any:
    return parse_type(
        {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True} for n, t in fields]}
    )


def test_bytes_that_do_not_fit_the_schema_raise_instead_of_decoding() -> None:
    longs = UnsafeRowDecoder(schema(("a", "long"), ("b", "long")))
    row = bytes(8) + (7).to_bytes(8, "little") + (9).to_bytes(8, "little")
    assert longs.decode(row) == (7, 9)
    with pytest.raises(UnsafeRowError):
        longs.decode(row[:16])  # one field short
    with pytest.raises(UnsafeRowError):
        longs.decode(row + bytes(8))  # a row of three fields
    text = UnsafeRowDecoder(
        schema(
            ("s", "string"),
        )
    )
    good = bytes(8) + ((16 << 32) | 2).to_bytes(8, "little") + b"hi" + bytes(6)
    assert text.decode(good) == ("hi",)
    assert text.decode((1).to_bytes(8, "little") + bytes(8)) == (None,)  # a null string
    for internal in (False, True):  # one string field has a decoder of its own: same answers
        assert UnsafeRowDecoder(text.schema, internal=internal).decode(good) == ("hi",)
    with pytest.raises(UnsafeRowError):  # points past the row's end
        text.decode(bytes(8) + ((16 << 32) | 40).to_bytes(8, "little") + b"hi" + bytes(6))
    with pytest.raises(UnsafeRowError):  # not UTF-8
        text.decode(bytes(8) + ((16 << 32) | 2).to_bytes(8, "little") + b"\xff\xfe" + bytes(6))
    with pytest.raises(UnsafeRowError):  # a null bit past the last field
        text.decode((2).to_bytes(8, "little") + good[8:])
