"""Key codec: validate the keys callers pass, and encode them so byte order is key order.

Keys are validated into *internal values* (one per key column; see
:mod:`sparkiq.schema.internal`), which the partitioner hashes and this codec encodes.

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

import functools
import struct
from collections.abc import Callable
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.errors import InvalidQueryError, SchemaError, StoreError
from sparkiq.schema.keyarrow import encode_int_column, encode_key_column, join_key_columns
from sparkiq.schema.kinds import KINDS, Kind
from sparkiq.schema.types import DataType, TableSchema

__all__ = ["KEY_FORMAT_VERSION", "KeyCodec", "encode_utf8_key", "prefix_end"]

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


def encode_utf8_key(data: bytes) -> bytes:
    """The encoded key of a one-string-column table whose key's UTF-8 bytes are ``data``
    (what :meth:`KeyCodec.encode` gives for that string; for callers that hold the bytes)."""
    return _PRESENT + data.replace(_ZERO, _ESCAPED_ZERO) + _TERMINATOR


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


# by the kind's internal representation (:attr:`~sparkiq.schema.kinds.Kind.family`)
_CODECS: dict[str, tuple[_Encoder, _Decoder]] = {
    "string": (_enc_str, _dec_str),
    "binary": (_enc_binary, _dec_escaped),
    "boolean": (_enc_bool, _dec_bool),
    "float": (_enc_double, _dec_double),
    "decimal": (_enc_decimal, _dec_decimal),
    "int": (_enc_int, _dec_int),
}


# --- Validation of user keys ---------------------------------------------------------------


def _encode_values(encode: _Encoder, kind: Kind, dtype: DataType, column: Any) -> list[bytes]:
    """One key column encoded value by value (the families Arrow does not encode)."""
    return list(map(encode, kind.internal_values(column, dtype)))


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _validator(column: str, dtype: DataType) -> Callable[[Any], Any]:
    """A function turning one user value for ``column`` into its internal value, or raising."""

    def reject(value: Any, advice: str) -> NoReturn:
        raise InvalidQueryError(
            f"key column {column!r} is {dtype.simple_string()}; got {_describe(value)}: {advice}"
        )

    kind = KINDS.get(dtype.name)
    if kind is None or kind.check is None:
        raise SchemaError(f"key column {column!r} has type {dtype.simple_string()}, not a key type")
    return kind.check(dtype, reject)


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
        "_kinds",
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
        kinds = tuple(KINDS[t.name] for t in self._types)
        self._kinds = kinds
        self._encoders = tuple(_CODECS[k.family][0] for k in kinds)
        self._decoders = tuple(_CODECS[k.family][1] for k in kinds)
        self._from = tuple(
            k.key_converter(t, binary_as_bytes) for k, t in zip(kinds, self._types, strict=True)
        )
        self._single = len(self._columns) == 1
        self._window_index: int | None = None
        if schema.window_column is not None:
            wtype = schema.field(schema.window_column).type
            self._window_index = [f.name for f in wtype.fields].index("start")

    @property
    def windowed(self) -> bool:
        return self._window_index is not None

    @property
    def column_steps(self) -> tuple[tuple[Callable[[Any], Any], Callable[[Any], bytes]], ...]:
        """Per key column, its validator (user value to internal value, raising
        :class:`~sparkiq.errors.InvalidQueryError`) and its encoder (internal value to its
        bytes): what :meth:`to_internal` and :meth:`encode` apply column by column."""
        return tuple(zip(self._validators, self._encoders, strict=True))

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
        return self.encode_arrow_array(batch).to_pylist()  # type: ignore[no-any-return]

    def encode_arrow_array(self, batch: Any) -> pa.Array:
        """:meth:`encode_arrow` as one binary Arrow array, encoded a column at a time
        (:mod:`sparkiq.schema.keyarrow`)."""
        columns = [
            encode_key_column(
                batch.column(name),
                kind.family,
                functools.partial(_encode_values, enc, kind, dtype),
            )
            for name, dtype, kind, enc in zip(
                self._columns, self._types, self._kinds, self._encoders, strict=True
            )
        ]
        if self._window_index is not None:
            assert self.schema.window_column is not None
            window = batch.column(self.schema.window_column)
            if isinstance(window, pa.ChunkedArray):
                window = window.combine_chunks()
            columns.append(encode_int_column(pc.struct_field(window, [self._window_index])))
        return join_key_columns(columns)

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
