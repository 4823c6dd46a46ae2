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
type, recursively): integers, floats, decimals, strings, blobs, booleans, enums, lists and
structs of them, and a ``MAP`` of them as a column of its own (Arrow gives a map as a list
of pairs: it is made a dict here, as DuckDB makes it). Anything else (a map inside a list
or struct, ``HUGEINT``, ``UUID``, ``INTERVAL``, times and dates, whose Arrow forms differ or
overflow at DuckDB's infinities) is fetched by DuckDB as before.
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
    return any(k.id in _NESTED or k.id == "map" for k in kinds) and all(
        _exact_map(k) if k.id == "map" else _exact(k) for k in kinds
    )


def _exact_map(kind: Any) -> bool:
    return all(_exact(child) for _, child in kind.children)  # its key and its value


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
    """``column.to_pylist()`` (a map column's values as dicts), a large list or map
    column's values converted :data:`SLICE` at a time (between calls other threads get the
    GIL)."""
    if pa.types.is_map(column.type):
        return _maps(column)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        flat = column.flatten()  # the values of the non-null lists, in order
        if len(flat) > SLICE:
            items = _sliced(flat)
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


def _maps(column: pa.MapArray) -> list[dict[Any, Any] | None]:
    """A map column as dicts (DuckDB's form), entries converted and inserted a slice at a
    time."""
    offsets = column.offsets.to_pylist()  # len + 1 positions in the entries, slicing applied
    first = offsets[0]
    count = offsets[-1] - first
    keys = _sliced(column.keys.slice(first, count))
    items = _sliced(column.items.slice(first, count))
    out: list[dict[Any, Any] | None] = []
    for valid, start, end in zip(column.is_valid().to_pylist(), offsets, offsets[1:], strict=False):
        if not valid:
            out.append(None)
            continue
        entries: dict[Any, Any] = {}
        for at in range(start - first, end - first, SLICE):
            stop = min(at + SLICE, end - first)
            entries.update(zip(keys[at:stop], items[at:stop], strict=True))
        out.append(entries)
    return out


def _sliced(array: pa.Array) -> list[Any]:
    values: list[Any] = []
    for start in range(0, len(array), SLICE):
        values += array.slice(start, SLICE).to_pylist()
    return values
