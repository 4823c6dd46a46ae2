"""Spark's Avro encoding of state rows, turned into the UnsafeRow bytes the row decoder reads.

A query that sets ``spark.sql.streaming.stateStore.encodingFormat=avro`` has the RocksDB
provider store transformWithState's keys and values as Avro binary (Spark's
``AvroStateEncoder``) instead of UnsafeRows. The framing around the Avro bytes is
``sparkiq.checkpoint.framing``'s; this module reads one row:

Schema (``SchemaConverters.toAvroTypeWithDefaults``; only the binary layout matters, so
names and logical types are left out here):

- the row: a record, one field per column, in order; every field is the union
  ``[null, T]`` (branch 0 = null) except a ``void`` column, which is ``null``;
- ``boolean``, ``byte``/``short``/``integer`` (int), ``long``, ``float``, ``double``,
  ``string``, ``binary`` (bytes); ``date`` an int of days; ``timestamp``/``timestamp_ntz`` a
  long of microseconds; ``decimal(p, s)`` a ``fixed`` of the fewest bytes that hold ``p``
  digits, the unscaled value big-endian two's complement;
- a nested struct is ``[null, record]``; an array ``[null, array<E>]`` and a map (string keys
  only) ``[null, map<V>]``, whose elements / values E, V follow the same rules except that a
  primitive element is not wrapped in a union.

:class:`AvroRowCodec` reads the Avro bytes with fastavro's schemaless reader and writes the
same values as an UnsafeRow (the layout :mod:`sparkiq.checkpoint.unsaferow` documents), so
everything downstream -- the row decoder, the direct conversion, list and map state --
reads Avro-encoded state exactly as it reads Spark's default encoding. The UnsafeRow written
is deterministic (equal values give equal bytes), which is what keying a replica by it needs.
Bytes that are not one whole Avro row of the schema raise :class:`AvroStateError`.
"""

from __future__ import annotations

import io
import itertools
import struct
from collections.abc import Callable
from typing import Any

from fastavro import parse_schema, schemaless_reader

from sparkiq.errors import ChangelogError
from sparkiq.schema.types import DataType

__all__ = ["AvroRowCodec", "AvroStateError", "avro_schema"]


class AvroStateError(ChangelogError, ValueError):
    """Bytes that are not an Avro row of the expected schema, or a type Spark's Avro state
    encoding does not have."""


# a fixed-width type: (slot code in a row, element code in an array)
_FIXED = {
    "boolean": ("<?7x", "<?"),
    "byte": ("<b7x", "<b"),
    "short": ("<h6x", "<h"),
    "integer": ("<i4x", "<i"),
    "date": ("<i4x", "<i"),
    "float": ("<f4x", "<f"),
    "long": ("<q", "<q"),
    "timestamp": ("<q", "<q"),
    "timestamp_ntz": ("<q", "<q"),
    "double": ("<d", "<d"),
}
_PRIMITIVE = {
    "boolean": "boolean",
    "byte": "int",
    "short": "int",
    "integer": "int",
    "date": "int",
    "long": "long",
    "timestamp": "long",
    "timestamp_ntz": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "bytes",
    "void": "null",
}
_MAX_COMPACT_DECIMAL = 18  # UnsafeRow keeps decimals up to 18 digits in the slot
_LONG = struct.Struct("<q")
_ULONG = struct.Struct("<Q")


def _decimal_bytes(precision: int) -> int:
    """Spark's ``minBytesForPrecision``: the fewest bytes whose two's complement holds
    ``10 ** precision - 1``."""
    size = 1
    while 2 ** (8 * size - 1) < 10**precision:
        size += 1
    return size


def avro_schema(schema: DataType) -> dict[str, Any]:
    """The Avro schema (as fastavro takes it) of rows of the struct ``schema``, with the
    binary layout of Spark's ``toAvroTypeWithDefaults``; fields are named ``f0``, ``f1``...
    Raises :class:`AvroStateError` for a type Spark does not encode in Avro state."""
    if schema.name != "struct":
        raise AvroStateError(f"a state row schema must be a struct, got {schema.simple_string()}")
    names = itertools.count()

    def inner(dtype: DataType, nesting: int, path: str) -> Any:
        kind = dtype.name
        if kind == "struct":
            record = {
                "type": "record",
                "name": f"r{next(names)}",
                "fields": [
                    {"name": f"f{i}", "type": field(f.type, nesting, f"{path}.{f.name}")}
                    for i, f in enumerate(dtype.fields)
                ],
            }
            return record if nesting == 0 else ["null", record]
        if kind in _PRIMITIVE:
            return _PRIMITIVE[kind]
        if kind == "decimal":
            size = _decimal_bytes(dtype.precision)
            return {"type": "fixed", "name": f"d{next(names)}", "size": size}
        if kind == "array" and dtype.element is not None:
            items = inner(dtype.element, nesting + 1, f"{path}[]")
            return ["null", {"type": "array", "items": items}]
        if kind == "map" and dtype.key is not None and dtype.value is not None:
            if dtype.key.name != "string":
                raise AvroStateError(
                    f"column {path.lstrip('.')!r} is a {dtype.simple_string()}: Spark's Avro "
                    "state encoding has maps with string keys only"
                )
            values = inner(dtype.value, nesting + 1, f"{path}.value")
            return ["null", {"type": "map", "values": values}]
        raise AvroStateError(
            f"column {path.lstrip('.')!r} has type {dtype.simple_string()}, which Spark's Avro "
            "state encoding does not have"
        )

    def field(dtype: DataType, nesting: int, path: str) -> Any:
        avro = inner(dtype, nesting + 1, path)
        if dtype.name == "void" or isinstance(avro, list):
            return avro
        return ["null", avro]

    result: dict[str, Any] = inner(schema, 0, "")
    return result


# -- UnsafeRow writing -----------------------------------------------------------------

# a value (never None) -> its bytes in the variable-length region, unpadded
_Var = Callable[[Any], bytes]


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 8)


def _java_big_endian(unscaled: int) -> bytes:
    """``BigInteger.toByteArray``: the shortest big-endian two's complement."""
    bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
    return unscaled.to_bytes(bits // 8 + 1, "big", signed=True)


def _unscaled(raw: bytes) -> int:
    return int.from_bytes(raw, "big", signed=True)


class _Layout:
    """How one type is written: into an 8-byte row slot / an array element directly
    (``slot``/``element`` struct codes, ``convert`` applied first), or as variable-length
    bytes (``var``) referenced by offset and size."""

    def __init__(self, dtype: DataType, path: str) -> None:
        kind = dtype.name
        self.slot: str | None = None
        self.element: str | None = None
        self.convert: Callable[[Any], Any] | None = None
        self.var: _Var | None = None
        self.void = kind == "void"
        if kind in _FIXED:
            self.slot, self.element = _FIXED[kind]
        elif kind == "decimal" and dtype.precision <= _MAX_COMPACT_DECIMAL:
            self.slot, self.element, self.convert = "<q", "<q", _unscaled
        elif kind == "decimal":
            self.var = lambda raw: _java_big_endian(_unscaled(raw))
        elif kind == "string":
            self.var = str.encode
        elif kind == "binary":
            self.var = bytes
        elif kind == "struct":
            self.var = _RowWriter(dtype, path).write
        elif kind == "array" and dtype.element is not None:
            self.var = _ArrayWriter(dtype.element, f"{path}[]").write
        elif kind == "map" and dtype.key is not None and dtype.value is not None:
            keys = _ArrayWriter(dtype.key, f"{path}.key")
            values = _ArrayWriter(dtype.value, f"{path}.value")

            def write_map(mapping: dict[Any, Any]) -> bytes:
                key_array = keys.write(list(mapping))
                return _LONG.pack(len(key_array)) + key_array + values.write(list(mapping.values()))

            self.var = write_map
        elif not self.void:
            raise AvroStateError(f"column {path!r}: type {dtype.simple_string()} is not decoded")

    @property
    def width(self) -> int:
        """Bytes per array element."""
        if self.void:
            return 0
        return 8 if self.element is None else struct.calcsize(self.element)


class _RowWriter:
    """Writes one struct's values (a record from fastavro: ``f0``, ``f1``...) as an
    UnsafeRow: null bitset, one 8-byte slot per field, variable-length data 8-byte aligned."""

    def __init__(self, dtype: DataType, path: str) -> None:
        self.layouts = [
            _Layout(f.type, f"{path}.{f.name}" if path else f.name) for f in dtype.fields
        ]
        self.names = [f"f{i}" for i in range(len(dtype.fields))]
        self.head = ((len(self.layouts) + 63) // 64) * 8 + 8 * len(self.layouts)

    def write(self, record: dict[str, Any]) -> bytes:
        out = bytearray(self.head)
        bits = 0
        base = self.head - 8 * len(self.layouts)
        for index, (name, layout) in enumerate(zip(self.names, self.layouts, strict=True)):
            value = record[name]
            if value is None:
                bits |= 1 << index
                continue
            at = base + 8 * index
            if layout.var is not None:
                data = layout.var(value)
                _ULONG.pack_into(out, at, len(out) << 32 | len(data))
                out += _pad(data)
            else:
                assert layout.slot is not None
                struct.pack_into(
                    layout.slot, out, at, value if layout.convert is None else layout.convert(value)
                )
        if bits:
            out[:base] = bits.to_bytes(base, "little")
        return bytes(out)


class _ArrayWriter:
    """Writes a list as ``UnsafeArrayData``: element count, null bitset, the elements at
    their natural width (8-byte offset-and-size for variable-length ones) padded to 8 bytes,
    then the variable-length data."""

    def __init__(self, element: DataType, path: str) -> None:
        self.layout = _Layout(element, path)
        self.width = self.layout.width

    def write(self, values: list[Any]) -> bytes:
        count = len(values)
        words = (count + 63) // 64
        header = 8 + 8 * words
        layout = self.layout
        out = bytearray(header + count * self.width + (-(count * self.width) % 8))
        _LONG.pack_into(out, 0, count)
        bits = 0
        for index, value in enumerate(values):
            if value is None or layout.void:
                bits |= 1 << index
                continue
            at = header + index * self.width
            if layout.var is not None:
                data = layout.var(value)
                _ULONG.pack_into(out, at, len(out) << 32 | len(data))
                out += _pad(data)
            else:
                assert layout.element is not None
                struct.pack_into(
                    layout.element,
                    out,
                    at,
                    value if layout.convert is None else layout.convert(value),
                )
        if bits:
            out[8:header] = bits.to_bytes(8 * words, "little")
        return bytes(out)


class AvroRowCodec:
    """Avro binary rows of one struct schema, read as UnsafeRow bytes.

    Built once per schema; :meth:`unsafe_row` is the per-row work. Thread-safe: it holds no
    per-row state. Raises :class:`AvroStateError` at construction for a type Spark's Avro
    encoding does not have, and from :meth:`unsafe_row` for bytes that are not exactly one
    row of the schema.
    """

    def __init__(self, schema: DataType) -> None:
        self.schema = schema
        self._avro = parse_schema(avro_schema(schema))
        self._writer = _RowWriter(schema, "")

    def unsafe_row(self, data: bytes) -> bytes:
        """The UnsafeRow of the Avro-encoded row ``data``."""
        stream = io.BytesIO(data)
        try:
            record = schemaless_reader(stream, self._avro, None)
        except (EOFError, ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
            raise AvroStateError(
                f"{len(data)} bytes are not an Avro row of {self.schema.simple_string()}: {exc}"
            ) from None
        if stream.tell() != len(data):
            raise AvroStateError(
                f"an Avro row of {self.schema.simple_string()} ends after {stream.tell()} of "
                f"{len(data)} bytes"
            )
        if not isinstance(record, dict):
            raise AvroStateError(f"an Avro row of {self.schema.simple_string()} is not a record")
        return self._writer.write(record)
