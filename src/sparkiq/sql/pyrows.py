"""DuckDB results with nested columns as Python rows: sized before they are converted, and
converted a slice at a time, so no caller waits on one statement's conversion.

DuckDB turns a result into Python objects holding the GIL, a whole chunk of rows per call.
One row can be enormous: ``SELECT list_sort(list(a.k || b.k)) FROM t a, t b`` is a single
list of ``|t|**2`` strings that DuckDB builds within its memory limit (a value inside one
vector is not spilled); converting 4 million strings held the GIL for a second on an idle
machine and 8-10 s on a loaded one, long enough for peers to declare the node gone, and only
then was the result found to exceed ``max_result_bytes``. DuckDB's Arrow export of the same
result holds the GIL for milliseconds, so a result with a nested column (the only kind whose
single value becomes millions of Python objects) is read as Arrow record batches: their
bytes are counted against the budget *before* conversion, and a large top-level list is
converted :data:`SLICE` values per call, each call holding the GIL for about a millisecond.

Only results whose types Arrow converts exactly as DuckDB does take this path (checked by
type, recursively): integers, floats, decimals, strings, blobs, booleans, enums and lists
and structs of them. Anything else (a ``MAP``, ``HUGEINT``, ``UUID``, ``INTERVAL``, times
and dates, whose Arrow forms differ or overflow at DuckDB's infinities) is fetched by DuckDB
as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

__all__ = ["SLICE", "arrow_rows", "read_as_arrow"]

#: Values of one large list converted per call (about a millisecond of GIL each).
SLICE = 65536

_NESTED = frozenset({"list", "struct"})
_EXACT = frozenset(
    {
        "boolean",
        "tinyint",
        "smallint",
        "integer",
        "bigint",
        "utinyint",
        "usmallint",
        "uinteger",
        "ubigint",
        "float",
        "double",
        "decimal",
        "varchar",
        "blob",
        "enum",
        "null",
    }
)


def read_as_arrow(kinds: Sequence[Any]) -> bool:
    """Whether a result of DuckDB types ``kinds`` (a cursor description's types) is read
    through Arrow: it has a nested column, and Arrow converts every column exactly."""
    return any(k.id in _NESTED for k in kinds) and all(_exact(k) for k in kinds)


def _exact(kind: Any) -> bool:
    if kind.id == "list":
        return _exact(kind.child)
    if kind.id == "struct":
        return all(_exact(child) for _, child in kind.children)
    return kind.id in _EXACT


def arrow_rows(
    batches: Iterable[pa.RecordBatch], max_rows: int | None, max_bytes: int
) -> list[tuple[Any, ...]] | None:
    """The rows of ``batches`` (at most ``max_rows``), or None as soon as their Arrow bytes
    exceed ``max_bytes`` (nothing of the batch that crossed it is converted)."""
    rows: list[tuple[Any, ...]] = []
    held = 0
    for batch in batches:
        held += batch.nbytes
        if held > max_bytes:
            return None
        if max_rows is not None and len(rows) + batch.num_rows > max_rows:
            batch = batch.slice(0, max_rows - len(rows))
        rows += zip(*(_values(column) for column in batch.columns), strict=True)
        if max_rows is not None and len(rows) >= max_rows:
            break
    return rows


def _values(column: pa.Array) -> list[Any]:
    """``column.to_pylist()``, a large list column's values converted :data:`SLICE` at a
    time (between calls other threads get the GIL)."""
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        flat = column.flatten()  # the values of the non-null lists, in order
        if len(flat) > SLICE:
            items: list[Any] = []
            for start in range(0, len(flat), SLICE):
                items += flat.slice(start, SLICE).to_pylist()
            out: list[Any] = []
            at = 0
            for length in column.value_lengths().to_pylist():  # None for a null list
                if length is None:
                    out.append(None)
                else:
                    out.append(items[at : at + length])
                    at += length
            return out
    values: list[Any] = column.to_pylist()
    return values
