"""SQL results as Arrow IPC streams: what ``POST /query`` sends to a caller that asks for
``Accept: application/vnd.apache.arrow.stream``, and how :class:`~sparkiq.Client` reads it.

A result is one IPC *stream* (the schema, then record batches of at most
:data:`ROWS_PER_BATCH` rows, then the end-of-stream marker), produced batch by batch
(:func:`ipc_chunks`): the response is never one bytes object the size of the result. The
columns are built whole first (:func:`result_table`, so that each column has one type
however its values turn out), beside the Python rows the result already holds and smaller
than them; the rows themselves are bounded by ``SqlLimits.max_result_rows``. The
position the result was read at travels in the :data:`POSITION_HEADER` response header,
a page token in :data:`PAGE_TOKEN_HEADER`.

Column types (:func:`result_table`) follow the rule the Postgres endpoint uses for its type
OIDs: a result column named like a column of a table the statement reads, whose values are
what that column's Spark type holds, gets that type's Arrow type
(:func:`sparkiq.schema.arrowtypes.arrow_type`, timestamps naive in local wall-clock time as
PySpark shows them, ``decimal(p,s)`` as ``decimal128(p,s)``, ``float`` as float32, maps as
Arrow maps); any other column (an expression, an aggregate, a column renamed into something
else) gets the type Arrow infers from its values (``int`` -> int64, ``float`` -> float64,
``Decimal`` -> decimal128 wide enough for its values, dicts -> structs). Reading the table
back (:func:`table_rows`) gives the rows :meth:`sparkiq.Node.sql` gives.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.schema.arrowtypes import arrow_type
from sparkiq.schema.kinds import KINDS, Kind
from sparkiq.schema.types import DataType, TableSchema

__all__ = [
    "CONTENT_TYPE",
    "PAGE_TOKEN_HEADER",
    "POSITION_HEADER",
    "ROWS_PER_BATCH",
    "ipc_chunks",
    "read_table",
    "result_table",
    "table_rows",
]

#: The media type of an Arrow IPC stream (IANA registration of Apache Arrow).
CONTENT_TYPE = "application/vnd.apache.arrow.stream"
#: Response header with the position token the result was read at (``Position.to_token``).
POSITION_HEADER = "sparkiq-position"
#: Response header with the next page's token, present only when more rows remain.
PAGE_TOKEN_HEADER = "sparkiq-next-page-token"
#: Most rows in one record batch: large enough that per-batch overhead is noise, small
#: enough that a reader can start on the first batch while later ones are on the way.
ROWS_PER_BATCH = 16_384

# What converting a Python value to an Arrow type raises when it does not fit.
_MISFITS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)


def result_table(
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    schemas: Iterable[TableSchema] = (),
) -> pa.Table:
    """``rows`` (dicts, as :class:`~sparkiq.sql.SqlResult` holds them) as an Arrow table
    with ``columns`` in order; ``schemas`` are the tables the statement read (see the
    module docstring for how they type the columns)."""
    declared = _declared(schemas)
    arrays = [
        _column(values, declared.get(name.lower()))
        for name, values in zip(columns, _transposed(columns, rows), strict=True)
    ]
    return pa.Table.from_arrays(arrays, names=list(columns))


def _transposed(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The values of each column, in column order."""
    try:
        return [list(map(itemgetter(name), rows)) for name in columns]
    except KeyError:  # rows that lack a column (not what the engine gives): nulls there
        return [[row.get(name) for row in rows] for name in columns]


def _declared(schemas: Iterable[TableSchema]) -> dict[str, DataType | None]:
    """Column name (lower case) -> its Spark type; None when two tables type it differently."""
    out: dict[str, DataType | None] = {}
    for schema in schemas:
        for f in schema.fields:
            name = f.name.lower()
            if name in out and out[name] != f.type:
                out[name] = None
            else:
                out[name] = f.type
    return out


def _column(values: list[Any], declared: DataType | None) -> pa.Array:
    if declared is not None:
        kind = KINDS.get(declared.name)
        sample = next((v for v in values if v is not None), None)
        if kind is not None and (sample is None or _holds(kind, declared, sample)):
            try:
                wanted = arrow_type(declared, timestamp_tz=None)
                array = pa.array(values, type=wanted)
            except _MISFITS:
                pass
            else:
                if not pa.types.is_float32(wanted) or _exact_float32(array, values):
                    return array
    try:
        return pa.array(values)
    except _MISFITS:
        # Values of mixed classes (a statement over a void column, say): text keeps them all.
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def _holds(kind: Kind, dtype: DataType, value: Any) -> bool:
    """Whether ``value`` is what a column of ``dtype`` holds (not something computed into
    another class under the same name). Arrow would otherwise convert silently: a float
    into an int column truncates, a dict with other keys into a struct becomes nulls."""
    if kind.family == "struct":
        return isinstance(value, dict) and set(value) <= {f.name for f in dtype.fields}
    if kind.family == "map":
        return isinstance(value, dict)
    if kind.family == "array":
        return isinstance(value, list | tuple)
    if kind.python is None:
        return False
    if kind.python is bytes:
        return isinstance(value, bytes | bytearray | memoryview)
    if kind.python is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind.python is float:
        return isinstance(value, float)
    if kind.python is dt.date:  # a datetime is a date too, but not what a date column holds
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    return isinstance(value, kind.python)


def _exact_float32(array: pa.Array, values: list[Any]) -> bool:
    """Whether every value survived the narrowing to float32 (a double column renamed like
    a float column would not)."""
    wide = pa.array(values, type=pa.float64())
    same = pc.equal(array.cast(pa.float64()), wide)
    nan = pc.and_(pc.is_nan(wide), pc.is_nan(array.cast(pa.float64())))
    return bool(pc.all(pc.or_kleene(same, nan)).as_py() is not False)


class _Collector:
    """A write-only file for :func:`pyarrow.ipc.new_stream` that hands out what was
    written since the last :meth:`take`."""

    closed = False

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(self._parts[-1])

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts = []
        return out


def ipc_chunks(table: pa.Table, rows_per_batch: int = ROWS_PER_BATCH) -> Iterator[bytes]:
    """``table`` as an Arrow IPC stream, one piece per record batch (the first also holds
    the schema), then the end-of-stream marker. Closing the generator early stops it."""
    sink = _Collector()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=rows_per_batch):
            writer.write_batch(batch)
            yield sink.take()
    yield sink.take()  # the end-of-stream marker (and the schema, when there was no batch)


def read_table(data: bytes | pa.Buffer) -> pa.Table:
    """The table an IPC stream holds (zero-copy over ``data``)."""
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    return pa.ipc.open_stream(buffer).read_all()


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows of ``table`` as dicts with the values :meth:`sparkiq.Node.sql` gives (maps
    as dicts, not lists of pairs)."""
    rows: list[dict[str, Any]] = table.to_pylist(maps_as_pydicts="strict")
    return rows
