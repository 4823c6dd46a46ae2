"""A table's live rows, compared with the rows a test expects (the ground truth).

- :func:`table_rows`: every row of a table now, by key, from an App, a Node or a Client.
- :func:`diff_table` and :func:`assert_table_matches`: those rows against expected ones,
  typically Spark's batch answer over the same input, key by key.
- :func:`assert_sql_rows`: a SQL answer against expected rows, in any order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkiq.query.queries import RangeQuery
from sparkiq.query.request import StateQueryRequest

__all__ = ["TableDiff", "assert_sql_rows", "assert_table_matches", "diff_table", "table_rows"]


def table_rows(source: Any, table: str) -> dict[Any, dict[str, Any]]:
    """Every row of ``table`` now, by key, from an App, a Node or a Client.

    A key is a scalar for one key column, a tuple for several; a windowed table's key is
    ``(key, window start)``. Raises AssertionError if a partition cannot answer.
    """
    result = source.query(StateQueryRequest.in_store(table).with_query(RangeQuery.with_no_bounds()))
    rows: dict[Any, dict[str, Any]] = {}
    for partition, answer in sorted(result.partition_results.items()):
        if answer.is_failure:
            raise AssertionError(
                f"partition {partition} of {table!r} did not answer: "
                f"{answer.failure_reason.name}: {answer.failure_message}"
            )
        with answer.result as items:
            for key, row in items:
                rows[_hashable(key)] = row
    return rows


@dataclass(frozen=True)
class TableDiff:
    """How a table's live rows differ from the expected rows, by key."""

    table: str
    missing: dict[Any, dict[str, Any]] = field(default_factory=dict)  # expected, not live
    unexpected: dict[Any, dict[str, Any]] = field(default_factory=dict)  # live, not expected
    different: dict[Any, tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not (self.missing or self.unexpected or self.different)

    def __str__(self) -> str:
        if self.is_empty:
            return f"table {self.table!r} matches"
        lines = [
            f"table {self.table!r} differs: {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.different)} different keys"
        ]
        for key, row in list(self.missing.items())[:5]:
            lines.append(f"  missing    {key!r}: expected {row!r}")
        for key, row in list(self.unexpected.items())[:5]:
            lines.append(f"  unexpected {key!r}: live {row!r}")
        for key, (live, expected) in list(self.different.items())[:5]:
            lines.append(f"  different  {key!r}: live {live!r}, expected {expected!r}")
        return "\n".join(lines)


def diff_table(
    source: Any,
    table: str,
    expected: Any,
    *,
    key: str | Sequence[str] | None = None,
    window: str | None = None,
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> TableDiff:
    """Compare ``table``'s live rows (from an App, a Node or a Client) with ``expected``: a
    batch DataFrame (typically the pipeline's computation run by ``spark.read`` over the same
    input) or row dicts.

    The key columns and window column are the table's own when ``source`` knows them (an
    App or a Node); pass ``key=`` (and ``window=``) for a Client. ``normalize`` is applied
    to both sides' rows before comparing, e.g. to sort a ``collect_set`` or round a float
    sum whose last bits depend on the order Spark added in.
    """
    columns, window_column = _layout(source, table, key, window)
    expected_rows = _rows(expected)
    same = normalize or (lambda row: row)
    truth: dict[Any, dict[str, Any]] = {}
    for row in expected_rows:
        row_key: Any = row[columns[0]] if len(columns) == 1 else tuple(row[c] for c in columns)
        if window_column is not None:
            row_key = (row_key, (row[window_column] or {}).get("start"))
        truth[_hashable(row_key)] = same(row)
    live = {k: same(v) for k, v in table_rows(source, table).items()}
    return TableDiff(
        table,
        missing={k: v for k, v in truth.items() if k not in live},
        unexpected={k: v for k, v in live.items() if k not in truth},
        different={k: (v, truth[k]) for k, v in live.items() if k in truth and truth[k] != v},
    )


def assert_table_matches(
    source: Any,
    table: str,
    expected: Any,
    *,
    key: str | Sequence[str] | None = None,
    window: str | None = None,
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Raise AssertionError, listing the differing keys, unless :func:`diff_table` finds
    none."""
    diff = diff_table(source, table, expected, key=key, window=window, normalize=normalize)
    if not diff.is_empty:
        raise AssertionError(str(diff))


def _layout(
    source: Any, table: str, key: str | Sequence[str] | None, window: str | None
) -> tuple[tuple[str, ...], str | None]:
    if key is not None:
        return ((key,) if isinstance(key, str) else tuple(key)), window
    tables = getattr(source, "tables", None)
    if isinstance(tables, Mapping) and table in tables:  # an App
        schema = tables[table].manifest.schema
    elif callable(getattr(source, "schema", None)):  # a Node
        schema = source.schema(table)
    else:
        raise TypeError(f"cannot tell the key columns of {table!r}: pass key= (and window=)")
    return tuple(schema.key_columns), schema.window_column


def _hashable(value: Any) -> Any:
    """Keys as PySpark gives them, made usable as dict keys (lists from the wire become
    tuples)."""
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def assert_sql_rows(
    source: Any,
    sql: str,
    expected: Any,
    *,
    ordered: bool = False,
    normalize: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> None:
    """Run ``sql`` on ``source`` (an App, a Node or a Client) and raise AssertionError,
    listing the rows missing and unexpected, unless its rows equal ``expected`` (row dicts,
    or a batch DataFrame), as a multiset: in any order, unless ``ordered`` (for a statement
    with ORDER BY). ``normalize`` is applied to both sides' rows first, e.g. to round a
    float."""
    same = normalize or (lambda row: row)
    got = [same(dict(row)) for row in source.sql(sql).rows]
    want = [same(row) for row in _rows(expected)]
    if ordered:
        if got == want:
            return
        first = next(
            (i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w),
            min(len(got), len(want)),
        )
        raise AssertionError(
            f"{sql!r} answered {len(got)} rows, expected {len(want)}; first difference at "
            f"row {first}: got {got[first] if first < len(got) else 'no row'!r}, expected "
            f"{want[first] if first < len(want) else 'no row'!r}"
        )
    got_count, want_count = Counter(map(_frozen, got)), Counter(map(_frozen, want))
    if got_count == want_count:
        return
    missing = list((want_count - got_count).elements())
    unexpected = list((got_count - want_count).elements())
    lines = [
        f"{sql!r} answered {len(got)} rows, expected {len(want)}: {len(missing)} missing, "
        f"{len(unexpected)} unexpected"
    ]
    lines += [f"  missing    {_thawed(row)!r}" for row in missing[:5]]
    lines += [f"  unexpected {_thawed(row)!r}" for row in unexpected[:5]]
    raise AssertionError("\n".join(lines))


def _rows(expected: Any) -> list[dict[str, Any]]:
    """Row dicts from row dicts or from a batch DataFrame (collected)."""
    if hasattr(expected, "collect") and hasattr(expected, "schema"):
        return [row.asDict(recursive=True) for row in expected.collect()]
    rows: Iterable[Mapping[str, Any]] = expected
    return [dict(row) for row in rows]


def _frozen(value: Any) -> Any:
    """A hashable, comparable stand-in for a row (dicts and lists nested inside too)."""
    if isinstance(value, Mapping):
        return _Row(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


class _Row(tuple):  # type: ignore[type-arg]
    """A frozen dict: its items sorted by column name (the columns' order is not compared:
    expected rows are written by hand)."""


def _thawed(value: Any) -> Any:
    if isinstance(value, _Row):
        return {k: _thawed(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thawed(v) for v in value]
    return value
