"""The answer to a SQL statement."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import pyarrow as pa

from sparkiq.query.position import Position
from sparkiq.sql.result_schema import spark_type

__all__ = ["SqlResult", "result_table"]

# What converting a Python value to an Arrow type raises when it does not fit.
_MISFITS = (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError)
_HUGEINT = pa.decimal128(38, 0)


@dataclass(frozen=True, slots=True)
class SqlResult:
    """Rows of a pull query (or the plan of an ``EXPLAIN``), with the position read at.

    - ``columns``: output column names, in order.
    - ``rows``: one dict per row, values as PySpark's ``Row.asDict(recursive=True)`` gives
      them (timestamps as naive local datetimes, decimals as Decimal, structs and maps as
      dicts). Two output columns of the same name share one dict entry.
    - ``position``: merge of the positions of every partition read; pass
      ``PositionBound.at(result.position)`` to later statements for monotonic reads.
    - ``next_page_token``: pass it back with the same statement for the next page; None
      when this is the last page.
    - ``explain``: for ``EXPLAIN``, the plan as plain data (the rows list it too).
    - ``schema``: the type of each column, as an Arrow schema (see
      :mod:`sparkiq.sql.result_schema`): what Arrow IPC and the Postgres endpoint send.
      Every result a node makes has one; None for a result read back from the REST
      API's rows, whose Arrow types are then inferred from the values.
    """

    columns: list[str]
    rows: list[dict[str, Any]]
    position: Position = field(default_factory=Position.empty)
    next_page_token: str | None = None
    explain: dict[str, Any] | None = None
    schema: pa.Schema | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def tuples(self) -> list[tuple[Any, ...]]:
        """Rows as tuples in column order."""
        return [tuple(row.get(c) for c in self.columns) for row in self.rows]

    def to_arrow(self) -> pa.Table:
        """The rows as a ``pyarrow.Table`` with the columns in order, typed by ``schema``
        (without one, each column's type is the one Arrow infers from its values: ints as
        int64, floats as float64, dicts as structs)."""
        return result_table(self.columns, self.rows, self.schema)

    def to_pandas(self) -> Any:
        """:meth:`to_arrow` as a ``pandas.DataFrame`` (maps as dicts)."""
        return self.to_arrow().to_pandas(maps_as_pydicts="strict")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON encoders that know datetimes and decimals (e.g. the REST
        layer's): columns, rows, position token, page token and the explained plan."""
        return {
            "columns": list(self.columns),
            "rows": [dict(r) for r in self.rows],
            "position": self.position.to_token(),
            "next_page_token": self.next_page_token,
            "explain": self.explain,
        }


def result_table(
    columns: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    schema: pa.Schema | None = None,
) -> pa.Table:
    """``rows`` (dicts, as :class:`~sparkiq.sql.SqlResult` holds them) as an Arrow table
    with ``columns`` in order, typed by ``schema`` (a result's schema; without one, each
    column's type is the one Arrow infers from its values)."""
    values = _transposed(columns, rows)
    if schema is None:
        return pa.Table.from_arrays([_inferred(v) for v in values], names=list(columns))
    arrays = [_typed(v, field) for v, field in zip(values, schema, strict=True)]
    fields = [field.with_type(array.type) for field, array in zip(schema, arrays, strict=True)]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def _transposed(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """The values of each column, in column order."""
    try:
        return [list(map(itemgetter(name), rows)) for name in columns]
    except KeyError:  # rows that lack a column (not what the engine gives): nulls there
        return [[row.get(name) for row in rows] for name in columns]


def _typed(values: list[Any], field: pa.Field) -> pa.Array:
    held = spark_type(field)
    if held == "uuid":
        values = [None if v is None else str(v) for v in values]
    elif pa.types.is_map(field.type):  # Arrow takes a map's entries as pairs
        values = [None if v is None else list(v.items()) for v in values]
    try:
        return pa.array(values, type=field.type)
    except _MISFITS:
        if held == "hugeint":  # a sum beyond int64: the column widens, exact
            return pa.array(values, type=_HUGEINT)
        # DuckDB values its Arrow type cannot take from Python (none known): inferred
        return _inferred(values)


def _inferred(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except _MISFITS:
        # Values of mixed classes (rows built by hand, say): text keeps them all.
        return pa.array([None if v is None else str(v) for v in values], pa.string())
