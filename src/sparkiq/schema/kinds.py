"""The one table of Spark type knowledge: :data:`KINDS`, one :class:`Kind` per Spark type name.

Every converter, codec and SQL mapping asks this table about a column's type instead of
switching on type names: how its values are held internally (and so how they are ordered,
encoded and hashed), how they are stored in rows, their Arrow type, the Python value
PySpark gives for them, how a user's key value is checked, and how the push evaluator
compares them. Adding a Spark type means adding a row here (and its sample to the table's
test, which checks every row converts a value there and back).

Codecs read the table once per schema and keep the converters it gives them (closures), so
per-row work never looks a type up. Names are Spark's JSON ``typeName`` without parameters
(``decimal(10,2)`` is the ``"decimal"`` kind; its precision and scale are passed along as
:class:`~sparkiq.schema.internal.TypeParams`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from sparkiq.schema.internal import (
    Checker,
    TypeParams,
    binary_checker,
    boolean_checker,
    date_checker,
    date_from_internal,
    date_to_internal,
    decimal_checker,
    decimal_from_internal,
    decimal_unscaled,
    float_checker,
    int_checker,
    string_checker,
    timestamp_checker,
    timestamp_from_internal,
    timestamp_ntz_checker,
    timestamp_ntz_from_internal,
    timestamp_ntz_to_internal,
    timestamp_to_internal,
)

__all__ = ["KINDS", "Convert", "Kind", "Temporal"]

#: A function from one non-null value to another representation of it.
Convert = Callable[[Any], Any]

_NESTED = frozenset({"struct", "array", "map"})


@dataclass(frozen=True, slots=True)
class Temporal:
    """A date or timestamp kind's conversions: PySpark's Python value to and from the
    internal int (days or microseconds), and ISO text to the Python value."""

    to_internal: Callable[[Any], int]
    from_internal: Callable[[int], Any]
    parse: Callable[[str], Any]


@dataclass(frozen=True, slots=True)
class Kind:
    """What sparkiq knows about one Spark type.

    - ``family``: the internal representation (``string``, ``binary``, ``boolean``, ``int``,
      ``float``, ``decimal``; ``void`` and the nested ``struct``, ``array``, ``map``), which
      fixes the key encoding and Spark's hash; ``bits`` is the width of ``int`` and ``float``
      values (a date is a 32-bit int, a timestamp a 64-bit one).
    - ``stored``: the MessagePack form of a value in a stored row (``str``, ``bin``, ``int``,
      ``float``, ``bool``, ``nil``, ``array``); ``stored_arrow`` the Arrow type whose values
      are the stored ones, when that is not the column's Arrow type.
    - ``python``: the class of the value PySpark returns (None for void and nested kinds).
    - ``zoned``: the internal value is a UTC instant that PySpark shows as local time.
    - ``arrow``: the Arrow type when it has no parameters (see :meth:`arrow_type`).
    - ``check``: the key checker (None: the type cannot be a key column); ``expects`` says
      what the internal value of a key is, for error messages.
    - ``push``: how the push evaluator types and compares values (``str``, ``num``,
      ``bool``, ``date``, ``ts``, ``bytes``; None: not comparable).
    - ``simple``: Spark's SQL spelling (``simpleString``) when it is not ``name``.
    - ``pg``: the Postgres type the wire protocol endpoint describes the column as, and
      ``pg_oid`` its type OID (``pg_type.oid``); nested kinds are ``json``.
    """

    name: str
    family: str
    stored: str
    bits: int = 0
    python: type | None = None
    zoned: bool = False
    arrow: pa.DataType | None = None
    stored_arrow: pa.DataType | None = None
    temporal: Temporal | None = None
    check: Checker | None = None
    expects: str = ""
    push: str | None = None
    simple: str = ""
    pg: str = "text"
    pg_oid: int = 25

    @property
    def key(self) -> bool:
        """Whether a key column may have this type (it has a hash, an order and an encoding)."""
        return self.check is not None

    @property
    def integral(self) -> bool:
        """byte, short, integer, long: SQL's integral numbers (not dates or timestamps)."""
        return self.family == "int" and self.python is int

    @property
    def nested(self) -> bool:
        return self.family in _NESTED

    def arrow_type(self, params: TypeParams, timestamp_tz: str | None) -> pa.DataType:
        """The Arrow type of a scalar column; ``timestamp_tz`` zones a zoned timestamp."""
        if self.zoned:
            return pa.timestamp("us", tz=timestamp_tz)
        if self.family == "decimal":
            return pa.decimal128(params.precision, params.scale)
        if self.arrow is None:
            raise TypeError(f"{self.name} has no scalar Arrow type")
        return self.arrow

    def key_converter(self, params: TypeParams, binary_as_bytes: bool) -> Convert | None:
        """Internal value -> PySpark's value; None when they are equal."""
        if self.family == "decimal":
            scale = params.scale
            return lambda unscaled: decimal_from_internal(unscaled, scale)
        if self.family == "float":
            return float
        return self._python_converter(binary_as_bytes)

    def stored_converter(self, params: TypeParams, binary_as_bytes: bool) -> Convert | None:
        """Stored value (in a row) -> PySpark's value; None when they are equal. Scalars only."""
        if self.family == "decimal":
            return Decimal
        return self._python_converter(binary_as_bytes)

    def _python_converter(self, binary_as_bytes: bool) -> Convert | None:
        if self.temporal is not None:
            return self.temporal.from_internal
        if self.family == "binary" and not binary_as_bytes:
            return bytearray
        return None

    def internal_values(self, column: Any, params: TypeParams) -> list[Any]:
        """Internal values of one Arrow column (Array or ChunkedArray) of this kind."""
        if self.family == "decimal":
            scale = params.scale
            return [None if d is None else decimal_unscaled(d, scale) for d in column.to_pylist()]
        return self._arrow_values(column)

    def stored_values(self, column: Any, params: TypeParams) -> list[Any]:
        """Stored values (see :mod:`sparkiq.schema.rowcodec`) of one scalar Arrow column."""
        if self.family == "decimal":
            return [None if d is None else str(d) for d in column.to_pylist()]
        return self._arrow_values(column)

    def _arrow_values(self, column: Any) -> list[Any]:
        if self.stored_arrow is not None:
            if pa.types.is_timestamp(column.type) and column.type.unit != "us":
                column = column.cast(pa.timestamp("us", column.type.tz))
            column = column.cast(self.stored_arrow)
        return column.to_pylist()  # type: ignore[no-any-return]

    def stored_to_arrow(
        self, values: Sequence[Any], params: TypeParams, timestamp_tz: str | None
    ) -> pa.Array:
        """An Arrow column of this scalar kind from stored values (the inverse of
        :meth:`stored_values`)."""
        target = self.arrow_type(params, timestamp_tz)
        if self.stored_arrow is None:
            return pa.array(values, target)
        return pa.array(values, self.stored_arrow).cast(target)


_TIMESTAMP = Temporal(timestamp_to_internal, timestamp_from_internal, dt.datetime.fromisoformat)
_TIMESTAMP_NTZ = Temporal(
    timestamp_ntz_to_internal, timestamp_ntz_from_internal, dt.datetime.fromisoformat
)
_DATE = Temporal(date_to_internal, date_from_internal, dt.date.fromisoformat)
_MICROS = "an int, microseconds since the epoch, in 64 bits"
_DAYS = "an int, days since 1970-01-01, in [-2**31, 2**31 - 1]"

#: Every Spark type sparkiq can store, by Spark's type name. Key types come first, in the
#: order error messages list them.
# Positional columns: name, family, stored, bits, python (see Kind).
# fmt: off
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("string", "string", "str", python=str, arrow=pa.string(),
         check=string_checker, expects="a str", push="str", pg="text", pg_oid=25),
    Kind("binary", "binary", "bin", python=bytes, arrow=pa.binary(),
         check=binary_checker, expects="bytes", push="bytes", pg="bytea", pg_oid=17),
    Kind("boolean", "boolean", "bool", python=bool, arrow=pa.bool_(),
         check=boolean_checker, expects="a bool", push="bool", pg="bool", pg_oid=16),
    Kind("byte", "int", "int", 8, int, arrow=pa.int8(), simple="tinyint",
         check=int_checker(8), expects="an int in [-128, 127]", push="num",
         pg="int2", pg_oid=21),
    Kind("short", "int", "int", 16, int, arrow=pa.int16(), simple="smallint",
         check=int_checker(16), expects="an int in [-32768, 32767]", push="num",
         pg="int2", pg_oid=21),
    Kind("integer", "int", "int", 32, int, arrow=pa.int32(), simple="int",
         check=int_checker(32), expects="an int in [-2**31, 2**31 - 1]", push="num",
         pg="int4", pg_oid=23),
    Kind("long", "int", "int", 64, int, arrow=pa.int64(), simple="bigint",
         check=int_checker(64), expects="an int in [-2**63, 2**63 - 1]", push="num",
         pg="int8", pg_oid=20),
    Kind("date", "int", "int", 32, dt.date, arrow=pa.date32(), stored_arrow=pa.int32(),
         temporal=_DATE, check=date_checker, expects=_DAYS, push="date", pg="date", pg_oid=1082),
    Kind("timestamp", "int", "int", 64, dt.datetime, zoned=True, stored_arrow=pa.int64(),
         temporal=_TIMESTAMP, check=timestamp_checker, expects=_MICROS, push="ts",
         pg="timestamptz", pg_oid=1184),
    Kind("timestamp_ntz", "int", "int", 64, dt.datetime, arrow=pa.timestamp("us"),
         stored_arrow=pa.int64(), temporal=_TIMESTAMP_NTZ, check=timestamp_ntz_checker,
         expects=_MICROS, push="ts", pg="timestamp", pg_oid=1114),
    Kind("float", "float", "float", 32, float, arrow=pa.float32(),
         check=float_checker(32), expects="a float", push="num", pg="float4", pg_oid=700),
    Kind("double", "float", "float", 64, float, arrow=pa.float64(),
         check=float_checker(64), expects="a float", push="num", pg="float8", pg_oid=701),
    Kind("decimal", "decimal", "str", python=Decimal, stored_arrow=pa.string(),
         check=decimal_checker, push="num", pg="numeric", pg_oid=1700),
    Kind("void", "void", "nil", arrow=pa.null()),
    Kind("struct", "struct", "array", pg="json", pg_oid=114),
    Kind("array", "array", "array", pg="json", pg_oid=114),
    Kind("map", "map", "array", pg="json", pg_oid=114),
)}
# fmt: on
