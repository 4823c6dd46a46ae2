"""transformWithStateInPandas state in Spark's Avro encoding
(``spark.sql.streaming.stateStore.encodingFormat=avro``), read from a RocksDB checkpoint with
changelog checkpointing on and compared with Spark's own State Data Source: value, list and
map state, and a value state of nested and logical types. Unit tests of the Avro row codec
use rows written by fastavro's own writer as the ground truth."""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from sparkiq.checkpoint import Checkpoint, replay
from sparkiq.checkpoint.avro import AvroRowCodec, AvroStateError, avro_schema
from sparkiq.checkpoint.rocksdb import (
    RocksDBEncoding,
    RocksDBStateFiles,
    UnsupportedStateFormatError,
)
from sparkiq.checkpoint.unsaferow import UnsafeRowDecoder
from sparkiq.errors import CorruptSegmentError
from sparkiq.schema.internal import timestamp_from_internal
from sparkiq.schema.types import DataType, parse_type
from sparkiq.testing import JsonSource
from tests.checkpoint.test_rocksdb import committed, plain, rocksdb_conf
from tests.checkpoint.test_tws import BATCHES, _processor, ours, spark_rows

ENCODING = "spark.sql.streaming.stateStore.encodingFormat"


def _rich_processor() -> Any:
    """The value, list and map states of tests.checkpoint.test_tws plus ``rich``: one value
    per key of decimals, a timestamp, a date, an array, a map, a struct, binary and boolean
    (its schema is built, not parsed: a Python worker has no session to parse DDL)."""
    from pyspark.sql import types as T

    rich = T.StructType(
        [
            T.StructField("amount", T.DecimalType(10, 2)),
            T.StructField("big", T.DecimalType(25, 5)),
            T.StructField("at", T.TimestampType()),
            T.StructField("day", T.DateType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
            T.StructField(
                "inner",
                T.StructType(
                    [T.StructField("a", T.IntegerType()), T.StructField("b", T.DoubleType())]
                ),
            ),
            T.StructField("raw", T.BinaryType()),
            T.StructField("ok", T.BooleanType()),
        ]
    )
    base = type(_processor())

    class Rich(base):  # type: ignore[misc, valid-type]
        def init(self, handle: Any) -> None:
            super().init(handle)
            self.rich = handle.getValueState("rich", rich)

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Any:
            frames = list(rows)
            values = [int(v) for frame in frames for v in frame["v"]]
            total = sum(values)
            self.rich.update(
                (
                    Decimal(total) / 4,
                    Decimal(f"{total}123456789012.34567"),
                    dt.datetime(2024, 1, 1, 12, 0, 0, 250) + dt.timedelta(seconds=total),
                    dt.date(2024, 2, 29) + dt.timedelta(days=total),
                    [f"t{v}" for v in values],
                    {f"k{v}": v for v in values},
                    (total, total / 3),
                    bytes([total % 256, 0, 255]),
                    total % 2 == 0,
                )
            )
            yield from super().handleInputRows(key, iter(frames), timerValues)

    return Rich()


@pytest.fixture(scope="module")
def checkpoint(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tws-avro")
    source = JsonSource(base / "in", "k string, v long")
    before = spark.conf.get(ENCODING, None)
    spark.conf.set(ENCODING, "avro")
    try:
        with rocksdb_conf(spark, changelog=True):
            frame = (
                source.stream(spark)
                .groupBy("k")
                .transformWithStateInPandas(
                    _rich_processor(),
                    outputStructType="k string, n long",
                    outputMode="Update",
                    timeMode="None",
                )
            )
            query = (
                frame.writeStream.format("noop")
                .outputMode("update")
                .option("checkpointLocation", str(base / "cp"))
                .trigger(availableNow=True)
            )
            for rows in BATCHES:
                source.write([{"k": k, "v": v} for k, v in rows])
                handle = query.start()
                handle.awaitTermination()
                assert handle.exception() is None
    finally:
        if before is None:
            spark.conf.unset(ENCODING)
        else:
            spark.conf.set(ENCODING, before)
    return base / "cp"


def _batches(checkpoint: Path) -> list[int]:
    done = committed(checkpoint)
    assert len(done) == len(BATCHES)
    return [1, done[-1]]  # after a list put and a clear; and the final state


def test_the_checkpoint_holds_avro_rows(checkpoint: Path) -> None:
    offsets = (checkpoint / "offsets" / "0").read_text().splitlines()[1]
    assert json.loads(offsets)["conf"][ENCODING] == "avro"
    cp = Checkpoint(str(checkpoint))
    info = cp.store("count")
    files = cp.files(info, 0)
    assert isinstance(files, RocksDBStateFiles)
    records = [r for v in files.versions() for r in files.records(v) if r.value is not None]
    # version byte 0, schema id 0, then Avro: {n: union branch 1, zigzag long}; an UnsafeRow
    # of one long would be 0x00 + 16 bytes
    assert records and all(r.value[:3] == b"\x00\x00\x00" and len(r.value) < 14 for r in records)


def test_value_state_equals_spark(spark: Any, checkpoint: Path) -> None:
    for batch in _batches(checkpoint):
        want = {
            (plain(r["key"]), plain(r["value"]))
            for r in spark_rows(spark, checkpoint, batch, "count")
        }
        assert want
        assert set(ours(checkpoint, "count", batch + 1)) == want, f"batch {batch}"


def test_list_state_equals_spark_in_list_order(spark: Any, checkpoint: Path) -> None:
    for batch in _batches(checkpoint):
        want: dict[Any, list[Any]] = {}
        for r in spark_rows(spark, checkpoint, batch, "items"):
            want.setdefault(plain(r["key"]), []).append(plain(r["list_element"]))
        got: dict[Any, list[Any]] = {}
        for key, value in sorted(ours(checkpoint, "items", batch + 1)):
            *grouping, index = key
            assert index == len(got.setdefault(tuple(grouping), []))
            got[tuple(grouping)].append(value)
        assert want
        assert got == want, f"batch {batch}"
    final = committed(checkpoint)[-1]
    lists: dict[str, list[Any]] = {}
    for (grouping, _), element in sorted(ours(checkpoint, "items", final + 1)):
        lists.setdefault(grouping, []).append(element)
    assert lists["a"] == [(100, "reset"), (7, "t7"), (10, "t10")]  # put, then appends
    assert "b" not in lists  # cleared


def test_map_state_equals_spark(spark: Any, checkpoint: Path) -> None:
    for batch in _batches(checkpoint):
        want = {
            (plain(r["key"]) + plain(r["user_map_key"]), plain(r["user_map_value"]))
            for r in spark_rows(spark, checkpoint, batch, "latest")
        }
        assert want
        assert set(ours(checkpoint, "latest", batch + 1)) == want, f"batch {batch}"


def test_nested_and_logical_types_equal_spark(spark: Any, checkpoint: Path) -> None:
    for batch in _batches(checkpoint):
        want = {
            (plain(r["key"]), plain(r["value"]))
            for r in spark_rows(spark, checkpoint, batch, "rich")
        }
        got = {
            (key, tuple(_hashable(v) for v in value))
            for key, value in ours(checkpoint, "rich", batch + 1)
        }
        assert want
        assert got == want, f"batch {batch}"


def test_snapshots_and_changelogs_give_the_same_state(checkpoint: Path) -> None:
    """A replica restores from the newest snapshot (Avro rows read back from RocksDB, list
    values merged by RocksDB) when there is one; applying every changelog from version 1
    must give the same state."""
    cp = Checkpoint(str(checkpoint))
    final = committed(checkpoint)[-1] + 1
    for variable in ("count", "items", "latest", "rich"):
        info = cp.store(variable)
        for partition in range(info.partitions):
            files = cp.files(info, partition)
            from_changelogs: dict[bytes, bytes] = {}
            for version in range(1, final + 1):
                for key, value in files.changes(version):
                    if value is None:
                        from_changelogs.pop(key, None)
                    else:
                        from_changelogs[key] = value
            assert replay(cp.files(info, partition), final) == from_changelogs
            for version in files.snapshot_versions():
                assert dict(cp.files(info, partition).snapshot(version)) == replay(
                    _ChangelogsOnly(cp.files(info, partition)), version
                ), f"{variable} partition {partition} snapshot {version}"


class _ChangelogsOnly:
    """A store's files with their snapshots hidden: replay applies every changelog."""

    def __init__(self, files: Any) -> None:
        self._files = files

    def __getattr__(self, name: str) -> Any:
        return getattr(self._files, name)

    def snapshot_versions(self) -> list[int]:
        return []


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    return value


# -- the codec and the framing, against fastavro's writer --------------------------------

SCHEMA = parse_type(
    {
        "type": "struct",
        "fields": [
            {"name": "s", "type": "string"},
            {"name": "i", "type": "integer"},
            {"name": "b", "type": "byte"},
            {"name": "small", "type": "decimal(9,3)"},
            {"name": "big", "type": "decimal(30,4)"},
            {"name": "ts", "type": "timestamp"},
            {"name": "day", "type": "date"},
            {"name": "f", "type": "float"},
            {"name": "raw", "type": "binary"},
            {
                "name": "nums",
                "type": {"type": "array", "elementType": "long", "containsNull": False},
            },
            {
                "name": "points",
                "type": {
                    "type": "array",
                    "elementType": {
                        "type": "struct",
                        "fields": [
                            {"name": "x", "type": "double"},
                            {"name": "y", "type": "double"},
                        ],
                    },
                    "containsNull": True,
                },
            },
            {
                "name": "attrs",
                "type": {"type": "map", "keyType": "string", "valueType": "string",
                         "valueContainsNull": True},
            },
            {
                "name": "inner",
                "type": {"type": "struct", "fields": [{"name": "n", "type": "long"}]},
            },
        ],
    }
)  # fmt: skip


def _avro(schema: DataType, record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    schemaless_writer(out, parse_schema(avro_schema(schema)), record)
    return out.getvalue()


def _fixed(unscaled: int, size: int) -> bytes:
    return unscaled.to_bytes(size, "big", signed=True)


def test_every_type_round_trips_into_unsaferow() -> None:
    record = {
        "f0": "é-text",
        "f1": -7,
        "f2": 3,
        "f3": _fixed(-123456, 4),  # decimal(9,3): 4 bytes
        "f4": _fixed(10**29 + 5, 13),  # decimal(30,4): 13 bytes
        "f5": 1_700_000_000_123_456,
        "f6": 19_000,
        "f7": 1.5,
        "f8": b"\x00\xff",
        "f9": [1, -2, 3],
        "f10": [{"f0": 1.0, "f1": -2.5}, None],
        "f11": {"a": "x", "b": "y"},
        "f12": {"f0": 42},
    }
    row = AvroRowCodec(SCHEMA).unsafe_row(_avro(SCHEMA, record))
    got = UnsafeRowDecoder(SCHEMA).decode(row)
    assert got == (
        "é-text",
        -7,
        3,
        Decimal("-123.456"),
        Decimal(f"{10**29 + 5}e-4"),
        timestamp_from_internal(1_700_000_000_123_456),
        dt.date(1970, 1, 1) + dt.timedelta(days=19_000),
        1.5,
        b"\x00\xff",
        [1, -2, 3],
        [{"x": 1.0, "y": -2.5}, None],
        {"a": "x", "b": "y"},
        {"n": 42},
    )  # fmt: skip
    nulls = {f"f{i}": None for i in range(len(SCHEMA.fields))}
    assert UnsafeRowDecoder(SCHEMA).decode(
        AvroRowCodec(SCHEMA).unsafe_row(_avro(SCHEMA, nulls))
    ) == (None,) * len(SCHEMA.fields)
    # equal values, equal bytes: replicas key their state by these rows
    assert AvroRowCodec(SCHEMA).unsafe_row(_avro(SCHEMA, record)) == row


def test_bytes_that_are_not_one_avro_row_are_refused() -> None:
    schema = parse_type({"type": "struct", "fields": [{"name": "s", "type": "string"}]})
    codec = AvroRowCodec(schema)
    data = _avro(schema, {"f0": "abc"})
    with pytest.raises(AvroStateError, match="ends after"):
        codec.unsafe_row(data + b"\x00")
    with pytest.raises(AvroStateError, match="not an Avro row"):
        codec.unsafe_row(data[:-1])
    with pytest.raises(AvroStateError, match="string keys only"):
        AvroRowCodec(
            parse_type(
                {"type": "struct", "fields": [{"name": "m", "type": {
                    "type": "map", "keyType": "integer", "valueType": "string",
                    "valueContainsNull": True}}]}
            )
        )  # fmt: skip


KEY = parse_type({"type": "struct", "fields": [{"name": "k", "type": "string"}]})
VALUE = parse_type(
    {"type": "struct", "fields": [{"name": "x", "type": "long"}, {"name": "tag", "type": "string"}]}
)


def _files(tmp_path: Path, *, multi_value: bool = False, value_id: int = 0) -> RocksDBStateFiles:
    encoding = RocksDBEncoding(
        KEY,
        multi_value=multi_value,
        row_format="avro",
        value_schema=VALUE,
        value_schema_id=value_id,
    )
    return RocksDBStateFiles(tmp_path, encoding, name="t", partition=0)


def _element(x: int, tag: str) -> bytes:
    return b"\x00\x00\x00" + _avro(VALUE, {"f0": x, "f1": tag})


def test_list_values_split_with_and_without_delimiters(tmp_path: Path) -> None:
    files = _files(tmp_path, multi_value=True)
    decode = UnsafeRowDecoder(VALUE).decode
    # an element of 44 bytes: its length's low byte is "," (0x2C), the delimiter
    long_tag = "y" * 37
    elements = [_element(1, "a"), _element(2, long_tag), _element(3, "c")]
    assert len(elements[1]) == 44
    framed = [struct.pack("<i", len(e)) + e for e in elements]
    want = [(1, "a"), (2, long_tag), (3, "c")]
    for value in (b"".join(framed), b",".join(framed), framed[0] + b"," + framed[1] + framed[2]):
        assert [decode(row) for row in files.unframe_values(value)] == want
    with pytest.raises(CorruptSegmentError, match="does not split"):
        files.unframe_values(b"".join(framed)[:-1])


def test_a_row_of_an_evolved_schema_or_bad_bytes_is_refused(tmp_path: Path) -> None:
    files = _files(tmp_path, value_id=1)
    with pytest.raises(UnsupportedStateFormatError, match=r"schema id 0.*describes id 1"):
        files.unframe_value(_element(1, "a"))
    files = _files(tmp_path)
    assert UnsafeRowDecoder(VALUE).decode(files.unframe_value(_element(1, "a"))) == (1, "a")
    with pytest.raises(CorruptSegmentError, match="value"):
        files.unframe_value(_element(1, "a")[:-1])
    with pytest.raises(UnsupportedStateFormatError, match="version byte 1"):
        files.unframe_value(b"\x01" + _element(1, "a")[1:])
