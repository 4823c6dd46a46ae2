"""Decoding Spark's ``UnsafeRow`` bytes (the state store's keys and values) by a struct type.

Layout of a row of ``n`` fields (all integers little-endian, as Spark writes them on x86 and
ARM)::

    null bitset   ceil(n / 64) 64-bit words; bit i set = field i is null
    fixed slots   n * 8 bytes, one per field:
                  boolean/byte/short/int/float/date: the value in the slot's low bytes
                  long/double/timestamp/timestamp_ntz: the value
                  decimal(p <= 18, s): the unscaled value as a long
                  anything else: (offset << 32) | size of its bytes, offset from the row start
    variable part the bytes of strings, binaries, large decimals (big-endian two's complement
                  unscaled value), nested rows, arrays and maps, each padded to 8 bytes

An array (``UnsafeArrayData``) is an int64 element count, a null bitset of ceil(count / 64)
words, then the elements at their natural width (1 byte for boolean/byte, 2 short, 4 int,
float and date, 8 for the rest; variable-length elements as offset-and-size from the array's
start), padded to 8 bytes, then the variable part. A map is an int64 byte length of its key
array, the key array, and the value array.

:class:`UnsafeRowDecoder` compiles a schema once into one ``struct`` unpack per row plus a
converter per field that needs one. Values are what sparkiq returns for the same Spark types
(see :mod:`sparkiq.schema.rowcodec`): ``Row.asDict(recursive=True)`` after ``collect()`` --
timestamps as naive local datetimes, timestamp_ntz as naive wall-clock datetimes, dates,
Decimals, binary as bytes, nested structs and maps as dicts, arrays as lists; a top-level row
is a tuple in field order. ``UnsafeRowDecoder(schema, internal=True)`` instead gives the values
in sparkiq's internal form (:mod:`sparkiq.schema.internal`), which is what Spark's slots already
hold: dates as days, timestamps as microseconds, decimals as unscaled ints, nested structs as
tuples, maps as lists of ``(key, value)`` pairs -- no conversion per value, and what the key
codec encodes and (decimals aside) the row codec stores.

Every offset and size is checked against the row's length and the row's length against the
schema, so bytes that do not fit raise :class:`UnsafeRowError` instead of decoding into a
wrong value.

The RocksDB provider splits some keys into two rows (a prefix-scan key's prefix columns and
the rest) and transformWithState nests rows in rows (a map state key's grouping key and user
key); :func:`join_rows` and :func:`nested_row` take them apart and put them together at the
byte level. Both check the rows they are given as the decoder would (:func:`check_row`): the
decoder sees only the joined row, in which a cut-short part no longer shows.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from sparkiq.errors import ChangelogError
from sparkiq.schema.internal import (
    date_from_internal,
    decimal_from_internal,
    timestamp_from_internal,
    timestamp_ntz_from_internal,
)
from sparkiq.schema.types import DataType

__all__ = [
    "SUPPORTED_TYPES",
    "UnsafeRowDecoder",
    "UnsafeRowError",
    "check_row",
    "field_is_variable",
    "join_rows",
    "nested_row",
]


class UnsafeRowError(ChangelogError, ValueError):
    """Bytes that are not an UnsafeRow of the expected schema, or a type not supported."""


# (buffer, base offset of the enclosing row or array, raw slot value) -> Python value
_Read = Callable[[bytes, int, Any], Any]

# struct codes of a field's 8-byte slot in a row, and of an element in an array
_SLOT = {
    "boolean": ("?7x", "?"),
    "byte": ("b7x", "b"),
    "short": ("h6x", "h"),
    "integer": ("i4x", "i"),
    "date": ("i4x", "i"),
    "float": ("f4x", "f"),
    "long": ("q", "q"),
    "timestamp": ("q", "q"),
    "timestamp_ntz": ("q", "q"),
    "double": ("d", "d"),
}
_VARIABLE = frozenset({"string", "binary", "struct", "array", "map"})
#: Spark types this decoder reads (decimals of any precision included).
SUPPORTED_TYPES = frozenset({*_SLOT, *_VARIABLE, "decimal", "void"})
_MAX_COMPACT_DECIMAL = 18  # Decimal.MAX_LONG_DIGITS: larger ones are variable-length
_LONG = struct.Struct("<q")
_WORD = struct.Struct("<Q")  # a variable-length field's slot: offset << 32 | size


def _span(buf: bytes, base: int, raw: int) -> tuple[int, int]:
    start = base + (raw >> 32)
    end = start + (raw & 0xFFFFFFFF)
    if end > len(buf):
        raise UnsafeRowError(f"a field points at bytes {start}..{end} of a {len(buf)}-byte buffer")
    return start, end


def _string(buf: bytes, base: int, raw: int) -> str:
    start = base + (raw >> 32)
    end = start + (raw & 0xFFFFFFFF)
    if end > len(buf):  # checked inline: this is the hottest converter
        raise UnsafeRowError(f"a string points at bytes {start}..{end} of a {len(buf)}-byte row")
    try:
        return buf[start:end].decode()
    except UnicodeDecodeError:
        raise UnsafeRowError(f"a string field at byte {start} is not UTF-8") from None


def _binary(buf: bytes, base: int, raw: int) -> bytes:
    start, end = _span(buf, base, raw)
    return buf[start:end]


def _big_decimal(scale: int, internal: bool) -> _Read:
    def read(buf: bytes, base: int, raw: int) -> Any:
        start, end = _span(buf, base, raw)
        if start == end:
            raise UnsafeRowError(f"a decimal field at byte {start} has no bytes")
        unscaled = int.from_bytes(buf[start:end], "big", signed=True)
        return unscaled if internal else decimal_from_internal(unscaled, scale)

    return read


def _no_conversion(convert: Callable[[int], Any]) -> _Read:
    return lambda buf, base, raw: convert(raw)


def _null(buf: bytes, base: int, raw: Any) -> None:
    return None


def _reader(dtype: DataType, path: str, internal: bool) -> tuple[str, str, _Read | None]:
    """The row slot code, the array element code and the converter of one type (``internal``:
    values in sparkiq's internal form, see the module docstring)."""
    name = dtype.name
    if name in _SLOT:
        slot, element = _SLOT[name]
        if internal:  # the slot holds the internal value: days, microseconds
            return slot, element, None
        convert = {
            "date": date_from_internal,
            "timestamp": timestamp_from_internal,
            "timestamp_ntz": timestamp_ntz_from_internal,
        }.get(name)
        return slot, element, None if convert is None else _no_conversion(convert)
    if name == "decimal":
        if dtype.precision <= _MAX_COMPACT_DECIMAL:
            if internal:  # the slot holds the unscaled value
                return "q", "q", None
            scale = dtype.scale
            return "q", "q", _no_conversion(lambda unscaled: decimal_from_internal(unscaled, scale))
        return "Q", "Q", _big_decimal(dtype.scale, internal)
    if name == "string":
        return "Q", "Q", _string
    if name == "binary":
        return "Q", "Q", _binary
    if name == "void":
        return "8x", "", _null
    if name == "struct":
        nested = _Struct(dtype, path, internal)
        return "Q", "Q", nested.read_tuple if internal else nested.read_dict
    if name == "array":
        assert dtype.element is not None
        array = _Array(dtype.element, f"{path}[]", internal)
        return "Q", "Q", array.read_list
    if name == "map":
        assert dtype.key is not None and dtype.value is not None
        mapping = _Map(dtype.key, dtype.value, path, internal)
        return "Q", "Q", mapping.read_pairs if internal else mapping.read_dict
    raise UnsafeRowError(
        f"field {path!r} has type {dtype.simple_string()}, which sparkiq cannot decode from "
        f"Spark's state; supported: {', '.join(sorted(SUPPORTED_TYPES))}"
    )


def _null_indexes(words: tuple[int, ...], count: int) -> list[int]:
    found = []
    for w, word in enumerate(words):
        while word:
            low = word & -word
            index = w * 64 + low.bit_length() - 1
            if index >= count:
                raise UnsafeRowError(f"the null bitset marks field {index} of {count}")
            found.append(index)
            word ^= low
    return found


class _Struct:
    """A compiled row layout: one unpack of bitset and slots, then converters."""

    def __init__(self, dtype: DataType, path: str, internal: bool) -> None:
        self.names = tuple(f.name for f in dtype.fields)
        count = len(dtype.fields)
        self.count = count
        self.words = (count + 63) // 64
        codes, converters, variable = [], [], False
        for index, field in enumerate(dtype.fields):
            slot, _, read = _reader(
                field.type, f"{path}.{field.name}" if path else field.name, internal
            )
            if slot == "8x":  # void: a slot, always null, decoded as None
                slot = "q"
            codes.append(slot)
            variable |= slot == "Q"
            if read is not None:
                converters.append((index, read))
        self.layout = struct.Struct("<" + "Q" * self.words + "".join(codes))
        self.converters = tuple(converters)
        self.fixed = self.layout.size
        # without variable-length fields a row is exactly bitset + slots long
        self.exact = not variable

    def read(self, buf: bytes, base: int, size: int) -> list[Any]:
        if size < self.fixed or (self.exact and size != self.fixed) or base + size > len(buf):
            raise UnsafeRowError(
                f"a {size}-byte row cannot hold {self.count} fields of this schema "
                f"({self.fixed} bytes{' exactly' if self.exact else ' or more'})"
            )
        unpacked = self.layout.unpack_from(buf, base)
        words = self.words
        values = list(unpacked[words:])
        bits = unpacked[:words]
        if any(bits):
            for index in _null_indexes(bits, self.count):
                values[index] = None
        for index, read in self.converters:
            raw = values[index]
            if raw is not None:
                values[index] = read(buf, base, raw)
        return values

    def read_dict(self, buf: bytes, base: int, raw: int) -> dict[str, Any]:
        start, end = _span(buf, base, raw)
        return dict(zip(self.names, self.read(buf, start, end - start), strict=True))

    def read_tuple(self, buf: bytes, base: int, raw: int) -> tuple[Any, ...]:
        start, end = _span(buf, base, raw)
        return tuple(self.read(buf, start, end - start))


class _Array:
    def __init__(self, element: DataType, path: str, internal: bool) -> None:
        _, self.code, self.read_element = _reader(element, path, internal)
        self.width = struct.calcsize("<" + self.code) if self.code else 0

    def read_list(self, buf: bytes, base: int, raw: int) -> list[Any]:
        start, end = _span(buf, base, raw)
        return self.read(buf, start, end)

    def read(self, buf: bytes, start: int, end: int) -> list[Any]:
        if end - start < 8:
            raise UnsafeRowError(f"an array at byte {start} is shorter than its header")
        (count,) = _LONG.unpack_from(buf, start)
        words = (count + 63) // 64
        header = 8 + 8 * words
        if count < 0 or header + count * self.width > end - start:
            raise UnsafeRowError(f"an array at byte {start} cannot hold {count} elements")
        if not self.code:  # an array of void: every element is null
            return [None] * count
        values = list(struct.unpack_from(f"<{count}{self.code}", buf, start + header))
        bits = struct.unpack_from(f"<{words}Q", buf, start + 8)
        if any(bits):
            for index in _null_indexes(bits, count):
                values[index] = None
        read = self.read_element
        if read is not None:
            values = [None if v is None else read(buf, start, v) for v in values]
        return values


class _Map:
    def __init__(self, key: DataType, value: DataType, path: str, internal: bool) -> None:
        self.keys = _Array(key, f"{path}.key", internal)
        self.values = _Array(value, f"{path}.value", internal)

    def read_dict(self, buf: bytes, base: int, raw: int) -> dict[Any, Any]:
        keys, values = self._read(buf, base, raw)
        return {_hashable(k): v for k, v in zip(keys, values, strict=True)}

    def read_pairs(self, buf: bytes, base: int, raw: int) -> list[tuple[Any, Any]]:
        keys, values = self._read(buf, base, raw)
        return list(zip(keys, values, strict=True))

    def _read(self, buf: bytes, base: int, raw: int) -> tuple[list[Any], list[Any]]:
        start, end = _span(buf, base, raw)
        if end - start < 8:
            raise UnsafeRowError(f"a map at byte {start} is shorter than its header")
        (key_bytes,) = _LONG.unpack_from(buf, start)
        middle = start + 8 + key_bytes
        if key_bytes < 0 or middle > end:
            raise UnsafeRowError(f"a map at byte {start} has a key array past its end")
        keys = self.keys.read(buf, start + 8, middle)
        values = self.values.read(buf, middle, end)
        if len(keys) != len(values):
            raise UnsafeRowError(
                f"a map at byte {start} has {len(keys)} keys, {len(values)} values"
            )
        return keys, values


def _hashable(key: Any) -> Any:
    # PySpark gives a struct key as a Row (a tuple); sparkiq's dicts are unhashable
    if isinstance(key, dict):
        return tuple(_hashable(v) for v in key.values())
    if isinstance(key, list):
        return tuple(_hashable(v) for v in key)
    return key


class UnsafeRowDecoder:
    """Decodes UnsafeRow bytes of one struct type into a tuple of Python values.

    Built once per schema (the layout and converters are compiled here); :attr:`decode` is
    the per-row work. ``internal=True`` decodes into sparkiq's internal form instead of
    PySpark's (see the module docstring). Thread-safe: it holds no per-row state. Raises
    :class:`UnsafeRowError` at construction for a type it cannot decode and from
    :attr:`decode` for bytes that do not fit the schema.
    """

    #: The row's values in field order, from its bytes.
    decode: Callable[[bytes], tuple[Any, ...]]

    def __init__(self, schema: DataType, *, internal: bool = False) -> None:
        if schema.name != "struct":
            raise UnsafeRowError(
                f"a state row schema must be a struct, got {schema.simple_string()}"
            )
        self.schema = schema
        self.internal = internal
        self._struct = _Struct(schema, "", internal)
        self.decode = self._compile()

    @property
    def field_names(self) -> tuple[str, ...]:
        return self._struct.names

    def _general(self, data: bytes) -> tuple[Any, ...]:
        return tuple(self._struct.read(data, 0, len(data)))

    def _compile(self) -> Callable[[bytes], tuple[Any, ...]]:
        """The general decoder, or for rows of at most 64 fields (one bitset word) a faster
        one that takes the general path only for rows with a null field."""
        layout = self._struct
        general = self._general
        if layout.words != 1:
            return general
        unpack, fixed, converters = layout.layout.unpack_from, layout.fixed, layout.converters
        if not converters and layout.exact:

            def fixed_width(data: bytes) -> tuple[Any, ...]:
                if len(data) != fixed:
                    return general(data)  # raises, saying why
                values = unpack(data)
                return general(data) if values[0] else values[1:]

            return fixed_width
        exact = layout.exact
        if len(layout.names) == 1 and converters[0][1] is _string:
            return self._one_string(fixed)

        def with_converters(data: bytes) -> tuple[Any, ...]:
            size = len(data)
            if size < fixed or (exact and size != fixed):
                return general(data)  # raises, saying why
            unpacked = unpack(data)
            if unpacked[0]:
                return general(data)
            values = list(unpacked[1:])
            for index, read in converters:
                values[index] = read(data, 0, values[index])
            return tuple(values)

        return with_converters

    def _one_string(self, fixed: int) -> Callable[[bytes], tuple[Any, ...]]:
        """One string field (``groupBy`` of one string column, the most common state key):
        the slot and the text inline; anything unusual takes the general path."""
        unpack, general = self._struct.layout.unpack_from, self._general

        def one_string(data: bytes) -> tuple[Any, ...]:
            size = len(data)
            if size >= fixed:
                bits, raw = unpack(data)
                start = raw >> 32
                end = start + (raw & 0xFFFFFFFF)
                if not bits and end <= size:
                    try:
                        return (data[start:end].decode(),)
                    except UnicodeDecodeError:
                        pass
            return general(data)  # a null, or bytes that do not fit: raises, saying why

        return one_string


# -- rows taken apart and joined (the RocksDB provider's key framing) -------------------------

_FIXED = frozenset(
    {
        "void", "null", "boolean", "byte", "short", "integer", "long", "float", "double",
        "date", "timestamp", "timestamp_ntz",
    }
)  # fmt: skip


def field_is_variable(kind: DataType) -> bool:
    """Whether UnsafeRow keeps this type in the variable-length region (offset and size in
    its 8-byte slot) rather than in the slot itself."""
    if kind.name == "decimal":
        return kind.precision > _MAX_COMPACT_DECIMAL
    return kind.name not in _FIXED and not kind.name.startswith("interval ")


def _bitset_bytes(fields: int) -> int:
    return ((fields + 63) // 64) * 8


def check_row(row: bytes, variable: tuple[bool, ...]) -> None:
    """Raise :class:`UnsafeRowError` unless ``row`` can be an UnsafeRow whose fields are
    variable-length where ``variable`` says: a whole number of 8-byte words (Spark's
    ``UnsafeRow.pointTo`` asserts it), its null bitset and slots present, no null bit past its
    fields, exactly that long without variable-length fields, and each non-null
    variable-length field's bytes between the slots and the row's end."""
    count = len(variable)
    bitset = _bitset_bytes(count)
    head = bitset + 8 * count
    size = len(row)
    if size < head or size % 8 or (size != head and not any(variable)):
        raise UnsafeRowError(
            f"a {size}-byte row cannot be an UnsafeRow of {count} field(s) ({head} bytes of null "
            f"bitset and slots{'' if any(variable) else ' exactly'}, whole 8-byte words)"
        )
    nulls = int.from_bytes(row[:bitset], "little")
    if nulls >> count:
        raise UnsafeRowError(f"the null bitset marks field {nulls.bit_length() - 1} of {count}")
    for i, var in enumerate(variable):
        if var and not nulls >> i & 1:
            (word,) = _WORD.unpack_from(row, bitset + 8 * i)
            start, end = word >> 32, (word >> 32) + (word & 0xFFFFFFFF)
            if start < head or end > size:
                raise UnsafeRowError(
                    f"field {i} points at bytes {start}..{end} of a {size}-byte row whose "
                    f"variable-length part is bytes {head}..{size}"
                )


def join_rows(
    left: bytes, left_var: tuple[bool, ...], right: bytes, right_var: tuple[bool, ...]
) -> bytes:
    """One UnsafeRow with the fields of ``left`` then those of ``right`` (what Spark's
    ``JoinedRow`` + ``UnsafeProjection`` produce): null bits merged, fixed slots copied,
    variable-length data appended with its offsets moved. Raises :class:`UnsafeRowError`
    when either is not a row of its fields (:func:`check_row`): joined, a cut-short part
    would read as other values (a null, another field's bytes), never as an error."""
    check_row(left, left_var)
    check_row(right, right_var)
    nl, nr = len(left_var), len(right_var)
    n = nl + nr
    head = _bitset_bytes(n) + 8 * n
    left_head = _bitset_bytes(nl) + 8 * nl
    right_head = _bitset_bytes(nr) + 8 * nr
    left_tail, right_tail = left[left_head:], right[right_head:]
    left_nulls = int.from_bytes(left[: _bitset_bytes(nl)], "little")
    right_nulls = int.from_bytes(right[: _bitset_bytes(nr)], "little")
    out = bytearray((left_nulls | right_nulls << nl).to_bytes(_bitset_bytes(n), "little"))
    for row, var, nulls, base, shift in (
        (left, left_var, left_nulls, _bitset_bytes(nl), head - left_head),
        (right, right_var, right_nulls, _bitset_bytes(nr), head + len(left_tail) - right_head),
    ):
        for i, variable in enumerate(var):
            slot = row[base + 8 * i : base + 8 * i + 8]
            if variable and not nulls >> i & 1:
                (word,) = _WORD.unpack(slot)
                slot = _WORD.pack(((word >> 32) + shift) << 32 | (word & 0xFFFFFFFF))
            out += slot
    return bytes(out + left_tail + right_tail)


def nested_row(row: bytes, ordinal: int, fields: int) -> bytes:
    """The bytes of the struct in field ``ordinal`` of an UnsafeRow with ``fields`` fields
    (itself an UnsafeRow); raises :class:`UnsafeRowError` when that field is null or its
    bytes are not inside ``row``."""
    bitset = _bitset_bytes(fields)
    if len(row) < bitset + 8 * fields:
        raise UnsafeRowError(f"a {len(row)}-byte row cannot hold {fields} fields")
    if row[ordinal // 8] >> (ordinal % 8) & 1:
        raise UnsafeRowError(f"struct field {ordinal} is null")
    (word,) = _WORD.unpack_from(row, bitset + 8 * ordinal)
    start, end = word >> 32, (word >> 32) + (word & 0xFFFFFFFF)
    if start < bitset + 8 * fields or end > len(row):
        raise UnsafeRowError(f"struct field {ordinal} points at bytes {start}..{end} of {len(row)}")
    return row[start:end]
