"""MessagePack values: every value PySpark returns for a stored column keeps its type and
value through pack/unpack, and malformed payloads raise ValueError, never another error."""

from __future__ import annotations

import datetime as dt
import enum
import math
from decimal import Decimal
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from sparkiq import FailureReason, ResultOrder
from sparkiq.wire.values import pack, register_enum, unpack

UTC = dt.UTC

# One value of every Spark type sparkiq stores, as Row.asDict(recursive=True) gives it.
SPARK_VALUES: dict[str, Any] = {
    "string": "gr\u00fc\u00df dich \U0001f600",
    "empty string": "",
    "byte": -128,
    "short": 32767,
    "integer": -(2**31),
    "long max": 2**63 - 1,
    "long min": -(2**63),
    "boolean true": True,
    "boolean false": False,
    "double": 0.1 + 0.2,
    "double -0.0": -0.0,
    "double inf": math.inf,
    "double -inf": -math.inf,
    "float": 1.5,
    "date": dt.date(1969, 12, 31),
    "date max": dt.date(9999, 12, 31),
    "timestamp (naive, local)": dt.datetime(2024, 2, 29, 23, 59, 59, 999999),
    "timestamp (aware)": dt.datetime(2024, 5, 1, 10, 0, tzinfo=dt.timezone(dt.timedelta(hours=-7))),
    "timestamp utc": dt.datetime(1900, 1, 1, tzinfo=UTC),
    "timestamp_ntz": dt.datetime(1, 1, 1, 0, 0),
    "decimal": Decimal("-12345678901234567890.123456789012345678"),
    "decimal exponent": Decimal("1E+3"),
    "decimal trailing zeros": Decimal("12.50"),
    "binary": bytearray(b"\x00\xff\x10"),
    "bytes": b"\x00\x01",
    "null": None,
    "array": [1, None, 3],
    "array of structs": [{"a": 1, "tags": ["x"]}, {"a": None, "tags": []}],
    "map string keys": {"a": 1, "b": None},
    "map int keys": {1: "one", -2: "minus two"},
    "map date keys": {dt.date(2024, 1, 1): Decimal("1.10"), dt.date(1999, 1, 1): None},
    "map timestamp keys": {dt.datetime(2024, 1, 1, 1): [1], dt.datetime(2024, 1, 1): []},
    "struct": {"start": dt.datetime(2024, 1, 1), "end": dt.datetime(2024, 1, 1, 0, 5)},
    "nested": {"outer": {"inner": [{"d": dt.date(2024, 1, 2), "x": bytearray(b"z")}]}},
    "composite key": ("eu", 42, dt.date(2024, 1, 3)),
    "windowed key": (("p-1", None), dt.datetime(2024, 1, 1, 0, 5)),
    "key and row pair": (Decimal("1.0"), {"k": Decimal("1.0"), "n": 7}),
}


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type all the way down (1 == 1.0 == True would hide bugs)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (a == b and math.copysign(1, a) == math.copysign(1, b)) or (a != a and b != b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(
            same(ka, kb) and same(a[ka], b[kb]) for ka, kb in zip(a, b, strict=True)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dt.datetime):
        return a == b and a.tzinfo == b.tzinfo and a.utcoffset() == b.utcoffset()
    if isinstance(a, Decimal):
        return a.as_tuple() == b.as_tuple()
    return bool(a == b)


@pytest.mark.parametrize("name", list(SPARK_VALUES))
def test_every_spark_value_round_trips_with_its_type(name: str) -> None:
    value = SPARK_VALUES[name]
    assert same(unpack(pack(value)), value), (value, unpack(pack(value)))


def test_a_whole_row_round_trips() -> None:
    row = {k.replace(" ", "_"): v for k, v in SPARK_VALUES.items()}
    assert same(unpack(pack(row)), row)


def test_nan_stays_nan() -> None:
    assert math.isnan(unpack(pack(float("nan"))))


def test_enums_travel_only_when_registered() -> None:
    assert unpack(pack(ResultOrder.DESCENDING)) is ResultOrder.DESCENDING

    class Color(enum.Enum):
        RED = 1

    with pytest.raises(TypeError, match="not registered"):
        pack(Color.RED)
    register_enum(Color, "tests.Color")
    assert unpack(pack([Color.RED])) == [Color.RED]
    forged = msgspec.msgpack.encode(msgspec.msgpack.Ext(7, b"tests.Color:BLUE"))
    with pytest.raises(ValueError, match=r"unknown enum tests\.Color:BLUE"):
        unpack(forged)


def test_arrow_tables_round_trip_with_schema_and_values() -> None:
    table = pa.table(
        {
            "k": pa.array(["a", None], pa.string()),
            "n": pa.array([1, 2**62], pa.int64()),
            "amount": pa.array([Decimal("1.10"), None], pa.decimal128(10, 2)),
            "ts": pa.array([dt.datetime(2024, 1, 1), None], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2024, 1, 1), dt.date(1960, 6, 6)], pa.date32()),
            "tags": pa.array([["x", "y"], []], pa.list_(pa.string())),
            "info": pa.array([{"a": 1}, None], pa.struct([("a", pa.int32())])),
            "raw": pa.array([b"\x00", None], pa.binary()),
        }
    )
    back = unpack(pack({"table": table}))["table"]
    assert back.schema == table.schema
    assert back.equals(table)


def test_types_the_wire_cannot_carry_are_refused_when_packing() -> None:
    for value in [{1, 2}, dt.timedelta(seconds=1), object(), dt.time(10, 0)]:
        with pytest.raises(TypeError, match="cannot send"):
            pack(value)
    # beyond MessagePack's 64 bits (DuckDB's HUGEINT), an integer travels as its Decimal
    assert unpack(pack([2**64, -(2**63) - 1, 2**64 - 1])) == [
        Decimal(2**64),
        Decimal(-(2**63) - 1),
        2**64 - 1,
    ]


def ext(code: int, payload: bytes) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, payload))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated"),
        (b"\xc1", "malformed"),
        (b"\x92\x01", "truncated"),
        (ext(1, b"not a time"), "isoformat"),
        (ext(1, b"2024-01-01T00:00:00+99:00"), "offset"),
        (ext(2, b"\xff\xfe"), "utf-8"),
        (ext(3, b"twelve"), "extension 3"),
        (ext(4, b"\x05"), "extension 4"),  # a tuple whose items are not an array
        (ext(4, b"\xc1"), "malformed"),
        (ext(5, b"not arrow"), "metadata"),
        (ext(7, b"no-such-enum"), "unknown enum"),
        (ext(8, b"\x05"), "extension 8"),  # a typed-key map whose pairs are not an array
        (ext(99, b""), "unknown MessagePack extension 99"),
    ],
)
def test_malformed_payloads_raise_value_error_naming_the_problem(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack(data)


def test_failure_reasons_are_plain_names_not_enums_on_the_wire() -> None:
    # Failure reasons travel by name in frames (see protocol.py): every one has a stable name.
    assert {r.name for r in FailureReason} >= {
        "UNKNOWN_QUERY_TYPE",
        "NOT_ACTIVE",
        "NOT_UP_TO_BOUND",
        "NOT_PRESENT",
        "DOES_NOT_EXIST",
        "STORE_EXCEPTION",
    }
