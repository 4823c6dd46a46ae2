"""Key codec: validate the keys callers pass, and encode them so byte order is key order.

Internal key values
-------------------
Between validation and encoding (and in the partitioner, which hashes the same values as
Spark), a key is a tuple with one *internal* value per key column:

=========================================  ===============================================
Spark type                                 internal value
=========================================  ===============================================
string                                     ``str``
binary                                     ``bytes``
byte / short / integer / long              ``int``
boolean                                    ``bool``
float / double                             ``float`` (float keys rounded to float32;
                                           ``-0.0`` normalized to ``0.0``)
date                                       ``int`` days since 1970-01-01
timestamp / timestamp_ntz                  ``int`` microseconds since the epoch
decimal(p, s)                              ``int`` unscaled value (value * 10**s)
(any, null)                                ``None``
=========================================  ===============================================

Key encoding, format version 1 (:data:`KEY_FORMAT_VERSION`)
-----------------------------------------------------------
An encoded key is the concatenation of its columns' encodings, in key-column order, followed
for a windowed table by the window start (encoded like a timestamp column). Bytewise order of
encodings equals the key's natural order: Spark's ascending order per column with nulls
first, lexicographic across columns. Every column encoding is self-delimiting (no encoding is
a prefix of another), so composite keys compare column by column and all windows of one key
share that key's encoding as a prefix. See the constants below for each column's bytes.

Invariant: the first byte of every encoded key is ``0x00`` or ``0x01`` (the first column's
null marker). Stores may rely on keys never starting with ``0xFF`` (for metadata records).
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
import numbers
import struct
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.errors import InvalidQueryError, SchemaError, StoreError
from sparkiq.schema.types import DataType, TableSchema

__all__ = [
    "KEY_FORMAT_VERSION",
    "KeyCodec",
    "date_from_internal",
    "date_to_internal",
    "decimal_from_internal",
    "decimal_unscaled",
    "prefix_end",
    "timestamp_from_internal",
    "timestamp_ntz_from_internal",
    "timestamp_ntz_to_internal",
    "timestamp_to_internal",
]

#: Version of the byte layout below; recorded by stores, bumped on any change.
KEY_FORMAT_VERSION = 1

# Per column, one marker byte: NULL sorts before every value (Spark: nulls first).
_NULL = b"\x00"
_PRESENT = b"\x01"
# Integers, dates, timestamps: marker + 8-byte big-endian of (value + 2**63), i.e. two's
# complement with the sign bit flipped, so negative values sort before positive ones.
_BIAS64 = 1 << 63
_MARK_U64 = struct.Struct(">BQ")
_U64 = struct.Struct(">Q")
# Booleans: marker + 0x00 (false) or 0x01 (true).
_FALSE = b"\x01\x00"
_TRUE = b"\x01\x01"
# Floats and doubles: marker + the IEEE 754 double's 8 bytes, transformed so unsigned order is
# numeric order: positive numbers get the sign bit set, negative numbers get every bit
# inverted. -0.0 is encoded as 0.0, and every NaN as one value above +inf (Spark sorts NaN
# last and treats all NaNs as equal).
_DOUBLE = struct.Struct(">d")
_ALL_ONES = (1 << 64) - 1
_NAN_BITS = 0x7FF8000000000000 | _BIAS64
# Decimals: marker + 16-byte big-endian of (unscaled + 2**127); the scale is fixed by the
# column type, so unscaled order is numeric order. 38 digits fit in 127 bits.
_BIAS128 = 1 << 127
# Strings (UTF-8, whose byte order is code point order, Spark's binary collation) and binary:
# marker + the bytes with each 0x00 escaped as 0x00 0xFF, then the terminator 0x00 0x01. The
# terminator sorts below any escaped or ordinary continuation, so a prefix sorts first.
_ZERO = b"\x00"
_ESCAPED_ZERO = b"\x00\xff"
_TERMINATOR = b"\x00\x01"

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH = dt.datetime(1970, 1, 1)
_ONE_US = dt.timedelta(microseconds=1)
_INT_BITS = {"byte": 8, "short": 16, "integer": 32, "long": 64}
_FLOAT32 = struct.Struct("<f")


# --- Conversions between Python values and internal values (PySpark's own formulas) --------


def date_to_internal(value: dt.date) -> int:
    """Days since 1970-01-01, as PySpark's ``DateType.toInternal``."""
    return value.toordinal() - _EPOCH_ORDINAL


def date_from_internal(days: int) -> dt.date:
    return dt.date.fromordinal(days + _EPOCH_ORDINAL)


def timestamp_to_internal(value: dt.datetime) -> int:
    """Microseconds since the epoch, as PySpark's ``TimestampType.toInternal``.

    A naive datetime is *local* time (the process's ``TZ``); an aware one is converted to UTC.
    """
    seconds = (
        calendar.timegm(value.utctimetuple()) if value.tzinfo else time.mktime(value.timetuple())
    )
    return int(seconds) * 1_000_000 + value.microsecond


def timestamp_from_internal(micros: int) -> dt.datetime:
    """A naive *local* datetime, exactly as PySpark's ``TimestampType.fromInternal``."""
    return dt.datetime.fromtimestamp(micros // 1_000_000).replace(microsecond=micros % 1_000_000)


def timestamp_ntz_to_internal(value: dt.datetime) -> int:
    """The wall clock of a naive datetime as microseconds since 1970-01-01 00:00."""
    return (value - _EPOCH) // _ONE_US


def timestamp_ntz_from_internal(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=micros)


def decimal_unscaled(value: Decimal, scale: int) -> int | None:
    """``value * 10**scale`` as an exact int, or None if that is not an integer (or NaN/inf).

    Integer arithmetic on the digits: ``Decimal.scaleb`` would round to the context's
    28 digits, and Spark decimals have up to 38.
    """
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return None
    coefficient = int("".join(map(str, digits))) if digits else 0
    shift = exponent + scale
    unscaled: int
    if shift >= 0:
        unscaled = coefficient * 10**shift
    else:
        unscaled, remainder = divmod(coefficient, 10**-shift)
        if remainder:
            return None
    return -unscaled if sign else unscaled


def decimal_from_internal(unscaled: int, scale: int) -> Decimal:
    """A Decimal with exactly ``scale`` fractional digits (string parsing is exact)."""
    return Decimal(f"{unscaled}E{-scale}")


def prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string that starts with ``prefix``.

    ``[prefix, prefix_end(prefix))`` is the range of all keys with that prefix. Raises
    ValueError for an empty or all-0xFF prefix, which has no such bound (an encoded key never
    starts with 0xFF, so :meth:`KeyCodec.key_prefix` never returns one).
    """
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        raise ValueError(f"prefix {prefix!r} has no upper bound")
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


# --- Per-column encoders and decoders ----------------------------------------------------

_Encoder = Callable[[Any], bytes]
_Decoder = Callable[[bytes, int], tuple[Any, int]]


def _enc_int(value: int | None) -> bytes:
    return _NULL if value is None else _MARK_U64.pack(1, value + _BIAS64)


def _enc_bool(value: bool | None) -> bytes:
    return _NULL if value is None else (_TRUE if value else _FALSE)


def _enc_double(value: float | None) -> bytes:
    if value is None:
        return _NULL
    if value != value:
        return _MARK_U64.pack(1, _NAN_BITS)
    if value == 0.0:
        value = 0.0  # -0.0 == 0.0 in Spark's order
    bits = _U64.unpack(_DOUBLE.pack(value))[0]
    return _MARK_U64.pack(1, bits ^ _ALL_ONES if bits & _BIAS64 else bits | _BIAS64)


def _enc_decimal(value: int | None) -> bytes:
    return _NULL if value is None else _PRESENT + (value + _BIAS128).to_bytes(16, "big")


def _enc_str(value: str | None) -> bytes:
    if value is None:
        return _NULL
    return _PRESENT + value.encode("utf-8").replace(_ZERO, _ESCAPED_ZERO) + _TERMINATOR


def _enc_binary(value: bytes | None) -> bytes:
    if value is None:
        return _NULL
    return _PRESENT + bytes(value).replace(_ZERO, _ESCAPED_ZERO) + _TERMINATOR


def _dec_int(data: bytes, pos: int) -> tuple[Any, int]:
    if data[pos] == 0:
        return None, pos + 1
    return _U64.unpack_from(data, pos + 1)[0] - _BIAS64, pos + 9


def _dec_bool(data: bytes, pos: int) -> tuple[Any, int]:
    if data[pos] == 0:
        return None, pos + 1
    return data[pos + 1] == 1, pos + 2


def _dec_double(data: bytes, pos: int) -> tuple[Any, int]:
    if data[pos] == 0:
        return None, pos + 1
    bits = _U64.unpack_from(data, pos + 1)[0]
    bits = bits ^ _BIAS64 if bits & _BIAS64 else bits ^ _ALL_ONES
    return _DOUBLE.unpack(_U64.pack(bits))[0], pos + 9


def _dec_decimal(data: bytes, pos: int) -> tuple[Any, int]:
    if data[pos] == 0:
        return None, pos + 1
    if pos + 17 > len(data):
        raise ValueError("truncated decimal")
    return int.from_bytes(data[pos + 1 : pos + 17], "big") - _BIAS128, pos + 17


def _dec_escaped(data: bytes, pos: int) -> tuple[bytes | None, int]:
    if data[pos] == 0:
        return None, pos + 1
    start = pos + 1
    zero = data.index(_ZERO, start)
    if data[zero + 1] == 0x01:  # no escaped zero: the common case
        return data[start:zero], zero + 2
    parts = []
    while True:
        zero = data.index(_ZERO, start)
        follower = data[zero + 1]
        parts.append(data[start:zero])
        if follower == 0x01:
            return b"".join(parts), zero + 2
        if follower != 0xFF:
            raise ValueError(f"bad escape byte {follower:#x}")
        parts.append(_ZERO)
        start = zero + 2


def _dec_str(data: bytes, pos: int) -> tuple[Any, int]:
    raw, pos = _dec_escaped(data, pos)
    return (None if raw is None else raw.decode("utf-8")), pos


_CODECS: dict[str, tuple[_Encoder, _Decoder]] = {
    "string": (_enc_str, _dec_str),
    "binary": (_enc_binary, _dec_escaped),
    "boolean": (_enc_bool, _dec_bool),
    "float": (_enc_double, _dec_double),
    "double": (_enc_double, _dec_double),
    "decimal": (_enc_decimal, _dec_decimal),
    **{name: (_enc_int, _dec_int) for name in (*_INT_BITS, "date", "timestamp", "timestamp_ntz")},
}


# --- Validation of user keys ---------------------------------------------------------------


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _validator(column: str, dtype: DataType) -> Callable[[Any], Any]:
    """A function turning one user value for ``column`` into its internal value, or raising."""
    kind = dtype.name

    def reject(value: Any, advice: str) -> NoReturn:
        raise InvalidQueryError(
            f"key column {column!r} is {dtype.simple_string()}; got {_describe(value)}: {advice}"
        )

    def as_int(value: Any) -> int | None:
        if type(value) is int:
            return value
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)  # numpy integers
        return None

    if kind == "string":

        def check_string(value: Any) -> Any:
            if value is None or (type(value) is str and value.isascii()):
                return value
            if not isinstance(value, str):
                reject(value, "pass a str")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                reject(value, "pass a str without lone surrogates (it must encode as UTF-8)")
            return str(value)

        return check_string
    if kind in _INT_BITS:
        low, high = -(1 << (_INT_BITS[kind] - 1)), (1 << (_INT_BITS[kind] - 1)) - 1

        def check_int(value: Any) -> Any:
            if value is None:
                return None
            number = as_int(value)
            if number is None:
                reject(value, "pass an int")
            if not low <= number <= high:
                reject(value, f"outside [{low}, {high}]; pass an int in that range")
            return number

        return check_int
    if kind == "boolean":

        def check_bool(value: Any) -> Any:
            if value is None or isinstance(value, bool):
                return value
            reject(value, "pass True or False")

        return check_bool
    if kind in ("float", "double"):

        def check_float(value: Any) -> Any:
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                reject(value, "pass a float or an int")
            try:
                number = float(value)
                if kind == "float" and not math.isinf(number):
                    # a FloatType column holds float32 values: match what Spark stores
                    number = _FLOAT32.unpack(_FLOAT32.pack(number))[0]
            except OverflowError:
                reject(value, f"outside the range of {kind}; pass a smaller number")
            if number != number:
                return math.nan
            return number + 0.0  # -0.0 -> 0.0, as Spark normalizes keys

        return check_float
    if kind == "date":

        def check_date(value: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, dt.date) or isinstance(value, dt.datetime):
                reject(value, "pass a datetime.date (not a datetime)")
            return date_to_internal(value)

        return check_date
    if kind == "timestamp":

        def check_timestamp(value: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, dt.datetime):
                reject(value, "pass a datetime.datetime (naive means local time)")
            try:
                return timestamp_to_internal(value)
            except (OverflowError, ValueError) as exc:
                reject(value, f"cannot convert it ({exc}); pass a datetime in Spark's range")

        return check_timestamp
    if kind == "timestamp_ntz":

        def check_timestamp_ntz(value: Any) -> Any:
            if value is None:
                return None
            if not isinstance(value, dt.datetime):
                reject(value, "pass a naive datetime.datetime")
            if value.tzinfo is not None:
                reject(value, "pass a naive datetime.datetime (timestamp_ntz has no time zone)")
            return timestamp_ntz_to_internal(value)

        return check_timestamp_ntz
    if kind == "binary":

        def check_binary(value: Any) -> Any:
            if value is None or type(value) is bytes:
                return value
            if isinstance(value, bytes | bytearray | memoryview):
                return bytes(value)
            reject(value, "pass bytes, bytearray or memoryview")

        return check_binary
    if kind == "decimal":
        precision, scale = dtype.precision, dtype.scale
        limit = 10**precision

        def check_decimal(value: Any) -> Any:
            if value is None:
                return None
            number = as_int(value)
            if number is None and not isinstance(value, Decimal):
                reject(value, "pass a decimal.Decimal (e.g. Decimal('1.25')) or an int")
            unscaled = decimal_unscaled(value if number is None else Decimal(number), scale)
            if unscaled is None:
                reject(
                    value,
                    f"it has more than {scale} fractional digits (or is not finite); "
                    "pass a Decimal rounded to the column's scale",
                )
            if abs(unscaled) >= limit:
                reject(
                    value,
                    f"it needs more than {precision} digits ({precision - scale} before the "
                    "point); pass a smaller value",
                )
            return unscaled

        return check_decimal
    raise SchemaError(f"key column {column!r} has type {dtype.simple_string()}, not a key type")


def _from_internal(dtype: DataType, binary_as_bytes: bool) -> Callable[[Any], Any] | None:
    kind = dtype.name
    if kind == "date":
        return date_from_internal
    if kind == "timestamp":
        return timestamp_from_internal
    if kind == "timestamp_ntz":
        return timestamp_ntz_from_internal
    if kind == "decimal":
        scale = dtype.scale
        return lambda unscaled: decimal_from_internal(unscaled, scale)
    if kind == "binary":
        return None if binary_as_bytes else bytearray
    if kind in ("float", "double"):
        return float
    return None


def _arrow_internal(column: Any, dtype: DataType) -> list[Any]:
    """Internal values of one Arrow key column (Array or ChunkedArray)."""
    kind = dtype.name
    if kind in ("timestamp", "timestamp_ntz"):
        if column.type.unit != "us":
            column = column.cast(pa.timestamp("us", column.type.tz))
        return column.cast(pa.int64()).to_pylist()  # type: ignore[no-any-return]
    if kind == "date":
        return column.cast(pa.int32()).to_pylist()  # type: ignore[no-any-return]
    if kind == "decimal":
        scale = dtype.scale
        return [None if d is None else decimal_unscaled(d, scale) for d in column.to_pylist()]
    return column.to_pylist()  # type: ignore[no-any-return]


class KeyCodec:
    """Validates, converts and encodes the keys of one table (see the module docstring).

    ``binary_as_bytes`` says how :meth:`from_internal` returns binary columns: as bytes
    (Spark >= 4.1's default, ``spark.sql.execution.pyspark.binaryAsBytes=true``) or as
    bytearray (Spark 4.0, or that setting off), matching the table's rows. Thread-safe and
    immutable after construction; build one per table and reuse it.
    """

    __slots__ = (
        "_columns",
        "_decoders",
        "_encoders",
        "_from",
        "_single",
        "_types",
        "_validators",
        "_window_index",
        "schema",
    )

    def __init__(self, schema: TableSchema, *, binary_as_bytes: bool = True) -> None:
        self.schema = schema
        self._columns = schema.key_columns
        self._types = schema.key_types
        self._validators = tuple(
            _validator(c, t) for c, t in zip(self._columns, self._types, strict=True)
        )
        self._encoders = tuple(_CODECS[t.name][0] for t in self._types)
        self._decoders = tuple(_CODECS[t.name][1] for t in self._types)
        self._from = tuple(_from_internal(t, binary_as_bytes) for t in self._types)
        self._single = len(self._columns) == 1
        self._window_index: int | None = None
        if schema.window_column is not None:
            wtype = schema.field(schema.window_column).type
            self._window_index = [f.name for f in wtype.fields].index("start")

    @property
    def windowed(self) -> bool:
        return self._window_index is not None

    def to_internal(self, key: Any) -> tuple[Any, ...]:
        """Validate a user key (scalar for one key column, tuple/list for several).

        Raises :class:`~sparkiq.errors.InvalidQueryError` naming the column, its type, the
        value received and what to pass instead.
        """
        if self._single:
            return (self._validators[0](key),)
        if not isinstance(key, tuple | list) or len(key) != len(self._columns):
            raise InvalidQueryError(
                f"the key has {len(self._columns)} columns {list(self._columns)}; got "
                f"{_describe(key)}: pass a tuple of {len(self._columns)} values in that order"
            )
        return tuple([check(value) for check, value in zip(self._validators, key, strict=True)])

    def from_internal(self, values: tuple[Any, ...]) -> Any:
        """The key as PySpark's ``Row.asDict()`` shows it: a scalar, or a tuple for several."""
        if self._single:
            value, convert = values[0], self._from[0]
            return value if convert is None or value is None else convert(value)
        return tuple(
            [
                value if convert is None or value is None else convert(value)
                for convert, value in zip(self._from, values, strict=True)
            ]
        )

    def encode(self, internal: tuple[Any, ...]) -> bytes:
        """Order-preserving, self-delimiting encoding of an internal key."""
        if self._single:
            return self._encoders[0](internal[0])
        return b"".join([enc(value) for enc, value in zip(self._encoders, internal, strict=True)])

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """Inverse of :meth:`encode` (``-0.0`` comes back as ``0.0``, any NaN as ``nan``)."""
        values, pos = self._decode_columns(data)
        if pos != len(data):
            raise StoreError(f"malformed key {bytes(data)!r}: {len(data) - pos} trailing bytes")
        return values

    def encode_windowed(self, internal_key: tuple[Any, ...], window_start_us: int | None) -> bytes:
        """The store key of one window: the key's encoding, then the window start's."""
        return self.encode(internal_key) + _enc_int(window_start_us)

    def decode_windowed(self, data: bytes) -> tuple[tuple[Any, ...], int | None]:
        values, pos = self._decode_columns(data)
        try:
            start, pos = _dec_int(data, pos)
        except (IndexError, struct.error) as exc:
            raise StoreError(f"malformed windowed key {bytes(data)!r}: {exc}") from None
        if pos != len(data):
            raise StoreError(f"malformed windowed key {bytes(data)!r}: trailing bytes")
        return values, start

    def key_prefix(self, internal_key: tuple[Any, ...]) -> bytes:
        """Prefix shared by every window of ``internal_key`` and by nothing else.

        All windows of the key lie in ``[prefix, prefix_end(prefix))``, ordered by start.
        """
        return self.encode(internal_key)

    def encode_arrow(self, batch: Any) -> list[bytes]:
        """Encode the key (plus window start when windowed) of every row of an Arrow
        RecordBatch or Table, as :meth:`encode`/:meth:`encode_windowed` would."""
        columns = [
            list(map(enc, _arrow_internal(batch.column(name), dtype)))
            for name, dtype, enc in zip(self._columns, self._types, self._encoders, strict=True)
        ]
        if self._window_index is not None:
            assert self.schema.window_column is not None
            window = batch.column(self.schema.window_column)
            start_type = self.schema.window_start_type
            assert start_type is not None
            starts = _arrow_internal(pc.struct_field(window, [self._window_index]), start_type)
            columns.append(list(map(_enc_int, starts)))
        if len(columns) == 1:
            return columns[0]
        return [b"".join(parts) for parts in zip(*columns, strict=True)]

    def _decode_columns(self, data: bytes) -> tuple[tuple[Any, ...], int]:
        if not isinstance(data, bytes):
            data = bytes(data)
        values = []
        pos = 0
        try:
            for dec in self._decoders:
                if data[pos] > 1:
                    raise ValueError(f"bad null marker {data[pos]:#x} at byte {pos}")
                value, pos = dec(data, pos)
                values.append(value)
        except (IndexError, ValueError, struct.error) as exc:
            raise StoreError(f"malformed key {data!r}: {exc}") from None
        return tuple(values), pos
