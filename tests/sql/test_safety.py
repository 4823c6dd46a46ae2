"""Only reading materialized tables is possible: everything else is refused before DuckDB
runs, and DuckDB itself is locked (no files, no network, no extensions, no settings)."""

from __future__ import annotations

import pytest

from sparkiq import Node
from sparkiq.sql import SqlEngine, SqlError, SqlUnknownNameError, SqlUnsupportedError
from sparkiq.sql.duck import DuckPool, run

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
