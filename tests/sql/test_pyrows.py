"""Results with nested columns are read through Arrow (sparkiq.sql.pyrows): the rows equal
what DuckDB's own conversion gives, value for value and type for type; a result beyond
``max_result_bytes`` is refused before it becomes Python objects; types Arrow would convert
differently keep DuckDB's conversion."""

from __future__ import annotations

import decimal
import math
import uuid
from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from sparkiq.sql.duck import DuckPool, run
from sparkiq.sql.errors import SqlLimitError
from sparkiq.sql.pyrows import SLICE, read_as_arrow

NESTED = """SELECT * FROM (VALUES
    (1, ['a', NULL, 'é漢'], {'x': 1.5::DECIMAL(4, 2), 'y': ['u']}, [{'k': 'v'}],
     'a'::ENUM('a', 'b'), 'nan'::DOUBLE, 18446744073709551615::UBIGINT, '\\xAA'::BLOB,
     [[1, 2], []], '{"j": 1}'::JSON),
    (2, NULL, NULL, [], NULL, NULL, NULL, NULL, NULL, NULL),
    (3, [], {'x': NULL, 'y': NULL}, [NULL], 'b', -0.0, 0, ''::BLOB, [NULL], NULL)
) AS v(i, l, s, ls, e, d, u, b, ll, j) ORDER BY i"""


@pytest.fixture(scope="module")
def pool() -> Iterator[DuckPool]:
    pool = DuckPool("256MB", 2, max_result_bytes=8 << 20)
    yield pool
    pool.close()


def duckdb_rows(sql: str) -> list[tuple[Any, ...]]:
    with duckdb.connect() as con:
        return con.execute(sql).fetchall()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b) and str(a) == str(b)  # -0.0 == 0.0, but not as text


def test_nested_results_read_through_arrow_equal_duckdbs_conversion(pool: DuckPool) -> None:
    with duckdb.connect() as con:
        kinds = [d[1] for d in con.execute(NESTED).description]
    assert read_as_arrow(kinds)  # this test exercises the Arrow path
    names, rows = run(pool, NESTED, {}, timeout=30)
    expected = duckdb_rows(NESTED)
    assert names == ["i", "l", "s", "ls", "e", "d", "u", "b", "ll", "j"]
    assert len(rows) == 3
    for got, want in zip(rows, expected, strict=True):
        assert same(got, want), (got, want)
    assert rows[0][2] == {"x": decimal.Decimal("1.50"), "y": ["u"]}
    _, first_two = run(pool, NESTED, {}, timeout=30, max_rows=2)
    assert [r[0] for r in first_two] == [1, 2]


def test_a_large_list_is_converted_whole_and_in_order(pool: DuckPool) -> None:
    count = 3 * SLICE + 5
    sql = (
        "SELECT i, list(x ORDER BY x) AS l FROM "
        f"(SELECT range % 2 AS i, range AS x FROM range({count})) GROUP BY i "
        "UNION ALL SELECT 9, NULL ORDER BY i"
    )
    _, rows = run(pool, sql, {}, timeout=30)
    assert [r[0] for r in rows] == [0, 1, 9]
    assert rows[0][1] == list(range(0, count, 2)) and rows[1][1] == list(range(1, count, 2))
    assert rows[2][1] is None


def test_map_columns_read_through_arrow_are_dicts_as_duckdb_makes_them(pool: DuckPool) -> None:
    count = 2 * SLICE + 3
    sql = (
        "SELECT * FROM (VALUES (1, map([7, 8], [1, NULL]::UBIGINT[])), (2, NULL), (3, map([], [])),"
        f" (4, (SELECT histogram(range % {count}) FROM range({count})))) AS v(i, m) ORDER BY i"
    )
    with duckdb.connect() as con:
        assert read_as_arrow([d[1] for d in con.execute(sql).description])
        nested = "SELECT [map(['a'], [1])] AS l"
        assert not read_as_arrow([d[1] for d in con.execute(nested).description])
    _, rows = run(pool, sql, {}, timeout=30)
    assert rows == duckdb_rows(sql)
    assert rows[0][1] == {7: 1, 8: None} and rows[1][1] is None and rows[2][1] == {}
    assert rows[3][1] == dict.fromkeys(range(count), 1)
    _, middle = run(pool, sql, {}, timeout=30, max_rows=3)  # a batch sliced: offsets hold
    assert middle == rows[:3]
    _, nested_rows = run(pool, nested, {}, timeout=30)
    assert nested_rows == [([{"a": 1}],)]


def test_a_nested_result_too_large_is_refused_before_conversion(pool: DuckPool) -> None:
    sql = "SELECT list(repeat('x', 100) || range) AS l FROM range(200000)"  # about 20 MB
    with pytest.raises(SqlLimitError, match="max_result_bytes") as refused:
        run(pool, sql, {}, timeout=30)
    assert refused.value.code == "result_too_large"


def test_types_arrow_converts_differently_keep_duckdbs_conversion(pool: DuckPool) -> None:
    sql = (
        "SELECT [1] AS l, map([1, 2], ['a', 'b']) AS m, sum(x) AS h, INTERVAL 3 DAY AS iv,"
        " '5d9a4d1a-7f3e-4a58-9d9b-2a4f2e6f1c11'::UUID AS u, [DATE '2024-01-02'] AS ds"
        " FROM (SELECT range::BIGINT AS x FROM range(3))"
    )
    with duckdb.connect() as con:
        assert not read_as_arrow([d[1] for d in con.execute(sql).description])
    _, rows = run(pool, sql, {}, timeout=30)
    assert rows == duckdb_rows(sql)
    ((lst, mapping, total, interval, ident, dates),) = rows
    assert mapping == {1: "a", 2: "b"} and total == 3 and type(total) is int
    assert interval.days == 3 and ident == uuid.UUID("5d9a4d1a-7f3e-4a58-9d9b-2a4f2e6f1c11")
    assert lst == [1] and [d.isoformat() for d in dates] == ["2024-01-02"]


def test_flat_results_are_not_read_through_arrow() -> None:
    with duckdb.connect() as con:
        kinds = [d[1] for d in con.execute("SELECT 1 AS i, 'x' AS s").description]
    assert not read_as_arrow(kinds)
    assert pa.types.is_list(pa.list_(pa.string()))  # pyarrow present for the path above
