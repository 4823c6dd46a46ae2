"""``COPY ... TO STDOUT`` on the Postgres endpoint, as bulk readers send it.

connectorx (polars' ``read_database_uri``) and the ADBC PostgreSQL driver read results with
``COPY (SELECT ...) TO STDOUT`` in the binary format, psql's ``\\copy`` and scripts in text
and CSV. Every format is read back by a real client and compared with ``Node.sql`` on the
same node; copying in, and copying to a server file or program, are refused.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import adbc_driver_postgresql.dbapi as adbc
import connectorx as cx
import polars as pl
import psycopg
import pytest

from sparkiq import Node
from tests.sql.tables import build_world

QUERY = "SELECT region, id, amount, ts FROM ck ORDER BY region, id"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("copy"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


def uri(node: Node) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    return f"postgresql://reader@{host}:{port}/sparkiq"


@pytest.fixture(scope="module")
def conn(node: Node) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(uri(node), autocommit=True) as c:
        yield c


def expected(node: Node, sql: str = QUERY) -> list[tuple[Any, ...]]:
    result = node.sql(sql)
    return [tuple(row[c] for c in result.columns) for row in result.rows]


def naive(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Timestamps as the naive local times PySpark gives (clients return them aware)."""
    return [
        tuple(
            v.astimezone().replace(tzinfo=None) if hasattr(v, "tzinfo") and v.tzinfo else v
            for v in row
        )
        for row in rows
    ]


def test_binary_copy_read_by_psycopg(node: Node, conn: psycopg.Connection[Any]) -> None:
    with conn.cursor() as cur:
        with cur.copy(f"COPY ({QUERY}) TO STDOUT (FORMAT binary)") as copy:
            copy.set_types(["text", "int4", "numeric", "timestamptz"])
            rows = list(copy.rows())
        assert cur.rowcount == len(rows)  # from the command tag, COPY <rows>
    assert naive(rows) == expected(node)


@pytest.mark.parametrize(
    ("options", "delimiter", "header", "null"),
    [
        ("", "\t", False, "\\N"),
        ("WITH (FORMAT csv, HEADER true)", ",", True, ""),
        ("WITH CSV HEADER", ",", True, ""),
        ("(DELIMITER '|', NULL 'nil')", "|", False, "nil"),
    ],
)
def test_text_and_csv_copies(
    node: Node, conn: psycopg.Connection[Any], options: str, delimiter: str, header: bool, null: str
) -> None:
    sql = "SELECT k, n FROM t ORDER BY k"
    with conn.cursor() as cur, cur.copy(f"COPY ({sql}) TO STDOUT {options}") as copy:
        text = b"".join(bytes(chunk) for chunk in copy).decode()
    lines = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    if header:
        assert lines.pop(0) == ["k", "n"]
    assert [(k, None if n == null else int(n)) for k, n in lines] == expected(node, sql)


def test_a_table_name_and_column_list(node: Node, conn: psycopg.Connection[Any]) -> None:
    with conn.cursor() as cur, cur.copy("COPY t (k, n) TO STDOUT WITH CSV") as copy:
        text = b"".join(bytes(chunk) for chunk in copy).decode()
    got = sorted((k, int(n)) for k, n in csv.reader(io.StringIO(text)))
    assert got == sorted(expected(node, "SELECT k, n FROM t"))


def test_connectorx_and_polars_read_through_copy(node: Node) -> None:
    want = expected(node)
    table = cx.read_sql(uri(node), QUERY, return_type="arrow")
    assert naive([tuple(r.values()) for r in table.to_pylist()]) == want
    frame = pl.read_database_uri(QUERY, uri(node))  # connectorx, its default engine
    assert naive(frame.rows()) == want


def test_adbc_reads_through_copy(node: Node) -> None:
    with adbc.connect(uri(node)) as connection, connection.cursor() as cursor:
        cursor.execute(QUERY)
        table = cursor.fetch_arrow_table()
    # ADBC gives numeric as its text (Arrow has no arbitrary-precision decimal to guess)
    rows = [(r["region"], r["id"], Decimal(r["amount"]), r["ts"]) for r in table.to_pylist()]
    assert naive(rows) == expected(node)
    frame = pl.read_database_uri(QUERY, uri(node), engine="adbc")
    assert frame.height == len(rows)


@pytest.mark.skipif(shutil.which("psql") is None, reason="Debian's psql is not installed")
def test_psql_backslash_copy(node: Node) -> None:
    sql = "SELECT k, n FROM t ORDER BY k"
    out = subprocess.run(
        ["psql", uri(node), "-X", "-c", f"\\copy ({sql}) TO STDOUT WITH CSV HEADER"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    lines = list(csv.reader(io.StringIO(out)))
    assert lines[0] == ["k", "n"]
    assert [(k, int(n)) for k, n in lines[1:]] == expected(node, sql)


@pytest.mark.parametrize(
    ("statement", "error", "words"),
    [
        ("COPY t FROM STDIN", psycopg.errors.InsufficientPrivilege, "writes rows"),
        ("COPY (SELECT 1) TO '/tmp/x'", psycopg.errors.InsufficientPrivilege, "server's files"),
        ("COPY t TO PROGRAM 'id'", psycopg.errors.InsufficientPrivilege, "server's files"),
        ("COPY (SELECT 1 TO STDOUT", psycopg.errors.SyntaxError, "not closed"),
        ("COPY t TO STDOUT (FORMAT parquet)", psycopg.errors.FeatureNotSupported, "parquet"),
        ("COPY t TO STDOUT (FREEZE)", psycopg.errors.FeatureNotSupported, "freeze"),
        ("COPY (SELECT * FROM nope) TO STDOUT", psycopg.errors.UndefinedTable, "nope"),
    ],
)
def test_what_is_not_a_copy_out_is_refused(
    conn: psycopg.Connection[Any], statement: str, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words), conn.cursor() as cur, cur.copy(statement) as copy:
        list(copy)
    assert conn.execute("SELECT count(*) FROM t").fetchone() is not None  # still usable
