"""Key and row codecs: order preservation, round trips, Arrow paths and PySpark ground truth."""

from __future__ import annotations

import datetime as dt
import itertools
import math
import os
import random
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from sparkiq.errors import InvalidQueryError, SchemaError, StoreError
from sparkiq.schema.codec import (
    KeyCodec,
    RowCodec,
    decimal_from_internal,
    prefix_end,
    timestamp_from_internal,
    timestamp_ntz_from_internal,
    timestamp_ntz_to_internal,
    timestamp_to_internal,
)
from sparkiq.schema.types import DataType, Field, TableSchema, parse_type

KEY_TYPES = [
    "string",
    "binary",
    "byte",
    "short",
    "integer",
    "long",
    "boolean",
    "float",
    "double",
    "date",
    "timestamp",
    "timestamp_ntz",
    "decimal(5,2)",
    "decimal(38,10)",
    "decimal(10,0)",
]
INT_BITS = {"byte": 8, "short": 16, "integer": 32, "long": 64}
BINARY_AS_BYTES = "spark.sql.execution.pyspark.binaryAsBytes"
MIN_US, MAX_US = -62104060800 * 10**6, 253370764800 * 10**6  # years 2..9998


def schema_of(*types: str, window: str | None = None) -> TableSchema:
    fields = [Field(f"k{i}", parse_type(t)) for i, t in enumerate(types)]
    fields.append(Field("value", DataType("long")))
    if window:
        wtype = DataType(
            "struct", fields=(Field("start", DataType(window)), Field("end", DataType(window)))
        )
        fields.append(Field("window", wtype))
    return TableSchema(
        tuple(fields), tuple(f"k{i}" for i in range(len(types))), "window" if window else None
    )


def to_f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]  # type: ignore[no-any-return]


def random_internal(rng: random.Random, type_name: str) -> Any:
    """A random internal value of one key type, edge cases and nulls included."""
    if rng.random() < 0.08:
        return None
    dtype = parse_type(type_name)
    kind = dtype.name
    if kind == "string":
        return "".join(rng.choices("ab\x00\x01\x7fé\uffff\U0001f600", k=rng.randint(0, 5)))
    if kind == "binary":
        return bytes(rng.choices([0, 1, 2, 0x7F, 0xFE, 0xFF], k=rng.randint(0, 5)))
    if kind in INT_BITS:
        low, high = -(1 << (INT_BITS[kind] - 1)), (1 << (INT_BITS[kind] - 1)) - 1
        return rng.choice([low, high, 0, -1, 1, rng.randint(-3, 3), rng.randint(low, high)])
    if kind == "boolean":
        return rng.random() < 0.5
    if kind in ("float", "double"):
        edges = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 5e-324, -5e-324, 1.5]
        negative_nan = struct.unpack(">d", bytes.fromhex("fff8000000000001"))[0]
        if rng.random() < 0.3:
            value = rng.choice([*edges, negative_nan])
        elif rng.random() < 0.5:
            value = struct.unpack(">d", rng.randbytes(8))[0]
        else:
            value = rng.uniform(-1e6, 1e6)
        if kind == "float":
            value = to_f32(value) if not abs(value) > 3e38 else math.copysign(math.inf, value)
        return math.nan if value != value else value + 0.0
    if kind == "date":
        return rng.choice([0, -1, 1, rng.randint(-719162, 2932896)])
    if kind in ("timestamp", "timestamp_ntz"):
        return rng.choice([0, -1, 1, rng.randint(MIN_US, MAX_US), rng.randint(-(10**12), 10**12)])
    if kind == "decimal":
        limit = 10**dtype.precision - 1
        return rng.choice([0, -1, 1, limit, -limit, rng.randint(-limit, limit)])
    raise AssertionError(type_name)


def natural(value: Any) -> tuple[Any, ...]:
    """Spark's ascending order for one internal value: nulls first, NaN last, -0.0 == 0.0."""
    if value is None:
        return (0,)
    if isinstance(value, float):
        return (1, 1, 0.0) if math.isnan(value) else (1, 0, value + 0.0)
    return (1, value)


def natural_key(values: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(natural(v) for v in values)


def assert_order_preserved(codec: KeyCodec, keys: list[tuple[Any, ...]]) -> None:
    ordered = sorted(keys, key=natural_key)
    encoded = [codec.encode(k) for k in ordered]
    for (a, ea), (b, eb) in itertools.pairwise(zip(ordered, encoded, strict=True)):
        if natural_key(a) == natural_key(b):
            assert ea == eb, (a, b)
        else:
            assert ea < eb, (a, b, ea, eb)
    assert sorted(encoded) == encoded


def same_key(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return natural_key(a) == natural_key(b)


ARROW_TYPES: dict[str, Callable[[DataType], Any]] = {
    "string": lambda t: pa.string(),
    "binary": lambda t: pa.binary(),
    "byte": lambda t: pa.int8(),
    "short": lambda t: pa.int16(),
    "integer": lambda t: pa.int32(),
    "long": lambda t: pa.int64(),
    "boolean": lambda t: pa.bool_(),
    "float": lambda t: pa.float32(),
    "double": lambda t: pa.float64(),
}


def arrow_column(values: list[Any], type_name: str) -> Any:
    """An Arrow column as Spark's toArrow/mapInArrow gives it, from internal values."""
    dtype = parse_type(type_name)
    if dtype.name == "date":
        return pa.array(values, pa.int32()).cast(pa.date32())
    if dtype.name == "timestamp":
        return pa.array(values, pa.int64()).cast(pa.timestamp("us", tz="America/New_York"))
    if dtype.name == "timestamp_ntz":
        return pa.array(values, pa.int64()).cast(pa.timestamp("us"))
    if dtype.name == "decimal":
        decimals = [None if v is None else decimal_from_internal(v, dtype.scale) for v in values]
        return pa.array(decimals, pa.decimal128(dtype.precision, dtype.scale))
    return pa.array(values, ARROW_TYPES[dtype.name](dtype))


# --- key codec: properties ------------------------------------------------------------------


@pytest.mark.parametrize("type_name", KEY_TYPES)
def test_single_column_order_round_trip_and_arrow(type_name: str) -> None:
    rng = random.Random(f"single-{type_name}")
    codec = KeyCodec(schema_of(type_name))
    keys = [(random_internal(rng, type_name),) for _ in range(600)]

    assert_order_preserved(codec, keys)
    for key in keys:
        data = codec.encode(key)
        assert data[:1] in (b"\x00", b"\x01")
        assert same_key(codec.decode(data), key)
        assert same_key(codec.to_internal(codec.from_internal(key)), key)

    batch = pa.record_batch({"k0": arrow_column([k[0] for k in keys], type_name)})
    assert codec.encode_arrow(batch) == [codec.encode(k) for k in keys]


@pytest.mark.parametrize("seed", range(12))
def test_composite_keys_order_round_trip_and_arrow(seed: int) -> None:
    rng = random.Random(f"composite-{seed}")
    types = rng.sample(KEY_TYPES, rng.randint(2, 4))
    codec = KeyCodec(schema_of(*types))
    # few distinct values per column, so later columns decide many comparisons
    pools = [[random_internal(rng, t) for _ in range(6)] for t in types]
    keys = [tuple(rng.choice(pool) for pool in pools) for _ in range(800)]

    assert_order_preserved(codec, keys)
    for key in keys[:200]:
        assert same_key(codec.decode(codec.encode(key)), key)
        user = codec.from_internal(key)
        assert isinstance(user, tuple) and len(user) == len(types)
        assert same_key(codec.to_internal(user), key)
        assert same_key(codec.to_internal(list(user)), key)

    columns = {f"k{i}": arrow_column([k[i] for k in keys], t) for i, t in enumerate(types)}
    columns["value"] = pa.array(range(len(keys)), pa.int64())
    table = pa.Table.from_batches(
        [pa.record_batch(columns).slice(0, 300), pa.record_batch(columns).slice(300)]
    )
    assert codec.encode_arrow(table) == [codec.encode(k) for k in keys]


def test_arrow_accepts_large_string_and_other_timestamp_units() -> None:
    codec = KeyCodec(schema_of("string", "timestamp"))
    keys = [("a\x00b", 1_500_000), (None, None), ("", -1_000_000)]
    batch = pa.record_batch(
        {
            "k0": pa.array([k[0] for k in keys], pa.large_string()),
            "k1": pa.array([k[1] for k in keys], pa.int64())
            .cast(pa.timestamp("us"))
            .cast(pa.timestamp("ns", tz="UTC")),
        }
    )
    assert codec.encode_arrow(batch) == [codec.encode(k) for k in keys]


def test_encoding_layout_is_the_documented_one() -> None:
    assert KeyCodec(schema_of("string")).encode(("a\x00",)) == b"\x01a\x00\xff\x00\x01"
    assert KeyCodec(schema_of("long")).encode((None,)) == b"\x00"
    assert KeyCodec(schema_of("integer")).encode((-1,)) == b"\x01\x7f" + b"\xff" * 7
    assert KeyCodec(schema_of("boolean")).encode((True,)) == b"\x01\x01"
    assert KeyCodec(schema_of("double")).encode((-0.0,)) == KeyCodec(schema_of("double")).encode(
        (0.0,)
    )
    assert len(KeyCodec(schema_of("decimal(38,0)")).encode((0,))) == 17


def test_windowed_keys_group_by_key_and_order_by_start() -> None:
    rng = random.Random("windowed")
    codec = KeyCodec(schema_of("string", "long", window="timestamp"))
    assert codec.windowed
    keys = list({(random_internal(rng, "string"), rng.randint(-2, 2)) for _ in range(40)})
    starts = [None, -(10**12), -1, 0, 1, 3_600_000_000, 10**15]
    entries = [(k, s) for k in keys for s in starts]
    encoded = {codec.encode_windowed(k, s): (k, s) for k, s in entries}
    assert len(encoded) == len(entries)

    for data, (key, start) in encoded.items():
        assert codec.decode_windowed(data) == (key, start)
    ordered = [encoded[d] for d in sorted(encoded)]
    assert ordered == sorted(entries, key=lambda e: (natural_key(e[0]), natural(e[1])))
    for key in keys:
        low = codec.key_prefix(key)
        high = prefix_end(low)
        inside = [encoded[d] for d in sorted(encoded) if low <= d < high]
        assert inside == [(key, s) for s in starts]

    window_type = pa.struct(
        [("start", pa.timestamp("us", tz="UTC")), ("end", pa.timestamp("us", tz="UTC"))]
    )
    batch = pa.record_batch(
        {
            "k0": pa.array([k[0] for k, _ in entries], pa.string()),
            "k1": pa.array([k[1] for k, _ in entries], pa.int64()),
            "value": pa.array([0] * len(entries), pa.int64()),
            "window": pa.array([{"start": s, "end": None} for _, s in entries], window_type),
        }
    )
    assert codec.encode_arrow(batch) == [codec.encode_windowed(k, s) for k, s in entries]


def test_prefix_end() -> None:
    assert prefix_end(b"\x01ab") == b"\x01ac"
    assert prefix_end(b"\x01a\xff\xff") == b"\x01b"
    assert prefix_end(b"\x00") == b"\x01"
    for bad in (b"", b"\xff\xff"):
        with pytest.raises(ValueError, match="no upper bound"):
            prefix_end(bad)


def test_malformed_keys_raise_store_error() -> None:
    codec = KeyCodec(schema_of("string", "long"))
    good = codec.encode(("ab", 7))
    for bad in (good[:-1], good + b"\x00", b"\x02" + good[1:], b"\x01ab\x00\x07", b""):
        with pytest.raises(StoreError, match="malformed key"):
            codec.decode(bad)


# --- key codec: user values -----------------------------------------------------------------


def test_user_values_are_converted_like_pyspark() -> None:
    codec = KeyCodec(
        schema_of("date", "timestamp_ntz", "decimal(6,2)", "binary", "float", "double")
    )
    key = (
        dt.date(1969, 12, 31),
        dt.datetime(1970, 1, 1, 0, 0, 1, 5),
        Decimal("-1.5"),
        memoryview(b"\x00x"),
        1.1,
        7,
    )
    internal = codec.to_internal(key)
    assert internal == (-1, 1_000_005, -150, b"\x00x", to_f32(1.1), 7.0)
    back = codec.from_internal(internal)
    assert back == (
        dt.date(1969, 12, 31),
        dt.datetime(1970, 1, 1, 0, 0, 1, 5),
        Decimal("-1.50"),
        b"\x00x",
        to_f32(1.1),
        7.0,
    )
    assert str(back[2]) == "-1.50" and type(back[3]) is bytes
    legacy = KeyCodec(codec.schema, binary_as_bytes=False)  # Spark 4.0's bytearray
    assert type(legacy.from_internal(internal)[3]) is bytearray
    assert codec.to_internal((None,) * 6) == (None,) * 6
    assert str(KeyCodec(schema_of("decimal(38,18)")).from_internal((10**37 + 1,))) == (
        "10000000000000000000.000000000000000001"
    )
    assert KeyCodec(schema_of("decimal(5,1)")).to_internal(Decimal("1.50")) == (15,)
    assert KeyCodec(schema_of("decimal(38,0)")).to_internal(10**38 - 1) == (10**38 - 1,)
    assert KeyCodec(schema_of("string")).from_internal(("AA",)) == "AA"
    aware = dt.datetime(2024, 3, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert KeyCodec(schema_of("timestamp")).to_internal(aware) == (1709287200 * 10**6,)


@pytest.mark.parametrize(
    ("types", "key", "expected"),
    [
        (["string"], 5, "key column 'k0' is string; got int 5: pass a str"),
        (["string"], ("AA",), "got tuple ('AA',): pass a str"),
        (["string"], "a\ud800", "lone surrogates"),
        (["integer"], True, "key column 'k0' is int; got bool True: pass an int"),
        (["integer"], 1.0, "got float 1.0: pass an int"),
        (["byte"], 128, "is tinyint; got int 128: outside [-128, 127]"),
        (["short"], -32769, "outside [-32768, 32767]"),
        (["long"], 2**63, "is bigint; got int 9223372036854775808: outside"),
        (["boolean"], 1, "is boolean; got int 1: pass True or False"),
        (["double"], "1.5", "got str '1.5': pass a float or an int"),
        (["float"], 1e39, "outside the range of float"),
        (["date"], dt.datetime(2024, 1, 1), "pass a datetime.date (not a datetime)"),
        (["timestamp"], dt.date(2024, 1, 1), "pass a datetime.datetime"),
        (["timestamp_ntz"], dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "has no time zone"),
        (["binary"], "ab", "is binary; got str 'ab': pass bytes"),
        (["decimal(5,2)"], Decimal("1.234"), "more than 2 fractional digits"),
        (["decimal(5,2)"], Decimal("1234.5"), "needs more than 5 digits (3 before the point)"),
        (["decimal(5,2)"], 1000, "got int 1000: it needs more than 5 digits"),
        (["decimal(5,2)"], 1.5, "got float 1.5: pass a decimal.Decimal"),
        (["decimal(5,2)"], Decimal("NaN"), "not finite"),
        # exponents far out of range are judged from the digits, never computed
        (["decimal(5,2)"], Decimal("1e30000000"), "decimal(5,2) holds -999.99 to 999.99"),
        (["decimal(5,2)"], Decimal("-1e99999999999"), "holds -999.99 to 999.99"),
        (["decimal(5,2)"], Decimal("1e-99999999999"), "more than 2 fractional digits"),
        (["decimal(5,2)"], 10**1000, "needs more than 5 digits"),
        (["string", "date"], "AA", "the key has 2 columns ['k0', 'k1']; got str 'AA'"),
        (["string", "date"], ("AA",), "pass a tuple of 2 values in that order"),
        (["string", "date"], ("AA", "2024-01-01"), "key column 'k1' is date; got str"),
    ],
)
def test_invalid_keys_say_what_to_pass(types: list[str], key: Any, expected: str) -> None:
    with pytest.raises(InvalidQueryError) as info:
        KeyCodec(schema_of(*types)).to_internal(key)
    assert expected in str(info.value)
    assert isinstance(info.value, ValueError)


# --- time zones -------------------------------------------------------------------------------


@pytest.fixture
def local_tz() -> Iterator[Callable[[str], None]]:
    """Switch this process's local time zone (what PySpark's conversions use); restored after."""
    saved = os.environ.get("TZ")

    def use(name: str) -> None:
        os.environ["TZ"] = name
        time.tzset()

    yield use
    if saved is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = saved
    time.tzset()


@pytest.mark.parametrize("zone", ["America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "UTC"])
def test_timestamp_conversions_match_pyspark_in_any_time_zone(
    zone: str, local_tz: Callable[[str], None]
) -> None:
    from pyspark.sql.types import TimestampNTZType, TimestampType

    local_tz(zone)
    rng = random.Random(zone)
    spark_ts, spark_ntz = TimestampType(), TimestampNTZType()
    for _ in range(500):
        micros = rng.randint(MIN_US, MAX_US)
        assert timestamp_from_internal(micros) == spark_ts.fromInternal(micros)
        assert timestamp_ntz_from_internal(micros) == spark_ntz.fromInternal(micros)
        naive = spark_ts.fromInternal(micros)
        assert timestamp_to_internal(naive) == spark_ts.toInternal(naive)
        aware = naive.replace(tzinfo=dt.timezone(dt.timedelta(minutes=rng.randint(-900, 900))))
        assert timestamp_to_internal(aware) == spark_ts.toInternal(aware)
        assert timestamp_ntz_to_internal(naive) == spark_ntz.toInternal(naive)
    if zone == "America/New_York":  # naive means local: midnight there is 05:00 UTC
        assert timestamp_to_internal(dt.datetime(2024, 1, 1)) == 1704085200 * 10**6
        assert timestamp_from_internal(1704085200 * 10**6) == dt.datetime(2024, 1, 1)
        assert timestamp_ntz_to_internal(dt.datetime(2024, 1, 1)) == 1704067200 * 10**6


# --- row codec ------------------------------------------------------------------------------

ROW_SCHEMA_DDL = """
    id INT, s STRING, b BINARY, bo BOOLEAN, by TINYINT, sh SMALLINT, l BIGINT, f FLOAT,
    d DOUBLE, dt DATE, ts TIMESTAMP, tsn TIMESTAMP_NTZ, dec DECIMAL(10,2),
    big DECIMAL(38,18),
    st STRUCT<ts: TIMESTAMP, name: STRING, inner: STRUCT<d: DATE, bin: BINARY>>,
    arr ARRAY<INT>, arr_ts ARRAY<TIMESTAMP>, arr_st ARRAY<STRUCT<a: INT, b: DECIMAL(5,2)>>,
    m MAP<STRING, TIMESTAMP>, m2 MAP<INT, ARRAY<STRING>>, m3 MAP<STRING, STRUCT<x: DATE>>,
    nested ARRAY<ARRAY<DOUBLE>>, mk MAP<STRUCT<a: INT, b: STRING>, BINARY>
"""


def spark_rows() -> list[dict[str, Any]]:
    ts = dt.datetime(2024, 3, 10, 1, 59, 59, 123456)  # local time, just before US DST starts
    old = dt.datetime(1901, 12, 13, 20, 45, 52, 1)
    full = {
        "id": 1,
        "s": "AA",
        "b": b"\x00\xffz",
        "bo": True,
        "by": -128,
        "sh": 32767,
        "l": 2**63 - 1,
        "f": 1.1,
        "d": -0.0,
        "dt": dt.date(1969, 12, 31),
        "ts": ts,
        "tsn": dt.datetime(2024, 3, 10, 2, 30),
        "dec": Decimal("-12345678.90"),
        "big": Decimal("12345678901234567890.123456789012345678"),
        "st": {"ts": old, "name": "x", "inner": {"d": dt.date(1, 1, 1), "bin": b"\x01"}},
        "arr": [1, None, 3],
        "arr_ts": [ts, None, old],
        "arr_st": [{"a": 1, "b": Decimal("1.50")}, None],
        "m": {"k": ts, "n": None},
        "m2": {1: ["a", None], 2: []},
        "m3": {"z": {"x": dt.date(2000, 2, 29)}},
        "nested": [[1.5, math.inf], [], None],
        "mk": {(1, "a"): b"v", (2, None): None},
    }
    extremes = {
        "id": 2,
        "s": "é\x00\U0001f600",
        "b": b"",
        "bo": False,
        "by": 0,
        "sh": 0,
        "l": 0,
        "f": math.inf,
        "d": math.nan,
        "dt": dt.date(9999, 12, 31),
        "ts": old,
        "tsn": dt.datetime(1, 1, 1),
        "dec": Decimal("0.00"),
        "big": Decimal("-1E-18"),
        "st": {"ts": None, "name": None, "inner": None},
        **{name: [] for name in ("arr", "arr_ts", "arr_st", "nested")},
        **{name: {} for name in ("m", "m2", "m3", "mk")},
    }
    nulls = {name: None for name in full} | {"id": 3}
    return [full, extremes, nulls]


def assert_same(got: Any, want: Any, path: str = "row") -> None:
    """Equal values of identical types at every depth (bytes == bytearray is not enough)."""
    if isinstance(want, float) and math.isnan(want):
        assert isinstance(got, float) and math.isnan(got), path
        return
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, dict):
        # keys by == only (PySpark gives a struct map key as a Row, a tuple equal to ours);
        # the order of map entries is not part of a map's value
        assert len(got) == len(want) and all(key in got for key in want), path
        for key, value in want.items():
            assert_same(got[key], value, f"{path}[{key!r}]")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


def assert_rows_equal(decoded: dict[str, Any], expected: dict[str, Any]) -> None:
    assert list(decoded) == list(expected)  # columns in schema order
    assert_same(decoded, expected)


@pytest.fixture(params=[True, False], ids=["binary_as_bytes", "binary_as_bytearray"])
def binary_as_bytes(spark: Any, request: pytest.FixtureRequest) -> Iterator[bool]:
    """Spark's setting for how PySpark returns binary values (bytes since Spark 4.1)."""
    spark.conf.set(BINARY_AS_BYTES, str(request.param).lower())
    yield bool(request.param)
    spark.conf.unset(BINARY_AS_BYTES)


def test_row_codec_matches_pyspark_collect(
    spark: Any, local_tz: Callable[[str], None], binary_as_bytes: bool
) -> None:
    # The driver's local time zone decides how PySpark turns timestamps into datetimes; a
    # zone other than the machine's (often UTC) shows the decoder applies it the same way.
    local_tz("America/New_York")
    df = spark.createDataFrame(spark_rows(), ROW_SCHEMA_DDL).coalesce(1)
    expected = [row.asDict(recursive=True) for row in df.orderBy("id").collect()]
    assert type(expected[0]["b"]) is (bytes if binary_as_bytes else bytearray)
    schema = TableSchema.from_spark_json(df.schema.json(), ["id"])
    codec = RowCodec(schema, binary_as_bytes=binary_as_bytes)

    table = df.orderBy("id").toArrow()
    decoded = [codec.decode(data) for data in codec.encode_arrow(table)]
    assert len(decoded) == len(expected) == 3
    for got, want in zip(decoded, expected, strict=True):
        assert_rows_equal(got, want)
    # Arrow holds UTC micros: New York's local 01:59 is 06:59 UTC
    utc_micros = table.column("ts").cast(pa.int64())[0].as_py()
    assert utc_micros == timestamp_ntz_to_internal(dt.datetime(2024, 3, 10, 6, 59, 59, 123456))
    first = codec.encode_arrow(table)[0]
    assert codec.decode_values(first) == list(codec.decode(first).values())


def test_codecs_in_map_in_arrow_match_collect(spark: Any) -> None:
    """Encode where the writer will: in Spark's Python workers, from mapInArrow's batches."""
    df = spark.createDataFrame(spark_rows(), ROW_SCHEMA_DDL)
    key_columns = ["id", "s", "b", "bo", "by", "sh", "l", "f", "d", "dt", "ts", "tsn", "dec"]
    schema_json = df.schema.json()

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from sparkiq.schema.codec import KeyCodec, RowCodec
        from sparkiq.schema.types import TableSchema

        schema = TableSchema.from_spark_json(schema_json, key_columns)
        keys, rows = KeyCodec(schema), RowCodec(schema)
        for batch in batches:
            yield pa.record_batch(
                {
                    "key": pa.array(keys.encode_arrow(batch), pa.binary()),
                    "row": pa.array(rows.encode_arrow(batch), pa.binary()),
                }
            )

    encoded = df.mapInArrow(encode, "key BINARY, row BINARY").collect()
    expected = {row["id"]: row.asDict(recursive=True) for row in df.collect()}
    schema = TableSchema.from_spark_json(schema_json, key_columns)
    keys, rows = KeyCodec(schema), RowCodec(schema)
    assert len(encoded) == 3
    for item in encoded:
        row = rows.decode(bytes(item["row"]))
        want = expected[row["id"]]
        assert_rows_equal(row, want)
        key = keys.from_internal(keys.decode(bytes(item["key"])))
        want_key = tuple(want[c] for c in key_columns)
        assert same_key(keys.to_internal(key), keys.to_internal(want_key))
        assert key[:7] == want_key[:7] and key[9:] == want_key[9:]


def test_row_codec_handles_sliced_arrow_and_nulls_in_nested_values() -> None:
    schema = TableSchema.from_spark_json(
        {
            "type": "struct",
            "fields": [
                {"name": "k", "type": "string", "nullable": True, "metadata": {}},
                {
                    "name": "a",
                    "type": {"type": "array", "elementType": "date", "containsNull": True},
                    "nullable": True,
                    "metadata": {},
                },
                {
                    "name": "m",
                    "type": {
                        "type": "map",
                        "keyType": "string",
                        "valueType": "binary",
                        "valueContainsNull": True,
                    },
                    "nullable": True,
                    "metadata": {},
                },
            ],
        },
        ["k"],
    )
    batch = pa.record_batch(
        {
            "k": ["x", "y", "z", "w"],
            "a": pa.array([[1], None, [2, None, 3], []], pa.list_(pa.date32())),
            "m": pa.array(
                [[("p", b"1")], [("q", None)], None, [("r", b"")]],
                pa.map_(pa.string(), pa.binary()),
            ),
        }
    ).slice(1, 3)
    codec = RowCodec(schema)
    assert [codec.decode(d) for d in codec.encode_arrow(batch)] == [
        {"k": "y", "a": None, "m": {"q": None}},
        {"k": "z", "a": [dt.date(1970, 1, 3), None, dt.date(1970, 1, 4)], "m": None},
        {"k": "w", "a": [], "m": {"r": b""}},
    ]


def test_row_format_is_plain_msgpack() -> None:
    import msgspec

    schema = TableSchema.from_spark_json(
        '{"type":"struct","fields":[{"name":"k","type":"string"},{"name":"t","type":"timestamp"},'
        '{"name":"d","type":"decimal(4,2)"},{"name":"s","type":{"type":"struct","fields":'
        '[{"name":"b","type":"binary"}]}}]}',
        ["k"],
    )
    batch = pa.record_batch(
        {
            "k": ["a"],
            "t": pa.array([1_000_001], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "d": pa.array([Decimal("1.50")], pa.decimal128(4, 2)),
            "s": pa.array([{"b": b"\x00"}], pa.struct([("b", pa.binary())])),
        }
    )
    (data,) = RowCodec(schema).encode_arrow(batch)
    assert msgspec.msgpack.decode(data) == ["a", 1_000_001, "1.50", [b"\x00"]]


def test_unsupported_column_types_are_rejected() -> None:
    schema = TableSchema((Field("k", DataType("string")), Field("i", DataType("interval"))), ("k",))
    with pytest.raises(SchemaError, match="column 'i' has type interval"):
        RowCodec(schema)


def test_codec_modules_do_not_import_pyspark() -> None:
    code = "import sys, sparkiq.schema.codec; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
