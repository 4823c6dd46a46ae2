"""Rows of a table as Arrow, for DuckDB: from stored MessagePack rows or from decoded rows.

Values in Arrow follow SQL's view of the table, which is also PySpark's:

- ``timestamp`` columns hold the *local wall clock* (what PySpark's naive datetimes show) as
  an Arrow timestamp without time zone, so ``ts >= '2024-01-01 10:00'`` compares in local
  time as it would in a Spark session with the process's time zone, and results come back
  as the naive datetimes PySpark returns. ``timestamp_ntz`` holds its wall clock as is.
- ``date`` is date32, ``decimal(p,s)`` decimal128(p,s), ``float`` float32, structs, arrays
  and maps their Arrow counterparts.
- Windowed tables get two pseudo-columns when asked: ``WINDOWSTART`` and ``WINDOWEND``
  (the window column's start and end).
- ``__sq_key`` (asked by paging) is the row's encoded store key, a binary column whose
  bytewise order is the key order.

:class:`ArrowRows` decodes a whole partition with one MessagePack call (the rows are framed
as one array), transposes in C and builds each column with its Arrow type: no per-value
Python work except for nested types and, outside UTC-like zones, local timestamps.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.schema.codec import (
    date_from_internal,
    timestamp_from_internal,
    timestamp_ntz_from_internal,
)
from sparkiq.schema.types import DataType, TableSchema

__all__ = ["KEY_COLUMN", "PSEUDO_COLUMNS", "ArrowRows", "arrow_type", "rows_to_arrow"]

WINDOWSTART, WINDOWEND = "WINDOWSTART", "WINDOWEND"
PSEUDO_COLUMNS = (WINDOWSTART, WINDOWEND)
KEY_COLUMN = "__sq_key"

_ARRAY32 = struct.Struct(">BI")
_HOUR_US = 3_600_000_000

_SIMPLE: dict[str, pa.DataType] = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}


def arrow_type(dtype: DataType) -> pa.DataType:
    """The Arrow type of a Spark type (see the module docstring)."""
    simple = _SIMPLE.get(dtype.name)
    if simple is not None:
        return simple
    if dtype.name == "decimal":
        return pa.decimal128(dtype.precision, dtype.scale)
    if dtype.name == "struct":
        return pa.struct([pa.field(f.name, arrow_type(f.type)) for f in dtype.fields])
    if dtype.name == "array":
        assert dtype.element is not None
        return pa.list_(arrow_type(dtype.element))
    if dtype.name == "map":
        assert dtype.key is not None and dtype.value is not None
        return pa.map_(arrow_type(dtype.key), arrow_type(dtype.value))
    raise TypeError(f"no Arrow type for {dtype.simple_string()}")


def _utc_like() -> bool:
    """Whether local time equals UTC at every instant (no offset, no DST)."""
    return time.timezone == 0 and time.altzone == 0


def _local_wall_clock(micros: list[Any]) -> pa.Array:
    """Epoch microseconds -> local wall-clock microseconds (PySpark's naive datetimes)."""
    if _utc_like():
        return pa.array(micros, pa.int64()).cast(pa.timestamp("us"))
    offsets: dict[int, int] = {}
    shifted: list[int | None] = []
    for value in micros:
        if value is None:
            shifted.append(None)
            continue
        hour = value // _HOUR_US
        offset = offsets.get(hour)
        if offset is None:
            offset = offsets[hour] = time.localtime(value // 1_000_000).tm_gmtoff * 1_000_000
        shifted.append(value + offset)
    return pa.array(shifted, pa.int64()).cast(pa.timestamp("us"))


def _nested(dtype: DataType) -> Callable[[Any], Any] | None:
    """Stored value -> a Python value pyarrow accepts for ``arrow_type(dtype)``."""
    kind = dtype.name
    if kind == "timestamp":
        return timestamp_from_internal
    if kind == "timestamp_ntz":
        return timestamp_ntz_from_internal
    if kind == "date":
        return date_from_internal
    if kind == "decimal":
        return Decimal
    if kind == "struct":
        names = [f.name for f in dtype.fields]
        inner = [_nested(f.type) for f in dtype.fields]
        return lambda values: {
            n: (v if c is None or v is None else c(v))
            for n, c, v in zip(names, inner, values, strict=True)
        }
    if kind == "array":
        assert dtype.element is not None
        element = _nested(dtype.element)
        if element is None:
            return None
        return lambda values: [None if v is None else element(v) for v in values]
    if kind == "map":
        assert dtype.key is not None and dtype.value is not None
        key, value = _nested(dtype.key), _nested(dtype.value)
        return lambda pairs: [
            (
                k if key is None else key(k),
                v if value is None or v is None else value(v),
            )
            for k, v in pairs
        ]
    return None


def _column(values: Sequence[Any], dtype: DataType) -> pa.Array:
    """One Arrow column from the stored values of one column."""
    kind = dtype.name
    if kind == "timestamp":
        return _local_wall_clock(list(values))
    if kind == "timestamp_ntz":
        return pa.array(values, pa.int64()).cast(pa.timestamp("us"))
    if kind == "date":
        return pa.array(values, pa.int32()).cast(pa.date32())
    if kind == "decimal":
        return pa.array(values, pa.string()).cast(arrow_type(dtype))
    convert = _nested(dtype)
    if convert is not None and kind in ("struct", "array", "map"):
        values = [None if v is None else convert(v) for v in values]
    return pa.array(values, arrow_type(dtype))


class ArrowRows:
    """Builds Arrow tables of chosen columns of one table from stored rows.

    ``columns`` names table columns, pseudo-columns and :data:`KEY_COLUMN`, in output
    order. Immutable and thread-safe; build one per (schema, columns) and reuse it.
    """

    __slots__ = ("_indexes", "_schema", "_window", "columns", "out_schema", "schema")

    def __init__(self, schema: TableSchema, columns: Sequence[str]) -> None:
        self.schema = schema
        self.columns = tuple(columns)
        names = schema.column_names
        self._indexes = {n: i for i, n in enumerate(names)}
        self._window = schema.window_column
        fields = []
        for name in self.columns:
            if name == KEY_COLUMN:
                fields.append(pa.field(name, pa.binary()))
            elif name in PSEUDO_COLUMNS:
                start = schema.window_start_type
                if start is None:
                    raise ValueError(f"{name} exists only on windowed tables")
                fields.append(pa.field(name, pa.timestamp("us")))
            else:
                fields.append(pa.field(name, arrow_type(schema.field(name).type)))
        self.out_schema = pa.schema(fields)
        self._schema = schema

    def from_stored(self, rows: list[bytes], keys: list[bytes] | None = None) -> pa.Table:
        """A table from encoded rows (and their encoded store keys, for :data:`KEY_COLUMN`)."""
        if not rows:
            return self.out_schema.empty_table()
        framed = _ARRAY32.pack(0xDD, len(rows)) + b"".join(rows)
        decoded: list[list[Any]] = msgspec.msgpack.decode(framed)
        transposed = list(zip(*decoded, strict=False))
        built: dict[str, pa.Array] = {}

        def column(name: str) -> pa.Array:
            found = built.get(name)
            if found is None:
                index = self._indexes[name]
                found = built[name] = _column(transposed[index], self._schema.fields[index].type)
            return found

        arrays = []
        for name in self.columns:
            if name == KEY_COLUMN:
                arrays.append(pa.array(keys, pa.binary()))
            elif name in PSEUDO_COLUMNS:
                assert self._window is not None
                member = "start" if name == WINDOWSTART else "end"
                arrays.append(pc.struct_field(column(self._window), member))
            else:
                arrays.append(column(name))
        return pa.Table.from_arrays(arrays, schema=self.out_schema)

    def from_rows(self, rows: Sequence[dict[str, Any]]) -> pa.Table:
        """A table from rows as PySpark returns them (what key queries answer)."""
        return rows_to_arrow(self._schema, self.columns, rows, self.out_schema)


def rows_to_arrow(
    schema: TableSchema,
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    out_schema: pa.Schema,
) -> pa.Table:
    """Arrow table of ``columns`` from decoded rows (naive datetimes are local wall clock)."""
    arrays = []
    window = schema.window_column
    for name, field in zip(columns, out_schema, strict=True):
        if name in PSEUDO_COLUMNS:
            assert window is not None
            member = "start" if name == WINDOWSTART else "end"
            values = [None if r[window] is None else r[window][member] for r in rows]
        else:
            values = [r[name] for r in rows]
            if pa.types.is_map(field.type):
                values = [None if v is None else list(v.items()) for v in values]
            elif pa.types.is_binary(field.type):
                values = [None if v is None else bytes(v) for v in values]
        arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=out_schema)
