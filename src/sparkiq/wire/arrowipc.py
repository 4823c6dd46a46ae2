"""SQL results as Arrow IPC streams: what ``POST /query`` sends to a caller that asks for
``Accept: application/vnd.apache.arrow.stream``, and how :class:`~sparkiq.Client` reads it.

A result is one IPC *stream* (the schema, then record batches of at most
:data:`ROWS_PER_BATCH` rows, then the end-of-stream marker), produced batch by batch
(:func:`ipc_chunks`): the response is never one bytes object the size of the result. The
columns are built whole first (:meth:`sparkiq.sql.SqlResult.to_arrow`), beside the Python
rows the result already holds and smaller than them; the rows themselves are bounded by
``SqlLimits.max_result_rows``. The
position the result was read at travels in the :data:`POSITION_HEADER` response header,
a page token in :data:`PAGE_TOKEN_HEADER`.

Column types are the result's own (``SqlResult.schema``, decided where the
result was made: see :mod:`sparkiq.sql.result_schema`): a table's columns keep their Spark
types (timestamps naive in local wall-clock time as PySpark shows them, ``decimal(p,s)`` as
``decimal128(p,s)``, ``float`` as float32, maps as Arrow maps), anything DuckDB computed has
the type DuckDB gives it. Reading the table back (:func:`table_rows`) gives the rows
:meth:`sparkiq.Node.sql` gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

__all__ = [
    "CONTENT_TYPE",
    "PAGE_TOKEN_HEADER",
    "POSITION_HEADER",
    "ROWS_PER_BATCH",
    "ipc_chunks",
    "read_table",
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
