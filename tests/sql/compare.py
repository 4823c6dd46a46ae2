"""Comparing answers: the engine's rows against DuckDB run directly on the ground truth."""

from __future__ import annotations

import re
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


_CALL = re.compile(r"^(\w+)\(")
_CAST = re.compile(r"^CAST\((.*) AS [\w ()]+\)$")


def postgres_names(duckdb_names: list[str]) -> list[str]:
    """The names Postgres gives the columns DuckDB names ``duckdb_names`` (the engine
    follows Postgres, docs/sql.md#column-names), derived from DuckDB's text of each item: a
    call is its function's name (``count_star()`` is ``count``), a cast the name of what
    it casts, a plain name itself, anything else ``?column?``; a repeated derived name gets
    ``_1``, ``_2``. (tests/server/test_user_words.py checks the rules against a real
    Postgres server.)"""
    plain = {n.lower() for n in duckdb_names if re.fullmatch(r"\w+", n) and not n.isdigit()}
    taken: set[str] = set(plain)
    out = []
    for name in duckdb_names:
        if name.lower() in plain:
            out.append(name)
            continue
        inner = name
        while (cast := _CAST.match(inner)) is not None:
            inner = cast.group(1)
        call = _CALL.match(inner)
        if re.fullmatch(r"[A-Za-z_]\w*", inner.strip('"')):
            derived = inner.strip('"')
        elif inner == "count_star()":
            derived = "count"
        elif call is not None:
            derived = call.group(1).lower()
        elif inner.startswith("CASE "):
            derived = "case"
        else:
            derived = "?column?"
        unique, n = derived, 0
        while unique.lower() in taken:
            n += 1
            unique = f"{derived}_{n}"
        taken.add(unique.lower())
        out.append(unique)
    return out


def reference(
    ground: duckdb.DuckDBPyConnection, sql: str
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """DuckDB's answer to ``sql`` over the ground truth: the values, with the column names
    Postgres would give (:func:`postgres_names`)."""
    cursor = ground.execute(sql)
    names = [d[0] for d in cursor.description or ()]
    return postgres_names(names), cursor.fetchall()


def assert_same(
    result: SqlResult, names: list[str], rows: list[tuple[Any, ...]], ordered: bool
) -> None:
    assert result.columns == names
    got = [tuple(normalize(row[c]) for c in result.columns) for row in result.rows]
    want = [tuple(normalize(v) for v in row) for row in rows]
    if not ordered:
        got, want = sorted(got, key=repr), sorted(want, key=repr)
    assert got == want
