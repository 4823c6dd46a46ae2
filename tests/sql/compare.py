"""Comparing answers: the engine's rows against DuckDB run directly on the ground truth."""

from __future__ import annotations

from typing import Any

import duckdb

from sparkiq.sql import SqlResult


def normalize(value: Any) -> Any:
    """Floats rounded (partial sums may differ in the last bits), containers recursively."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return tuple(sorted((k, normalize(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(normalize(v) for v in value)
    return value


def reference(
    ground: duckdb.DuckDBPyConnection, sql: str
) -> tuple[list[str], list[tuple[Any, ...]]]:
    cursor = ground.execute(sql)
    names = [d[0] for d in cursor.description or ()]
    return names, cursor.fetchall()


def assert_same(
    result: SqlResult, names: list[str], rows: list[tuple[Any, ...]], ordered: bool
) -> None:
    assert result.columns == names
    got = [tuple(normalize(row[c]) for c in result.columns) for row in result.rows]
    want = [tuple(normalize(v) for v in row) for row in rows]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want
