"""The direct converter (Spark's UnsafeRows straight to sparkiq's keys and rows) gives, on every
supported type, what the PySpark-form decoder gives -- itself checked against Spark's State
Data Source in test_unsaferow.py -- and names the store and the part that does not fit."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

from sparkiq.checkpoint import Checkpoint, RowDecoder, version_of_batch
from sparkiq.checkpoint.convert import StateRowConverter
from sparkiq.checkpoint.source import CheckpointSource, StoreTable, plan_tables
from sparkiq.checkpoint.unsaferow import UnsafeRowDecoder
from sparkiq.errors import CorruptSegmentError
from sparkiq.schema.keycodec import KeyCodec
from sparkiq.schema.rowcodec import RowCodec
from sparkiq.schema.types import TableSchema
from tests.checkpoint.streams import Stream
from tests.checkpoint.test_unsaferow import INPUT, ROWS, schema, typed

# every key type (a struct key flattens into one column per member), and values of every
# type, nested decimals included; sum(decimal) and first() fold their presence flags
KEYS = ["s", "i8", "i16", "i32", "i64", "flag", "f32", "f64", "day", "ts", "ntz"]
KEYS += ["small", "big", "bin", "st"]
VALUES = ["s", "i8", "i16", "flag", "f32", "day", "ts", "ntz", "small", "big", "bin"]
VALUES += ["st", "ints", "strs", "m", "rows", "floats"]


def every_type(frame: Any) -> Any:
    return (
        typed(frame)
        .groupBy(*KEYS)
        .agg(
            *(F.first(c).alias(f"first_{c}") for c in VALUES),
            F.sum("small").alias("sum_small"),
            F.max("ts").alias("max_ts"),
            F.count("*").alias("n"),
        )
    )


def expected_pairs(plan: StoreTable, decoder: RowDecoder, key: bytes, value: bytes | None) -> Any:
    """The old path: PySpark-form values, picked and folded as the plan says."""
    decoded_key = decoder.key(key)
    columns = []
    for path in plan.key_paths:
        found = decoded_key[path[0]]
        if len(path) == 2 and found is not None:
            found = list(found.values())[path[1]]
        columns.append(found)
    if value is None:
        return tuple(columns), None
    values = list(decoder.value(value))
    for flag, index, null_when in plan.folds:
        if bool(values[flag]) is null_when:
            values[index] = None
    row = columns + [values[i] for i in plan.value_indexes]
    return tuple(columns), dict(zip([f.name for f in plan.schema.fields], row, strict=True))


def test_converted_rows_equal_the_pyspark_form_decoder_on_every_type(
    spark: Any, tmp_path: Path
) -> None:
    stream = Stream(spark, tmp_path, INPUT, every_type)
    stream.batch(ROWS[:2])
    stream.batch(ROWS[2:])
    stream.batch(ROWS[:1])  # updates a key written in batch 0
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    (plan,) = plan_tables("t", [store])
    assert plan.folds, "the query should fold presence flags (first, sum of decimals)"
    source = CheckpointSource(ck, plan, "test")
    keys, rows, decoder = KeyCodec(plan.schema), RowCodec(plan.schema), RowDecoder(store)
    compared = 0
    for batch in ck.committed_batches():
        record = source.read_commit(batch)
        assert record is not None
        for partition in range(store.partitions):
            got_keys, got_rows = source.read_changes(record, partition)
            got = {
                keys.from_internal(keys.decode(k)): None if r is None else rows.decode(r)
                for k, r in zip(got_keys, got_rows, strict=True)
            }
            want = dict(
                expected_pairs(plan, decoder, k, v)
                for k, v in ck.files(store, partition).changes(version_of_batch(batch))
            )
            assert got == want, (batch, partition)
            compared += len(want)
    assert compared == 5


def test_internal_form_is_what_the_slots_hold() -> None:
    row_schema = schema(
        ("day", "date"), ("ts", "timestamp"), ("ntz", "timestamp_ntz"), ("small", "decimal(10,2)")
    )
    row = bytes(8) + struct.pack("<iiqqq", 19782, 0, -1, 1_700_000_000_123_456, -1250)
    assert UnsafeRowDecoder(row_schema, internal=True).decode(row) == (
        19782,
        -1,
        1_700_000_000_123_456,
        -1250,
    )
    pyspark_form = UnsafeRowDecoder(row_schema).decode(row)
    assert pyspark_form[0] == dt.date(2024, 2, 29) and pyspark_form[3] == Decimal("-12.50")


def test_bytes_that_do_not_fit_name_the_store_and_the_part() -> None:
    key_schema = schema(("k", "string"))
    value_schema = schema(("n", "long"))
    table = TableSchema.from_spark_json(
        '{"type":"struct","fields":[{"name":"k","type":"string","nullable":true,"metadata":{}},'
        '{"name":"n","type":"long","nullable":true,"metadata":{}}]}',
        ["k"],
    )
    converter = StateRowConverter(
        "t_agg", key_schema, value_schema, table, ((0,),), (0,), (), "operator 0, store 'x'"
    )
    key = bytes(8) + ((16 << 32) | 1).to_bytes(8, "little") + b"a" + bytes(7)
    value = bytes(8) + (5).to_bytes(8, "little")
    (encoded,) = converter.convert([(key, value)])
    assert KeyCodec(table).decode(encoded) == ("a",)
    with pytest.raises(CorruptSegmentError, match="operator 0, store 'x': a state value"):
        converter.convert([(key, value[:12])])
    with pytest.raises(CorruptSegmentError, match="a state key does not fit the key schema"):
        converter.convert([(key[:16], value)])


def test_changes_read_ahead_are_used_only_while_the_file_is_the_one_read(
    spark: Any, tmp_path: Path
) -> None:
    def count(frame: Any) -> Any:
        return frame.groupBy("s").agg(F.count("*").alias("n"))

    stream = Stream(spark, tmp_path, INPUT, count)
    stream.batch(ROWS[:2])
    stream.batch(ROWS)
    stream.batch(ROWS[1:3])
    ck = Checkpoint(stream.checkpoint)
    (store,) = ck.stores()
    (plan,) = plan_tables("t", [store])
    fresh = CheckpointSource(ck, plan, "test")  # reads every file when asked, never ahead
    ahead = CheckpointSource(ck, plan, "test")
    records = [ahead.read_commit(b) for b in (0, 1, 2)]
    assert all(r is not None for r in records)
    r0, r1, r2 = records
    assert r0 is not None and r1 is not None and r2 is not None
    partitions = range(store.partitions)
    assert ahead.read_ahead(1) == 0  # nothing read yet: no partition is known to be tailed
    for p in partitions:
        assert ahead.read_changes(r0, p) == fresh.read_changes(r0, p)
    assert ahead.read_ahead(1) == store.partitions
    for p in partitions:
        assert ahead.read_changes(r1, p) == fresh.read_changes(r1, p)
    # batch 2's files are read ahead, then each is replaced by other bytes (as a retried
    # batch would write it): the replacement is what is read, never the bytes read ahead
    assert ahead.read_ahead(2) == store.partitions
    for p in partitions:
        directory = store.directory(p)
        for name in ("3.delta", ".3.delta.crc"):
            replacement = tmp_path / f"replacement-{p}{name}"
            replacement.write_bytes((directory / name.replace("3", "2")).read_bytes())
            replacement.replace(directory / name)
    for p in partitions:
        assert ahead.read_changes(r2, p) == fresh.read_changes(r1, p)
