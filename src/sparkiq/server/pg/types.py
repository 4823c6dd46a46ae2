"""Result columns as Postgres types: which type OID each column is, and its values in the
text and binary formats of the wire protocol.

The type of a column comes from :data:`sparkiq.schema.kinds.KINDS` (``Kind.pg``,
``Kind.pg_oid``) when the column is a column of a table the statement reads and its values
are what that kind holds; otherwise (an expression, an aggregate, a rename) from its values:
``int`` -> int8, ``float`` -> float8, ``Decimal`` -> numeric, ``str`` -> text, ``bool`` ->
bool, ``bytes`` -> bytea, ``date`` -> date, ``datetime`` -> timestamp, dicts and lists ->
json. A column of nulls only is text.

Values arrive as :class:`~sparkiq.sql.SqlResult` holds them (PySpark's: naive datetimes in
local time for ``timestamp``); a ``timestamptz`` value is sent as that local time with the
process's UTC offset, so clients see the same instant PySpark means.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sparkiq.schema.kinds import KINDS, Kind
from sparkiq.schema.types import TableSchema
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

# The Python class of a value -> the type a computed column of such values is sent as.
# bool before int: a bool is an int.
_BY_VALUE: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "bool"),
    (int, "int8"),
    (float, "float8"),
    (Decimal, "numeric"),
    (str, "text"),
    ((bytes, bytearray, memoryview), "bytea"),
    (dt.datetime, "timestamp"),
    (dt.date, "date"),
    ((dict, list, tuple), "json"),
)


def _kind_holds(kind: Kind, value: Any) -> bool:
    """Whether ``value`` is what a column of ``kind`` holds (it was not computed into
    something else under the same name)."""
    if kind.nested:
        return isinstance(value, dict | list | tuple)
    if kind.python is None:
        return False
    if kind.python is bytes:
        return isinstance(value, bytes | bytearray | memoryview)
    if kind.python is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind.python is dt.date:
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    return isinstance(value, kind.python)


def _by_value(value: Any) -> PgType:
    for cls, name in _BY_VALUE:
        if isinstance(value, cls):
            return _TYPES[name]
    return TEXT


def text_column(name: str) -> PgColumn:
    return PgColumn(name, TEXT)


def describe_columns(
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    schemas: Iterable[TableSchema],
) -> list[PgColumn]:
    """The Postgres type of each result column (see the module docstring for the rules)."""
    declared: dict[str, Kind | None] = {}
    for schema in schemas:
        for f in schema.fields:
            kind = KINDS.get(f.type.name)
            name = f.name.lower()
            # A name two tables type differently is decided by its values.
            declared[name] = kind if declared.get(name, kind) is kind else None
    out = []
    for name in columns:
        sample = next((row[name] for row in rows if row.get(name) is not None), None)
        kind = declared.get(name.lower())
        if kind is not None and (sample is None or _kind_holds(kind, sample)):
            out.append(PgColumn(name, _TYPES[kind.pg]))
        elif sample is None:
            out.append(PgColumn(name, TEXT))
        else:
            out.append(PgColumn(name, _by_value(sample)))
    return out
