"""Every pull query's answer equals DuckDB's over the same ground-truth rows."""

from __future__ import annotations

from collections.abc import Callable

import duckdb
import pytest

from sparkiq import Node
from sparkiq.sql import SqlEngine, SqlLimits, SqlResult
from tests.sql.compare import assert_same, reference

# (statement, whether its ORDER BY fixes the row order completely)
QUERIES: list[tuple[str, bool]] = [
    # tier 0: one key, any select list
    ("SELECT * FROM t WHERE k = 'k001'", False),
    ("SELECT n * 2 + 1 AS m, upper(k) FROM t WHERE k = 'k003'", False),
    ("SELECT * FROM t WHERE k = 'k007'", False),  # deleted
    ("SELECT k, n FROM t WHERE 'k010' = k AND n > 5", False),
    ("SELECT * FROM ck WHERE region = 'eu' AND id = 3", False),
    ("SELECT amount, ts FROM ck WHERE id = -5 AND region = 'eu-west'", False),
    ("SELECT * FROM ik WHERE key = -47", False),
    ("SELECT * FROM lk WHERE key = 30000000057", False),
    ("SELECT * FROM dk WHERE key = DATE '2024-01-15'", False),
    ("SELECT * FROM dk WHERE key = '2024-01-16'", False),
    ("SELECT * FROM tk WHERE key = TIMESTAMP '2024-03-01 06:10:00'", False),
    ("SELECT * FROM xk WHERE key = 1.375", False),
    ("SELECT * FROM xk WHERE key = -12.5", False),
    ("SELECT info.a, info, day, price FROM w WHERE k = 'w013'", False),
    ("SELECT a.k AS key, a.n FROM t AS a WHERE a.k = 'k002'", False),
    ("SELECT k, WINDOWSTART, WINDOWEND FROM win WHERE k = 'c'", False),
    ("SELECT * FROM t WHERE k = 'k001' AND k = 'k002'", False),
    ("SELECT * FROM t WHERE k = 'k001' AND k IN ('k001', 'k002')", False),
    ("SELECT * FROM t WHERE k < 'k003' AND k > 'k010'", False),
    ("SELECT * FROM ik WHERE key >= 2.5 AND key < 11", False),
    # tier 1: IN, ranges, BETWEEN, composite prefixes
    ("SELECT * FROM t WHERE k IN ('k001', 'k002', 'k007', 'nope')", False),
    ("SELECT * FROM t WHERE k BETWEEN 'k010' AND 'k020'", False),
    ("SELECT * FROM t WHERE k > 'k190'", False),
    ("SELECT * FROM t WHERE k >= 'k190' AND k < 'k195'", False),
    ("SELECT * FROM t WHERE k <= 'k005' OR k = 'new'", False),
    ("SELECT * FROM ik WHERE key > -10 AND key <= 20", False),
    ("SELECT * FROM ik WHERE key < -44", False),
    ("SELECT * FROM lk WHERE key BETWEEN -100000000190 AND 50000000095", False),
    ("SELECT * FROM dk WHERE key >= DATE '2024-02-01' AND key < DATE '2024-02-05'", False),
    ("SELECT * FROM tk WHERE key > '2024-03-02 10:00:00' AND key <= '2024-03-03'", False),
    ("SELECT * FROM xk WHERE key > -3.5 AND key < 2", False),
    ("SELECT * FROM xk WHERE key IN (1.375, 2.25, 99)", False),
    ("SELECT * FROM ck WHERE region = 'eu'", False),
    ("SELECT * FROM ck WHERE region = 'eu' AND id > 30", False),
    ("SELECT * FROM ck WHERE region = 'us' AND id BETWEEN -2 AND 2", False),
    ("SELECT * FROM ck WHERE region IN ('eu', 'us') AND id IN (1, 2, 3)", False),
    ("SELECT * FROM ck WHERE region > 'eu' AND region < 'us'", False),
    ("SELECT * FROM ck WHERE region IN ('apac', 'us')", False),
    ("SELECT * FROM ck WHERE id = 4", False),
    # tier 2: any filter, order, limit, offset
    ("SELECT * FROM t WHERE n > 150", False),
    ("SELECT k FROM t WHERE n % 7 = 3 AND k LIKE 'k1%'", False),
    ("SELECT * FROM w WHERE tag = 'red' AND price > 30", False),
    ("SELECT k, tag FROM w WHERE tag IS NULL", False),
    ("SELECT k, n FROM w WHERE n < price", False),
    ("SELECT k, info.tags FROM w WHERE list_contains(info.tags, 'x1')", False),
    ("SELECT * FROM t ORDER BY n DESC, k LIMIT 7", True),
    ("SELECT * FROM t ORDER BY k LIMIT 5 OFFSET 10", True),
    ("SELECT * FROM t WHERE n > 10 ORDER BY n LIMIT 3", True),
    (
        "SELECT region, id, amount FROM ck WHERE amount > 50 ORDER BY amount DESC, region LIMIT 4",
        True,
    ),
    ("SELECT DISTINCT tag FROM w", False),
    ("SELECT count(*) FROM (SELECT * FROM t WHERE n > 3) AS s", False),
    ("WITH big AS (SELECT * FROM t WHERE n > 100) SELECT count(*) AS c FROM big", False),
    ("SELECT k FROM t WHERE n > 190 UNION ALL SELECT k FROM w WHERE n > 115", False),
    # tier 3: aggregates
    ("SELECT count(*), sum(n), avg(n), min(n), max(k) FROM t", False),
    ("SELECT count(*) FROM t WHERE k < 'k010'", False),
    ("SELECT tag, count(*) AS c, sum(price) AS s, avg(n) FROM w GROUP BY tag", False),
    ("SELECT tag, count(n) FROM w GROUP BY tag HAVING count(n) > 20", False),
    ("SELECT upper(tag), max(day) FROM w GROUP BY upper(tag) ORDER BY 1 NULLS FIRST", True),
    ("SELECT region, sum(amount), count(*) FROM ck GROUP BY region ORDER BY region", True),
    ("SELECT region, avg(amount) FROM ck WHERE id > 10 GROUP BY 1", False),
    ("SELECT count(DISTINCT tag), count(DISTINCT n % 5) FROM w", False),
    ("SELECT tag, median(price), stddev_samp(price) FROM w GROUP BY tag", False),
    ("SELECT n % 4 AS bucket, count(*) FROM t GROUP BY bucket ORDER BY bucket", True),
    ("SELECT sum(v), min(key), max(key) FROM dk WHERE key > '2024-01-01'", False),
    ("SELECT count(*) FROM t WHERE n > 10000", False),
    ("SELECT k, row_number() OVER (ORDER BY n, k) AS r FROM t WHERE n < 5", False),
    # tier 4: joins
    ("SELECT t.k, t.n, w.tag FROM t JOIN w ON t.n = w.n WHERE t.n < 20", False),
    ("SELECT a.k, b.v FROM t AS a JOIN ik AS b ON a.n = b.key", False),
    ("SELECT t.k, ik.v FROM t LEFT JOIN ik ON t.n = ik.key WHERE ik.v IS NULL AND t.n < 30", False),
    ("SELECT count(*) FROM t, ik WHERE t.n = ik.key AND ik.key > 10", False),
    (
        "SELECT x.region, count(*) FROM ck AS x JOIN ck AS y "
        "ON x.id = y.id AND x.region <> y.region GROUP BY x.region",
        False,
    ),
    # windowed tables
    ("SELECT k, clicks FROM win WHERE k = 'a'", False),
    (
        "SELECT k, WINDOWSTART, WINDOWEND, clicks FROM win WHERE k = 'b' "
        "AND WINDOWSTART >= '2024-03-01 04:00:00' AND WINDOWEND <= '2024-03-01 12:00:00'",
        False,
    ),
    ("SELECT k, WINDOWSTART, clicks FROM win WHERE WINDOWSTART > '2024-03-01 18:00:00'", False),
    (
        'SELECT k, "window", clicks FROM win '
        "WHERE k IN ('c', 'e') AND WINDOWSTART < '2024-03-01 09:00:00'",
        False,
    ),
    ("SELECT WINDOWSTART, sum(clicks) FROM win GROUP BY WINDOWSTART ORDER BY 1", True),
    (
        "SELECT k, count(*) FROM win WHERE WINDOWSTART BETWEEN '2024-03-01 02:00:00' AND "
        "'2024-03-01 08:00:00' GROUP BY k",
        False,
    ),
]


@pytest.fixture(scope="module", params=["default", "fragments-always"])
def run_sql(request: pytest.FixtureRequest, node: Node) -> Callable[[str], SqlResult]:
    """``node.sql``, and an engine whose partitions run their fragments however few rows
    they hold (the test tables are small: by default they would ship rows instead)."""
    if request.param == "default":
        return node.sql  # type: ignore[no-any-return]
    return SqlEngine(node, SqlLimits(fragment_min_rows=0)).execute


@pytest.mark.parametrize(("sql", "ordered"), QUERIES, ids=[q for q, _ in QUERIES])
def test_answer_equals_duckdb_over_ground_truth(
    run_sql: Callable[[str], SqlResult],
    ground: duckdb.DuckDBPyConnection,
    sql: str,
    ordered: bool,
) -> None:
    names, rows = reference(ground, sql)
    result = run_sql(sql)
    assert_same(result, names, rows, ordered)
    if result.rows:
        assert not result.position.is_empty()


def test_a_lookup_by_shape_reuses_its_plan_and_stays_exact(
    node: Node, ground: duckdb.DuckDBPyConnection
) -> None:
    for i in range(0, 200, 13):
        sql = f"SELECT k, n FROM t WHERE k = 'k{i:03d}'"
        names, rows = reference(ground, sql)
        assert_same(node.sql(sql), names, rows, False)
    # a literal of another type than the key's goes the DuckDB way and says so
    names, rows = reference(ground, "SELECT * FROM ik WHERE key = 7")
    assert_same(node.sql("SELECT * FROM ik WHERE key = 7"), names, rows, False)
    assert_same(
        node.sql("SELECT * FROM ik WHERE key = -2"),
        *reference(ground, "SELECT * FROM ik WHERE key = -2"),
        False,
    )
