"""Only reading materialized tables is possible: everything else is refused before DuckDB
runs, and DuckDB itself is locked (no files, no network, no extensions, no settings)."""

from __future__ import annotations

import random
import re
import time

import pytest

from sparkiq import Node
from sparkiq.errors import ConfigError
from sparkiq.spark import ddl
from sparkiq.sql import SqlEngine, SqlError, SqlUnknownNameError, SqlUnsupportedError
from sparkiq.sql.duck import DuckPool, run
from sparkiq.sql.push_plan import like_matcher

REFUSED = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT read_text('/etc/passwd')",
    "SELECT * FROM read_parquet('s3://bucket/x.parquet')",
    "SELECT * FROM read_json('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "SELECT * FROM t WHERE k IN (SELECT file FROM glob('/etc/*'))",
    "SELECT * FROM parquet_scan('/tmp/x.parquet')",
    "SELECT * FROM query('SELECT 1')",
    "SELECT * FROM duckdb_settings()",
    "SELECT current_setting('threads')",
    "SELECT getenv('HOME')",
    "SELECT * FROM '/etc/passwd'",
    "SELECT * FROM 'data.csv'",
    "COPY t TO '/tmp/out.csv'",
    "COPY (SELECT * FROM t) TO '/tmp/out.csv'",
    "ATTACH '/tmp/evil.db' AS evil",
    "INSTALL httpfs",
    "LOAD httpfs",
    "PRAGMA database_list",
    "SET threads = 8",
    "SET enable_external_access = true",
    "CREATE TABLE x AS SELECT * FROM t",
    "CREATE VIEW v AS SELECT 1",
    "INSERT INTO t VALUES ('a', 1)",
    "DELETE FROM t",
    "UPDATE t SET n = 1",
    "DROP TABLE t",
    "SELECT * INTO x FROM t",
    "SELECT 1; SELECT 2",
    "SELECT * FROM t; DROP TABLE t",
    "SELECT * FROM main.t",
    "SELECT * FROM t WHERE k = ?",
    "SELECT * FROM t WHERE k = $1",
    "EXPLAIN ANALYZE SELECT * FROM t",
    "DESCRIBE t",
    "SHOW TABLES",
    "CALL pragma_version()",
    "EXPORT DATABASE '/tmp/x'",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_everything_but_reading_tables_is_refused(node: Node, sql: str) -> None:
    with pytest.raises(SqlError) as caught:
        node.sql(sql)
    assert isinstance(caught.value, SqlUnsupportedError | SqlUnknownNameError) or (
        caught.value.code in ("syntax", "unsupported", "forbidden_statement")
    ), caught.value
    assert caught.value.message


def test_table_functions_are_named_in_the_error(node: Node) -> None:
    with pytest.raises(SqlUnsupportedError) as caught:
        node.sql("SELECT * FROM read_csv('/etc/passwd')")
    assert caught.value.code == "forbidden_function"
    assert "read_csv" in caught.value.message
    assert "materialized table" in caught.value.message
    with pytest.raises(SqlUnsupportedError) as caught:
        node.sql("COPY t TO '/tmp/out.csv'")
    assert caught.value.code == "forbidden_statement"
    assert "SELECT" in caught.value.message


LOCKED = [
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/passwd')",
    "SELECT * FROM glob('/*')",
    "COPY (SELECT 1) TO '/tmp/sparkiq-should-not-exist.csv'",
    "ATTACH '/tmp/sparkiq-should-not-exist.db'",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET threads = 8",
    "SET enable_external_access = true",
    "SET memory_limit = '100GB'",
]


@pytest.mark.parametrize("sql", LOCKED)
def test_the_duckdb_connection_itself_is_locked(sql: str, tmp_path: object) -> None:
    """The second wall: even a statement that slipped past the analyzer cannot reach files,
    extensions or settings."""
    pool = DuckPool("64MB", 1)
    try:
        with pytest.raises(SqlError):
            run(pool, sql, {}, timeout=10)
        names, rows = run(pool, "SELECT current_setting('memory_limit') AS m", {}, timeout=10)
        assert names == ["m"] and rows[0][0] != "100.0 GiB"
    finally:
        pool.close()
    import os

    assert not os.path.exists("/tmp/sparkiq-should-not-exist.csv")
    assert not os.path.exists("/tmp/sparkiq-should-not-exist.db")


def test_only_materialized_tables_are_readable(node: Node) -> None:
    engine = SqlEngine(node)
    with pytest.raises(SqlUnknownNameError) as caught:
        engine.execute("SELECT * FROM duckdb_tables")
    assert caught.value.code == "unknown_table"
    with pytest.raises(SqlUnsupportedError) as refused:
        engine.execute("SELECT * FROM information_schema.tables")
    assert refused.value.code == "qualified_table"


# Each reads DuckDB's catalog view pg_settings through a name that is a CTE somewhere in the
# statement, but not where that reference stands: every one must be an unknown table.
CATALOG_BY_CTE_NAME = [
    # the CTE's scope ends with its subquery (the reported hole)
    "SELECT name, setting FROM (WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM pg_settings) x, "
    "pg_settings",
    "SELECT * FROM (WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM pg_settings) x "
    "WHERE EXISTS (SELECT 1 FROM pg_settings)",
    "SELECT (SELECT count(*) FROM pg_settings), (WITH pg_settings AS (SELECT 1 AS a) SELECT a "
    "FROM pg_settings)",
    "SELECT * FROM t WHERE k IN (SELECT name FROM pg_settings) "
    "AND n IN (WITH pg_settings AS (SELECT 1 AS n) SELECT n FROM pg_settings)",
    "SELECT name FROM pg_settings UNION ALL "
    "(WITH pg_settings AS (SELECT 'a' AS name) SELECT name FROM pg_settings)",
    "WITH a AS (WITH pg_settings AS (SELECT 1 AS x) SELECT * FROM pg_settings) "
    "SELECT * FROM a, pg_settings",
    # a CTE does not see itself, nor the CTEs after it
    "WITH pg_settings AS (SELECT name FROM pg_settings) SELECT * FROM pg_settings",
    "WITH pg_settings AS (WITH z AS (SELECT name FROM pg_settings) SELECT * FROM z) "
    "SELECT * FROM pg_settings",
    "WITH a AS (SELECT * FROM pg_settings), pg_settings AS (SELECT 1 AS x) SELECT * FROM a",
    "WITH RECURSIVE b AS (SELECT 'x' AS name UNION SELECT name FROM pg_settings), "
    "pg_settings AS (SELECT 'y' AS name) SELECT * FROM b",
    # a recursive CTE sees itself only in the recursive term of a UNION
    "WITH RECURSIVE pg_settings AS (SELECT name FROM pg_settings UNION ALL SELECT 'a') "
    "SELECT * FROM pg_settings",
    "WITH RECURSIVE pg_settings AS (SELECT 'a' AS name UNION SELECT name FROM pg_settings "
    "UNION SELECT 'b') SELECT * FROM pg_settings",
    "WITH RECURSIVE pg_settings AS (SELECT 'threads' AS name EXCEPT SELECT name "
    "FROM pg_settings) SELECT * FROM pg_settings",
    "WITH RECURSIVE pg_settings AS (SELECT name FROM pg_settings) SELECT * FROM pg_settings",
]


@pytest.mark.parametrize("sql", CATALOG_BY_CTE_NAME)
def test_a_cte_name_outside_its_scope_is_an_unknown_table(node: Node, sql: str) -> None:
    with pytest.raises(SqlUnknownNameError) as caught:
        node.sql(sql)
    assert caught.value.code == "unknown_table"
    assert caught.value.field == "pg_settings"


def _values(node: Node, sql: str) -> list[tuple[object, ...]]:
    return [tuple(row.values()) for row in node.sql(sql).rows]


def test_ctes_in_scope_still_answer(node: Node) -> None:
    """Scope-aware resolution refuses no valid statement: nested CTEs, shadowing, recursion,
    CTEs in subqueries in FROM, WHERE and SELECT answer as DuckDB defines them."""
    count = _values(node, "SELECT count(*) FROM t")[0][0]
    assert count == 200 - len(range(0, 200, 7)) + 1
    cases: list[tuple[str, list[tuple[object, ...]]]] = [
        ("WITH a AS (SELECT n FROM t WHERE k = 'k001') SELECT * FROM a", [(1,)]),
        (
            "WITH a AS (SELECT 1 AS x), b AS (WITH a AS (SELECT 2 AS x) SELECT * FROM a) "
            "SELECT * FROM b",
            [(2,)],
        ),
        (
            "WITH a AS (SELECT 5 AS x) SELECT * FROM (WITH b AS (SELECT * FROM a) SELECT * FROM b)",
            [(5,)],
        ),
        ("WITH a AS (SELECT 5 AS x) SELECT (SELECT x FROM a) + 1", [(6,)]),
        ("WITH a AS (SELECT 5 AS x), b AS (SELECT x + 1 AS y FROM a) SELECT y FROM b", [(6,)]),
        (
            "WITH RECURSIVE r AS (SELECT 1 AS i UNION ALL SELECT i + 1 FROM r WHERE i < 5) "
            "SELECT sum(i) FROM r",
            [(15,)],
        ),
        (
            "WITH RECURSIVE r AS (SELECT 1 AS i UNION ALL SELECT i + 1 FROM (SELECT i FROM r) "
            "WHERE i < 3) SELECT count(*) FROM r",
            [(3,)],
        ),
        ("WITH t AS (SELECT 'zz' AS k) SELECT k FROM t", [("zz",)]),  # a CTE shadows a table
        ("WITH t AS (SELECT count(*) AS c FROM t) SELECT c FROM t", [(count,)]),
        (
            "SELECT count(*) FROM t WHERE n IN (WITH v AS (SELECT 5 AS n) SELECT n FROM v)",
            [(1,)],
        ),
        ("WITH a AS (SELECT 1 AS x) SELECT x FROM a UNION ALL SELECT x FROM a", [(1,), (1,)]),
        (
            "SELECT (WITH a AS (SELECT 7 AS x) SELECT x FROM a) AS y FROM t WHERE k = 'k001'",
            [(7,)],
        ),
    ]
    for sql, expected in cases:
        assert _values(node, sql) == expected, sql


def _like_by_regex(pattern: str, value: str) -> bool:
    parts = [".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern]
    return re.fullmatch("".join(parts), value, re.DOTALL) is not None


def test_like_matches_as_sql_defines_it() -> None:
    """The non-backtracking LIKE matcher agrees with a regex translation on every small
    pattern and value over a small alphabet (the regex is the reference, not the engine)."""
    rng = random.Random(14)
    for _ in range(20_000):
        pattern = "".join(rng.choice("ab%_") for _ in range(rng.randint(0, 7)))
        value = "".join(rng.choice("ab\n") for _ in range(rng.randint(0, 8)))
        assert like_matcher(pattern)(value) == _like_by_regex(pattern, value), (pattern, value)
    assert like_matcher("a%b%c")("a-b-c") and not like_matcher("a%b%c")("a-c-b")
    assert like_matcher("%bc%bc")("bcbc") and not like_matcher("%bc%bc")("bcb")


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "pattern", ["%a%a%a%a%a%a%a%a%a%a%a%a%b", "%a_a_a_a_a_a%a%a%a%b", "_%_%_%_%_%_%_%_%_%b"]
)
def test_like_never_backtracks(pattern: str) -> None:
    value = "a" * 200_000
    started = time.monotonic()
    assert not like_matcher(pattern)(value)
    assert time.monotonic() - started < 1.0


@pytest.mark.timeout(30)
@pytest.mark.parametrize("quote", ["'", '"'])
def test_ddl_show_reads_comment_openers_in_linear_time(quote: str) -> None:
    """SHOW's rest of line is scanned for comments once: 34,000 "/*" that never close
    (inside a quoted word the tokenizer accepts) are refused at once, the message short."""
    text = f"SHOW TABLES {quote}" + "/* " * 34_000 + quote
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        ddl.parse(text)
    assert time.monotonic() - started < 1.0
    assert "is not supported" in str(caught.value) and len(str(caught.value)) < 1000
    assert isinstance(ddl.parse("SHOW /* a */ TABLES -- b\n;"), ddl.ShowTables)
