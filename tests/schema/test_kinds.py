"""The table of Spark type knowledge: complete, and every converter it gives round-trips."""

from __future__ import annotations

import datetime as dt
import inspect
from decimal import Decimal
from typing import Any, NoReturn

import pyarrow as pa
import pyspark.sql.types as T
import pytest

from sparkiq.errors import InvalidQueryError, SchemaError
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import KEY_TYPE_NAMES, DataType, Field, TableSchema, parse_type

# One PySpark value per scalar kind, as PySpark returns it (timestamps: naive local time).
SAMPLES: dict[str, tuple[str, Any]] = {
    "string": ("string", "héllo\x00"),
    "binary": ("binary", b"\x00\xffab"),
    "boolean": ("boolean", True),
    "byte": ("byte", -128),
    "short": ("short", 32767),
    "integer": ("integer", -(2**31)),
    "long": ("long", 2**63 - 1),
    "date": ("date", dt.date(1969, 12, 31)),
    "timestamp": ("timestamp", dt.datetime(2024, 3, 1, 10, 30, 5, 123456)),
    "timestamp_ntz": ("timestamp_ntz", dt.datetime(1901, 1, 2, 3, 4, 5, 6)),
    "float": ("float", 1.5),
    "double": ("double", -2.25e300),
    "decimal": ("decimal(38,10)", Decimal("-1234567890123456789012345678.0123456789")),
    "void": ("void", None),
}
# PySpark's abstract type classes (no column has them) and the concrete ones sparkiq cannot
# store: a table with such a column is refused with advice to cast it.
ABSTRACT = {
    "AnsiIntervalType",
    "AnyTimeType",
    "AtomicType",
    "DatetimeType",
    "FractionalType",
    "IntegralType",
    "NumericType",
    "SpatialType",
    "UserDefinedType",
}
UNSTORABLE = {
    "CalendarIntervalType",
    "CharType",
    "DayTimeIntervalType",
    "GeographyType",
    "GeometryType",
    "TimeType",
    "VarcharType",
    "VariantType",
    "YearMonthIntervalType",
}
CONSTRUCTOR_ARGS: dict[str, tuple[Any, ...]] = {
    "ArrayType": (T.LongType(),),
    "MapType": (T.StringType(), T.LongType()),
    "CharType": (5,),
    "VarcharType": (5,),
    "GeographyType": (4326,),
    "GeometryType": (4326,),
}


def _reject(value: Any, advice: str) -> NoReturn:
    raise InvalidQueryError(advice)


def _pyspark_types() -> dict[str, type]:
    return {
        name: cls
        for name, cls in vars(T).items()
        if inspect.isclass(cls) and issubclass(cls, T.DataType) and cls is not T.DataType
    }


def test_every_pyspark_type_has_an_entry_or_is_refused() -> None:
    classes = _pyspark_types()
    seen: set[str] = set()
    for name, cls in classes.items():
        if name in ABSTRACT or name == "StructField":  # a struct's member, not a type
            continue
        instance = cls(*CONSTRUCTOR_ARGS.get(name, ()))
        dtype = parse_type(instance.jsonValue())
        table = TableSchema((Field("k", DataType("long")), Field("c", dtype)), ("k",))
        if name in UNSTORABLE:
            assert dtype.name not in KINDS, name
            with pytest.raises(SchemaError, match="cannot store"):
                RowCodec(table)
            continue
        assert dtype.name in KINDS, f"{name} ({instance.jsonValue()!r}) has no row in KINDS"
        assert dtype.name == instance.typeName()
        assert dtype.simple_string() == instance.simpleString()
        RowCodec(table)
        seen.add(dtype.name)
    # and every row of the table is a type PySpark has (no typos, nothing stale)
    assert seen == set(KINDS)


def test_key_and_window_start_types_come_from_the_table() -> None:
    assert {n for n, k in KINDS.items() if k.key} == KEY_TYPE_NAMES
    assert set(SAMPLES) == {n for n, k in KINDS.items() if not k.nested}
    for name in ("struct", "array", "map", "void"):
        assert not KINDS[name].key
    for name, kind in KINDS.items():
        assert (kind.push is not None) == kind.key, name
        assert kind.integral == (name in ("byte", "short", "integer", "long")), name


@pytest.mark.parametrize("name", sorted(n for n, k in KINDS.items() if k.key))
def test_key_converters_round_trip(name: str) -> None:
    spelled, value = SAMPLES[name]
    dtype = parse_type(spelled)
    kind = KINDS[name]
    assert kind.check is not None
    internal = kind.check(dtype, _reject)(value)
    back = kind.key_converter(dtype, True)
    assert (internal if back is None else back(internal)) == value
    assert type(internal) is (int if kind.family in ("int", "decimal") else type(value))
    if kind.temporal is not None:
        assert kind.temporal.to_internal(value) == internal
        assert kind.temporal.from_internal(internal) == value
        assert kind.temporal.parse(value.isoformat()) == value
    codec = KeyCodec(TableSchema((Field("k", dtype),), ("k",)))
    assert codec.decode(codec.encode((internal,))) == (internal,)
    assert codec.from_internal(codec.to_internal(value)) == value
    # the key codec's Arrow path gives the same internal value and encoding
    arrow = _arrow_column(name, dtype, value)
    assert kind.internal_values(arrow, dtype) == [internal, None]
    assert codec.encode_arrow(pa.table({"k": arrow}))[0] == codec.encode((internal,))


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_stored_converters_round_trip(name: str) -> None:
    spelled, value = SAMPLES[name]
    dtype = parse_type(spelled)
    kind = KINDS[name]
    arrow = _arrow_column(name, dtype, value)
    stored = kind.stored_values(arrow, dtype)
    assert stored[1] is None
    python_class = {"str": str, "bin": bytes, "int": int, "float": float, "bool": bool}
    if kind.stored == "nil":
        assert stored[0] is None
    else:
        assert type(stored[0]) is python_class[kind.stored]
        convert = kind.stored_converter(dtype, True)
        assert (stored[0] if convert is None else convert(stored[0])) == value
    assert kind.stored_to_arrow(stored, dtype, "UTC").equals(arrow)
    table = TableSchema((Field("k", DataType("long")), Field("c", dtype)), ("k",))
    codec = RowCodec(table)
    row = codec.decode(codec.encode_arrow(pa.table({"k": [1], "c": arrow.slice(0, 1)}))[0])
    assert row == {"k": 1, "c": value}


def test_binary_converters_follow_binary_as_bytes() -> None:
    kind, dtype = KINDS["binary"], DataType("binary")
    assert kind.key_converter(dtype, True) is None
    legacy = kind.key_converter(dtype, False)
    assert legacy is not None and type(legacy(b"ab")) is bytearray
    assert kind.stored_converter(dtype, False) is bytearray


def test_window_start_converters_follow_the_start_type() -> None:
    local = dt.datetime(2024, 3, 1, 10, 0)
    for start, internal in (
        ("timestamp", KINDS["timestamp"].temporal),
        ("timestamp_ntz", KINDS["timestamp_ntz"].temporal),
    ):
        window = DataType(
            "struct",
            fields=(Field("start", DataType(start)), Field("end", DataType(start))),
        )
        schema = TableSchema(
            (Field("k", DataType("string")), Field("w", window)), ("k",), window_column="w"
        )
        assert schema.window_start is internal
        assert schema.window_start is not None
        assert schema.window_start.from_internal(schema.window_start.to_internal(local)) == local
    ntz = KINDS["timestamp_ntz"].temporal
    assert ntz is not None and ntz.to_internal(dt.datetime(1970, 1, 1, 0, 0, 1)) == 1_000_000
    unwindowed = TableSchema((Field("k", DataType("string")),), ("k",))
    assert unwindowed.window_start is None


def _arrow_column(name: str, dtype: DataType, value: Any) -> pa.Array:
    """A two-row Arrow column (the value, then null) as Spark's exchange gives it."""
    kind = KINDS[name]
    if kind.zoned:
        value = value.astimezone(dt.UTC)  # naive means local, as PySpark's
    return pa.array([value, None], kind.arrow_type(dtype, "UTC"))
