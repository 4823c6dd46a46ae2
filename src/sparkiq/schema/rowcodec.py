"""Row codec: whole rows from Arrow to msgpack bytes, and back to what PySpark returns.

Row encoding, format version 1 (:data:`ROW_FORMAT_VERSION`)
-----------------------------------------------------------
One MessagePack array per row with every column in schema order; ``nil`` for null. Values
use only plain MessagePack types, so any application can read a changelog with the table's
schema (recorded in its manifest) and no code runs while decoding (no pickle):

=========================  ==============================================================
Spark type                 stored as
=========================  ==============================================================
string                     str
binary                     bin
byte/short/integer/long    int
boolean                    bool
float / double             float 64 (a float column's float32 value, widened exactly)
date                       int, days since 1970-01-01
timestamp, timestamp_ntz   int, microseconds since the epoch (UTC, resp. wall clock)
decimal(p, s)              str, e.g. ``"12.50"``
struct                     array of the field values in field order
array                      array
map                        array of ``[key, value]`` pairs (keys may be unhashable types)
void                       nil
=========================  ==============================================================

Decoding gives the row exactly as ``Row.asDict(recursive=True)`` after ``collect()``:
timestamps as naive *local* datetimes (PySpark's formula, using the process's ``TZ`` at
decode time), timestamp_ntz as naive wall-clock datetimes, structs and maps as dicts,
decimals as Decimal, binary as bytes (Spark >= 4.1 with the default
``spark.sql.execution.pyspark.binaryAsBytes=true``) or bytearray (``binary_as_bytes=False``,
for Spark 4.0 or that setting off).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import msgspec
import pyarrow as pa

from sparkiq.errors import SchemaError
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType, TableSchema

__all__ = ["ROW_FORMAT_VERSION", "RowCodec"]

#: Version of the row layout above; recorded by the changelog, bumped on any change.
ROW_FORMAT_VERSION = 1

_Convert = Callable[[Any], Any]


def _check_supported(path: str, dtype: DataType) -> None:
    if dtype.name not in KINDS:
        raise SchemaError(
            f"column {path!r} has type {dtype.simple_string()}, which sparkiq cannot store; "
            "cast it to a supported type (e.g. string) before materializing"
        )
    for f in dtype.fields:
        _check_supported(f"{path}.{f.name}", f.type)
    for child in (dtype.element, dtype.key, dtype.value):
        if child is not None:
            _check_supported(path, child)


# --- Arrow -> stored values ----------------------------------------------------------------


def _stored(array: Any, dtype: DataType) -> list[Any]:
    """Stored values (see the table above) of one Arrow array, one per row."""
    kind = dtype.name
    if kind == "struct":
        children = [_stored(array.field(i), f.type) for i, f in enumerate(dtype.fields)]
        rows: list[Any] = list(zip(*children, strict=True)) if children else [()] * len(array)
        return _with_nulls(array, rows)
    if kind in ("array", "map"):
        offsets = array.offsets.to_pylist()
        first, last = offsets[0], offsets[-1]
        entries = array.values.slice(first, last - first)  # .values ignores the array's slice
        if kind == "array":
            assert dtype.element is not None
            items = _stored(entries, dtype.element)
        else:
            assert dtype.key is not None and dtype.value is not None
            items = list(
                zip(
                    _stored(entries.field(0), dtype.key),
                    _stored(entries.field(1), dtype.value),
                    strict=True,
                )
            )
        lists = [items[a - first : b - first] for a, b in itertools.pairwise(offsets)]
        return _with_nulls(array, lists)
    return KINDS[kind].stored_values(array, dtype)


def _with_nulls(array: Any, values: list[Any]) -> list[Any]:
    if not array.null_count:
        return values
    return [v if ok else None for v, ok in zip(values, array.is_valid().to_pylist(), strict=True)]


# --- stored values -> Python values as PySpark returns them --------------------------------


def _converter(dtype: DataType, binary_as_bytes: bool) -> _Convert | None:
    """A function from a non-null stored value to PySpark's value; None if they are equal."""
    kind = dtype.name
    if kind == "struct":
        names = tuple(f.name for f in dtype.fields)
        fields = _indexed_converters(dtype, binary_as_bytes)

        def struct_to_dict(values: list[Any]) -> dict[str, Any]:
            for i, convert in fields:
                if values[i] is not None:
                    values[i] = convert(values[i])
            return dict(zip(names, values, strict=True))

        return struct_to_dict
    if kind == "array":
        assert dtype.element is not None
        element = _converter(dtype.element, binary_as_bytes)
        if element is None:
            return None
        return lambda values: [None if v is None else element(v) for v in values]
    if kind == "map":
        assert dtype.key is not None and dtype.value is not None
        key = _map_key_converter(dtype.key)
        value = _converter(dtype.value, binary_as_bytes)
        return lambda pairs: {
            k if key is None else key(k): v if value is None or v is None else value(v)
            for k, v in pairs
        }
    return KINDS[kind].stored_converter(dtype, binary_as_bytes)


def _map_key_converter(dtype: DataType) -> _Convert | None:
    """Map keys must be hashable: PySpark gives a struct key as a Row, which is a tuple and
    compares equal to one; arrays become tuples and binary stays bytes."""
    if dtype.name == "binary":
        return None
    if dtype.name == "struct":
        fields = [_map_key_converter(f.type) for f in dtype.fields]
        return lambda values: tuple(
            v if c is None or v is None else c(v) for c, v in zip(fields, values, strict=True)
        )
    if dtype.name == "array":
        assert dtype.element is not None
        element = _map_key_converter(dtype.element)
        return lambda values: tuple(
            v if element is None or v is None else element(v) for v in values
        )
    return _converter(dtype, binary_as_bytes=True)


def _indexed_converters(dtype: DataType, binary_as_bytes: bool) -> tuple[tuple[int, _Convert], ...]:
    pairs = ((i, _converter(f.type, binary_as_bytes)) for i, f in enumerate(dtype.fields))
    return tuple((i, c) for i, c in pairs if c is not None)


def _row_decoder(
    names: tuple[str, ...],
    converters: tuple[tuple[int, _Convert], ...],
    decode: Callable[[bytes], list[Any]],
) -> Callable[[bytes], dict[str, Any]]:
    """``data -> {names[0]: value 0, ...}``: msgpack-decode a row, convert the columns that
    have a converter, and build the row's dict -- compiled once per schema.

    The function is generated with the conversions unrolled and the dict as a display over
    constant keys, which decodes a row about twice as fast as a loop over the converters and
    ``dict(zip(names, values))`` (no zip iterator, no tuple per item): the row's dict is most
    of what a key lookup costs beyond RocksDB's own read. Only ``repr`` literals of the
    column names and indexes enter the source, so any name is safe. A row of another width
    (never written by this schema's writer) takes the loop and zip, as before.
    """
    lines = [
        "def decode_row(data):",
        "    values = decode(data)",
        f"    if len(values) != {len(names)}:",
        "        return other_width(values)",
    ]
    for i, _ in converters:
        lines += [f"    if values[{i}] is not None:", f"        values[{i}] = c{i}(values[{i}])"]
    items = ", ".join(f"{name!r}: values[{i}]" for i, name in enumerate(names))
    lines.append(f"    return {{{items}}}")

    def other_width(values: list[Any]) -> dict[str, Any]:
        for i, convert in converters:
            if values[i] is not None:
                values[i] = convert(values[i])
        return dict(zip(names, values, strict=False))

    scope: dict[str, Any] = {"decode": decode, "other_width": other_width}
    scope.update({f"c{i}": convert for i, convert in converters})
    exec("\n".join(lines), scope)  # the source holds repr() literals and indexes only
    built: Callable[[bytes], dict[str, Any]] = scope["decode_row"]
    return built


class RowCodec:
    """Encodes whole rows of one table from Arrow, and decodes them as PySpark would.

    ``binary_as_bytes`` mirrors Spark's ``spark.sql.execution.pyspark.binaryAsBytes`` (true
    by default since Spark 4.1): binary values decode as bytes, else as bytearray. Map keys
    are always bytes, which are hashable. Thread-safe and immutable after construction; build
    one per table and reuse it.
    """

    __slots__ = ("_converters", "_decoder", "_encoder", "_names", "decode_row", "schema")

    def __init__(self, schema: TableSchema, *, binary_as_bytes: bool = True) -> None:
        for f in schema.fields:
            _check_supported(f.name, f.type)
        self.schema = schema
        self._names = schema.column_names
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder()
        # only the columns whose stored form differs from PySpark's get a converter
        self._converters = _indexed_converters(
            DataType("struct", fields=schema.fields), binary_as_bytes
        )
        #: :meth:`decode` as one compiled function (for hot paths holding it).
        self.decode_row = _row_decoder(tuple(self._names), self._converters, self._decoder.decode)

    def encode_arrow(self, batch: Any) -> list[bytes]:
        """One encoded row per row of an Arrow RecordBatch or Table (columns looked up by
        name, so their order in the batch does not matter)."""
        if isinstance(batch, pa.Table):
            return [row for part in batch.to_batches() for row in self.encode_arrow(part)]
        columns = [_stored(batch.column(f.name), f.type) for f in self.schema.fields]
        encode = self._encoder.encode
        return [encode(row) for row in zip(*columns, strict=True)]

    def decode(self, data: bytes) -> dict[str, Any]:
        """The row as ``Row.asDict(recursive=True)`` gives it after ``collect()``."""
        return self.decode_row(data)

    def decode_values(self, data: bytes) -> list[Any]:
        """The row's values in schema order, converted as in :meth:`decode`."""
        values: list[Any] = self._decoder.decode(data)
        for i, convert in self._converters:
            if values[i] is not None:
                values[i] = convert(values[i])
        return values
