"""Result columns as Postgres types: which type OID each column is, and its values in the
text and binary formats of the wire protocol.

The type of a column comes from the result's Arrow schema (``SqlResult.schema``, decided
where the result was made: :mod:`sparkiq.sql.result_schema`), never from its values: a
table's columns get the Postgres type of their Spark type (``Kind.pg`` of
:data:`sparkiq.schema.kinds.KINDS`: ``long`` -> int8, ``float`` -> float4, ``timestamp``
-> timestamptz, ``timestamp_ntz`` -> timestamp, structs, arrays and maps -> json), and
what DuckDB computed the type of DuckDB's (``BIGINT`` -> int8, ``DOUBLE`` -> float8,
``DECIMAL`` -> numeric, ``sum`` of integers -> int8 as in Spark); intervals, times and
other types without a counterpart here are sent as text.

Values arrive as :class:`~sparkiq.sql.SqlResult` holds them (PySpark's: naive datetimes in
local time for ``timestamp``); a ``timestamptz`` value is sent as that local time with the
process's UTC offset, so clients see the same instant PySpark means.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from sparkiq.sql.result_schema import spark_type
from sparkiq.wire.jsonapi import dumps

__all__ = ["PgColumn", "describe_columns", "text_column"]

Encode = Callable[[Any], bytes]

_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_UTC = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
_PG_EPOCH_DAYS = dt.date(2000, 1, 1).toordinal()


@dataclass(frozen=True, slots=True)
class PgType:
    """One Postgres type as the endpoint sends it: OID, size (-1: variable) and encoders."""

    name: str
    oid: int
    size: int
    text: Encode
    binary: Encode


@dataclass(frozen=True, slots=True)
class PgColumn:
    """One result column: its name and Postgres type."""

    name: str
    type: PgType

    def encoder(self, binary: bool) -> Encode:
        return self.type.binary if binary else self.type.text


# -- encoders --------------------------------------------------------------------------------


def _text(value: Any) -> bytes:
    return str(value).encode()


def _bool_text(value: Any) -> bytes:
    return b"t" if value else b"f"


def _float_text(value: Any) -> bytes:
    value = float(value)
    if math.isnan(value):
        return b"NaN"
    if math.isinf(value):
        return b"Infinity" if value > 0 else b"-Infinity"
    return repr(value).encode()


def _bytea_text(value: Any) -> bytes:
    return b"\\x" + bytes(value).hex().encode()


def _timestamp_text(value: dt.datetime) -> bytes:
    return value.isoformat(sep=" ").encode()


def _timestamptz_text(value: Any) -> bytes:
    return _zoned(value).isoformat(sep=" ").encode()


def _zoned(value: dt.datetime) -> dt.datetime:
    """A naive local time (PySpark's ``timestamp``) as an aware one in the local zone."""
    return value if value.tzinfo is not None else value.astimezone()


def _json_text(value: Any) -> bytes:
    encoded: bytes = dumps(value)
    return encoded


def _int_binary(fmt: str) -> Encode:
    packer = struct.Struct(fmt).pack
    return lambda value: packer(int(value))


def _float_binary(fmt: str) -> Encode:
    packer = struct.Struct(fmt).pack
    return lambda value: packer(float(value))


def _date_binary(value: Any) -> bytes:
    return struct.pack("!i", value.toordinal() - _PG_EPOCH_DAYS)


def _micros(delta: dt.timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_binary(value: Any) -> bytes:
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return struct.pack("!q", _micros(value - _PG_EPOCH))


def _timestamptz_binary(value: Any) -> bytes:
    return struct.pack("!q", _micros(_zoned(value) - _PG_EPOCH_UTC))


def _numeric_binary(value: Any) -> bytes:
    """Postgres' binary numeric: base-10000 digits with a weight, sign and display scale."""
    number = Decimal(value)
    if number.is_nan():
        return struct.pack("!hhHH", 0, 0, 0xC000, 0)
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    text = "".join(map(str, digits)) or "0"
    # Split the integer and fraction parts into groups of four decimal digits around the point.
    point = len(text) + exponent
    integer = text[:point] if point > 0 else ""
    fraction = ("0" * max(0, -point) + text[max(point, 0) :]) if exponent < 0 else ""
    if exponent > 0:
        integer = text + "0" * exponent
    integer = integer.lstrip("0")
    integer = "0" * (-len(integer) % 4) + integer
    fraction = fraction + "0" * (-len(fraction) % 4)
    groups = [int(integer[i : i + 4]) for i in range(0, len(integer), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:  # leading zero groups (a number below one)
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    head = struct.pack("!hhHH", len(groups), weight, 0x4000 if sign else 0, dscale)
    return head + struct.pack(f"!{len(groups)}H", *groups)


def _utf8(value: Any) -> bytes:
    return str(value).encode()


# -- the types -------------------------------------------------------------------------------

_TYPES: dict[str, PgType] = {
    t.name: t
    for t in (
        PgType("bool", 16, 1, _bool_text, lambda v: b"\x01" if v else b"\x00"),
        PgType("bytea", 17, -1, _bytea_text, bytes),
        PgType("int2", 21, 2, _text, _int_binary("!h")),
        PgType("int4", 23, 4, _text, _int_binary("!i")),
        PgType("int8", 20, 8, _text, _int_binary("!q")),
        PgType("text", 25, -1, _utf8, _utf8),
        PgType("json", 114, -1, _json_text, _json_text),
        PgType("float4", 700, 4, _float_text, _float_binary("!f")),
        PgType("float8", 701, 8, _float_text, _float_binary("!d")),
        PgType("date", 1082, 4, lambda v: v.isoformat().encode(), _date_binary),
        PgType("timestamp", 1114, 8, _timestamp_text, _timestamp_binary),
        PgType("timestamptz", 1184, 8, _timestamptz_text, _timestamptz_binary),
        PgType("numeric", 1700, -1, lambda v: format(Decimal(v), "f").encode(), _numeric_binary),
    )
}

#: Postgres type name -> OID, of every type the endpoint sends (the generated catalog's pg_type).
TYPE_OIDS: dict[str, int] = {t.name: t.oid for t in _TYPES.values()}

TEXT = _TYPES["text"]


def text_column(name: str) -> PgColumn:
    return PgColumn(name, TEXT)


def describe_columns(schema: pa.Schema | None, columns: Sequence[str] = ()) -> list[PgColumn]:
    """The Postgres type of each column of a result of ``schema`` (see the module
    docstring); without a schema, ``columns`` as text."""
    if schema is None:
        return [text_column(name) for name in columns]
    return [PgColumn(field.name, _pg_type(field)) for field in schema]


def _pg_type(field: pa.Field) -> PgType:
    kind = field.type
    if pa.types.is_dictionary(kind):  # a DuckDB ENUM: its values' type
        kind = kind.value_type
    if pa.types.is_timestamp(kind):
        zoned = kind.tz is not None or spark_type(field) == "timestamp"
        return _TYPES["timestamptz" if zoned else "timestamp"]
    if pa.types.is_nested(kind):
        return _TYPES["json"]
    for test, name in _BY_ARROW:
        if test(kind):
            return _TYPES[name]
    return TEXT  # intervals, times, anything else: their text


# Arrow type -> the Postgres type its values are sent as (nested and timestamps aside).
_BY_ARROW: tuple[tuple[Callable[[pa.DataType], bool], str], ...] = (
    (pa.types.is_boolean, "bool"),
    (lambda t: pa.types.is_int8(t) or pa.types.is_int16(t) or pa.types.is_uint8(t), "int2"),
    (lambda t: pa.types.is_int32(t) or pa.types.is_uint16(t), "int4"),
    (lambda t: pa.types.is_int64(t) or pa.types.is_uint32(t), "int8"),
    (pa.types.is_uint64, "numeric"),
    (lambda t: pa.types.is_float16(t) or pa.types.is_float32(t), "float4"),
    (pa.types.is_float64, "float8"),
    (pa.types.is_decimal, "numeric"),
    (pa.types.is_date, "date"),
    (
        lambda t: (
            pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
        ),
        "bytea",
    ),
)
