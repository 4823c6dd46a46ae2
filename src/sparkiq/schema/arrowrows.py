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
Python work except for nested types and, outside UTC-like zones, local timestamps. Tables of
scalar columns skip even that one call: their columns are read from the encoded rows in bulk
(``_flat_columns``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.schema.arrowtypes import arrow_type as shared_arrow_type
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType, TableSchema

__all__ = ["KEY_COLUMN", "PSEUDO_COLUMNS", "ArrowRows", "arrow_type", "rows_to_arrow"]

WINDOWSTART, WINDOWEND = "WINDOWSTART", "WINDOWEND"
PSEUDO_COLUMNS = (WINDOWSTART, WINDOWEND)
KEY_COLUMN = "__sq_key"

_ARRAY32 = struct.Struct(">BI")
_HOUR_US = 3_600_000_000


def arrow_type(dtype: DataType) -> pa.DataType:
    """The Arrow type of a Spark type (timestamps naive, in local wall-clock time)."""
    return shared_arrow_type(dtype, timestamp_tz=None)


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
    return KINDS[kind].stored_converter(dtype, binary_as_bytes=True)


def _column(values: Sequence[Any], dtype: DataType) -> pa.Array:
    """One Arrow column from the stored values of one column."""
    kind = KINDS[dtype.name]
    if kind.zoned:
        return _local_wall_clock(list(values))
    if not kind.nested:
        return kind.stored_to_arrow(values, dtype, None)
    convert = _nested(dtype)
    if convert is not None:
        values = [None if v is None else convert(v) for v in values]
    return pa.array(values, arrow_type(dtype))


# --- whole columns straight from the MessagePack bytes -------------------------------------
#
# For tables whose columns are all scalars, ``_flat_columns`` reads every row's values where
# they lie in the concatenated rows, one column at a time for all rows at once (numpy), and
# builds each Arrow array from buffers: no Python object per value. It accepts only what the
# row codec writes (module docstring of ``sparkiq.schema.rowcodec``) and returns None on
# anything else - another MessagePack form, a row of another width, invalid UTF-8 - so that
# the general path decodes those rows (and raises its errors) exactly as before.

_NIL = 0xC0
# (type byte, value width, signed) of MessagePack's sized integers
_SIZED_INTS = (
    (0xCC, 1, False),
    (0xCD, 2, False),
    (0xCE, 4, False),
    (0xCF, 8, False),
    (0xD0, 1, True),
    (0xD1, 2, True),
    (0xD2, 4, True),
    (0xD3, 8, True),
)
# (type byte, header size, length width) of str 8/16/32 and bin 8/16/32
_SIZED_STR = ((0xD9, 2, 1), (0xDA, 3, 2), (0xDB, 5, 4))
_SIZED_BIN = ((0xC4, 2, 1), (0xC5, 3, 2), (0xC6, 5, 4))

_Parsed = tuple[Any, "pa.Array | None"]


def _validity(nil: Any) -> tuple[pa.Buffer | None, int]:
    count = int(nil.sum())
    if not count:
        return None, 0
    return pa.py_buffer(np.packbits(~nil, bitorder="little")), count


def _at(buf: Any, offsets: Any, dtype: str) -> Any:
    """The big-endian ``dtype`` values starting at each of ``offsets`` (unaligned) in ``buf``,
    which has at least 8 bytes of padding after its last row."""
    width = np.dtype(dtype).itemsize
    view = np.ndarray((len(buf) - width + 1,), dtype, buffer=buf, strides=(1,))
    return view[offsets]


def _uint_at(buf: Any, offsets: Any, width: int) -> Any:
    """Big-endian unsigned ints of ``width`` bytes at ``offsets``, as uint64."""
    return _at(buf, offsets, ">u8").astype(np.uint64) >> np.uint64(64 - 8 * width)


def _flat_ints(buf: Any, pos: Any, t: Any, nil: Any) -> tuple[Any, Any] | None:
    """(sizes, int64 values) of one column of MessagePack ints or nils; None otherwise."""
    sizes = np.ones(len(t), np.int64)
    values = np.zeros(len(t), np.int64)
    known = nil | (t < 0x80)
    fix = t < 0x80
    values[fix] = t[fix]
    neg = t >= 0xE0
    values[neg] = t[neg].astype(np.int64) - 256
    known |= neg
    for code, width, signed in _SIZED_INTS:
        m = t == code
        if not m.any():
            continue
        raw = _uint_at(buf, pos[m] + 1, width)
        if signed:
            wide = raw.astype(np.int64)
            if width < 8:
                wide = np.where(wide >= 1 << (8 * width - 1), wide - (1 << (8 * width)), wide)
        else:
            if width == 8 and bool((raw >> np.uint64(63)).any()):
                return None  # beyond a long: the general path reports it
            wide = raw.astype(np.int64)
        values[m] = wide
        sizes[m] = 1 + width
        known |= m
    if not known.all():
        return None
    return sizes, values


def _flat_bytes(buf: Any, pos: Any, t: Any, nil: Any, text: bool, build: bool) -> _Parsed | None:
    """(sizes, string or binary array) of one column of MessagePack str (or bin) or nils."""
    lengths = np.zeros(len(t), np.int64)
    headers = np.ones(len(t), np.int64)
    known = nil.copy()
    if text:
        fix = (t & 0xE0) == 0xA0
        lengths[fix] = t[fix] & 0x1F
        known |= fix
    for code, header, width in _SIZED_STR if text else _SIZED_BIN:
        m = t == code
        if m.any():
            lengths[m] = _uint_at(buf, pos[m] + 1, width).astype(np.int64)
            headers[m] = header
            known |= m
    if not known.all():
        return None
    sizes = headers + lengths
    if not build:
        return sizes, None
    offsets = np.zeros(len(t) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 1 << 31:
        return None
    index = np.repeat(pos + headers - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
    validity, nulls = _validity(nil)
    array = pa.Array.from_buffers(
        pa.string() if text else pa.binary(),
        len(t),
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(buf[index])],
        nulls,
    )
    if text:
        try:
            array.validate(full=True)  # UTF-8, which msgspec checks when it decodes a str
        except pa.ArrowInvalid:
            return None
    return sizes, array


def _flat_column(buf: Any, pos: Any, dtype: DataType, build: bool) -> _Parsed | None:
    """(sizes in bytes, Arrow column or None unless ``build``) of the values at ``pos``."""
    stored = KINDS[dtype.name].stored
    t = buf[pos]
    nil = t == _NIL
    if stored in ("str", "bin"):
        return _flat_bytes(buf, pos, t, nil, stored == "str", build)
    if stored == "int":
        ints = _flat_ints(buf, pos, t, nil)
        if ints is None:
            return None
        sizes, values = ints
        if not build:
            return sizes, None
        return sizes, pa.array(values, pa.int64(), mask=nil if nil.any() else None)
    if stored == "float":
        f64, f32 = t == 0xCB, t == 0xCA
        if not (nil | f64 | f32).all():
            return None
        sizes = np.where(f64, 9, np.where(f32, 5, 1)).astype(np.int64)
        if not build:
            return sizes, None
        values = _at(buf, pos + 1, ">f8").astype(np.float64)
        if f32.any():
            values[f32] = _at(buf, pos[f32] + 1, ">f4")
        values[nil] = 0.0
        return sizes, pa.array(values, pa.float64(), mask=nil if nil.any() else None)
    if stored == "bool":
        true = t == 0xC3
        if not (nil | true | (t == 0xC2)).all():
            return None
        return np.ones(len(t), np.int64), (
            pa.array(true, pa.bool_(), mask=nil if nil.any() else None) if build else None
        )
    if stored == "nil":
        if not nil.all():
            return None
        return np.ones(len(t), np.int64), pa.nulls(len(t)) if build else None
    return None


def _flat_to_arrow(stored: pa.Array, dtype: DataType) -> pa.Array:
    """A column read by ``_flat_column`` (int64, float64 or string of stored values) as
    ``_column`` builds it."""
    kind = KINDS[dtype.name]
    if kind.zoned:
        if _utc_like():
            return stored.cast(pa.timestamp("us"))
        return _local_wall_clock(stored.to_pylist())
    if kind.stored_arrow is not None and stored.type != kind.stored_arrow:
        stored = stored.cast(kind.stored_arrow)  # int64 -> int32 days of a date
    target = arrow_type(dtype)
    if stored.type == target:
        return stored
    # floats: a float column's float32 values were widened exactly; ints are range-checked
    return stored.cast(target, safe=not pa.types.is_floating(target))


#: Fewest rows read column by column from their MessagePack bytes: the bulk read costs
#: tens of microseconds up front, more than decoding a few hundred rows one by one (the few
#: rows of a key lookup's partition), and gives the same table.
_FLAT_FROM = 256


def _flat_columns(
    rows: Sequence[bytes], fields: Sequence[DataType], wanted: set[int]
) -> dict[int, pa.Array] | None:
    """The ``wanted`` columns (by index) of rows of scalar columns ``fields``; None when a
    row is not exactly what the row codec writes."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    ends = np.cumsum(lengths)
    buf = np.frombuffer(b"".join(rows) + bytes(9), np.uint8)
    return _flat_parse(buf, ends - lengths, ends, fields, wanted)


def _flat_columns_of(
    rows: pa.Array, fields: Sequence[DataType], wanted: set[int]
) -> dict[int, pa.Array] | None:
    """:func:`_flat_columns` of a binary array without nulls, read from its buffers (no
    Python object per row)."""
    _, offsets_buffer, data = rows.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[rows.offset : rows.offset + len(rows) + 1]
    low, high = int(offsets[0]), int(offsets[-1])
    buf = np.zeros(high - low + 9, np.uint8)  # padded: _at reads 8 bytes past a value
    if data is not None:
        buf[: high - low] = np.frombuffer(data, np.uint8)[low:high]
    bounds = offsets.astype(np.int64) - low
    return _flat_parse(buf, bounds[:-1], bounds[1:], fields, wanted)


def _flat_parse(
    buf: Any, starts: Any, ends: Any, fields: Sequence[DataType], wanted: set[int]
) -> dict[int, pa.Array] | None:
    """:func:`_flat_columns` of the rows at ``starts``..``ends`` of ``buf`` (padded)."""
    width = len(fields)
    if width < 16:
        if not (buf[starts] == 0x90 | width).all():
            return None
        pos = starts + 1
    else:
        if not ((buf[starts] == 0xDC) & (_uint_at(buf, starts + 1, 2) == width)).all():
            return None
        pos = starts + 3
    if not (pos <= ends).all():
        return None
    built: dict[int, pa.Array] = {}
    for index, dtype in enumerate(fields):
        parsed = _flat_column(buf, pos, dtype, index in wanted)
        if parsed is None:
            return None
        sizes, column = parsed
        pos = pos + sizes
        if not (pos <= ends).all():
            return None
        if column is not None:
            built[index] = column
    if not (pos == ends).all():
        return None
    try:
        return {i: _flat_to_arrow(c, fields[i]) for i, c in built.items()}
    except (pa.ArrowInvalid, OverflowError):
        return None  # a value out of its column's range: the general path raises


class ArrowRows:
    """Builds Arrow tables of chosen columns of one table from stored rows.

    ``columns`` names table columns, pseudo-columns and :data:`KEY_COLUMN`, in output
    order. Immutable and thread-safe; build one per (schema, columns) and reuse it.
    """

    __slots__ = (
        "_flat",
        "_indexes",
        "_schema",
        "_types",
        "_wanted",
        "_window",
        "columns",
        "out_schema",
        "schema",
    )

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
        self._types = tuple(f.type for f in schema.fields)
        self._flat = not any(KINDS[t.name].nested for t in self._types)
        self._wanted = {self._indexes[n] for n in self.columns if n in self._indexes}

    def from_stored(self, rows: list[bytes], keys: list[bytes] | None = None) -> pa.Table:
        """A table from encoded rows (and their encoded store keys, for :data:`KEY_COLUMN`)."""
        if not rows:
            return self.out_schema.empty_table()
        if self._flat and len(rows) >= _FLAT_FROM:
            flat = _flat_columns(rows, self._types, self._wanted)
            if flat is not None:
                arrays = [
                    pa.array(keys, pa.binary()) if name == KEY_COLUMN else flat[self._indexes[name]]
                    for name in self.columns
                ]
                return pa.Table.from_arrays(arrays, schema=self.out_schema)
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

    def from_stored_array(self, rows: pa.Array) -> pa.Table:
        """:meth:`from_stored` of encoded rows held in a binary array without nulls: a table
        of scalar columns is read from the array's buffers, with no Python object per row."""
        if rows.null_count:
            raise ValueError("stored rows cannot be null")
        if (
            self._flat
            and len(rows) >= _FLAT_FROM
            and KEY_COLUMN not in self.columns
            and rows.type == pa.binary()
        ):
            flat = _flat_columns_of(rows, self._types, self._wanted)
            if flat is not None:
                arrays = [flat[self._indexes[name]] for name in self.columns]
                return pa.Table.from_arrays(arrays, schema=self.out_schema)
        return self.from_stored(rows.to_pylist())

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
