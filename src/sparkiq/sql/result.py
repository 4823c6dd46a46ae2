"""The answer to a SQL statement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkiq.query.position import Position
from sparkiq.wire.arrowipc import result_table

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["SqlResult"]


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
    """

    columns: list[str]
    rows: list[dict[str, Any]]
    position: Position = field(default_factory=Position.empty)
    next_page_token: str | None = None
    explain: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def tuples(self) -> list[tuple[Any, ...]]:
        """Rows as tuples in column order."""
        return [tuple(row.get(c) for c in self.columns) for row in self.rows]

    def to_arrow(self) -> pa.Table:
        """The rows as a ``pyarrow.Table`` with the columns in order. Built from ``rows``,
        so each column's type is the one Arrow infers from its values (ints as int64,
        floats as float64, dicts as structs); ``Client.sql(..., format="arrow")`` instead
        fetches the node's Arrow stream, whose columns keep their Spark types."""
        return result_table(self.columns, self.rows)

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
