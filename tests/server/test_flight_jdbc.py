"""Arrow's Flight SQL JDBC driver (the one DBeaver and other JDBC tools load for Flight SQL)
against a live node's Flight SQL endpoint: basic auth with the node's token, a query whose
rows are compared with ``Node.sql``, and the tables ``DatabaseMetaData`` lists.

The driver (``jvm/flight-jdbc``, copied to ``.jvm/flight-jdbc/`` by ``make jvm-jars``) runs
in a real JVM: ``tests/server/jdbc/FlightJdbcProbe.java`` through Java's single-file
launcher. Arrow's Java memory code needs ``--add-opens=java.base/java.nio=ALL-UNNAMED`` on
Java 17 (without it the driver fails reading the first batch).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node
from sparkiq.testing import kafka_jars_dir
from tests.sql.tables import build_world

TOKEN = "flight-jdbc-secret"
PROBE = Path(__file__).parent / "jdbc" / "FlightJdbcProbe.java"
SQL = "SELECT * FROM ck ORDER BY region, id"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("flight-jdbc"))
    build_world(root)
    with Node(root, store="memory", node_id="fj", token=TOKEN, flight_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


def run_probe(node: Node, password: str, sql: str) -> subprocess.CompletedProcess[str]:
    jars = kafka_jars_dir() / "flight-jdbc"
    if not list(jars.glob("flight-sql-jdbc-driver-*.jar")):
        pytest.fail(f"no Flight SQL JDBC jar in {jars}: run `make jvm-jars`")
    java = shutil.which("java")
    assert java is not None, "the JDBC test needs a Java 17 runtime on PATH"
    assert node.flight_address is not None
    host, port = node.flight_address
    command = [
        java,
        "--add-opens=java.base/java.nio=ALL-UNNAMED",
        "-cp",
        f"{jars}{os.sep}*",
        str(PROBE),
        host,
        str(port),
        "analyst",
        password,
        sql,
    ]
    # the launcher compiles the probe in memory first: seconds on a busy machine
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def as_text_of(expected: Any, text: str | None) -> Any:
    """``text`` (what JDBC's getString gave) read as the Python type of ``expected``."""
    if text is None or expected is None:
        return text
    if isinstance(expected, dt.datetime):
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
    if isinstance(expected, int | Decimal | float):
        return type(expected)(text)
    return text


def test_query_and_tables_equal_node_sql(node: Node) -> None:
    done = run_probe(node, TOKEN, SQL)
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    head, rows, tables = lines[0], lines[1:-1], lines[-1]
    truth = node.sql(SQL)
    assert head == truth.columns
    expected = [tuple(r[c] for c in truth.columns) for r in truth.rows]
    assert len(expected) > 10
    got = [tuple(as_text_of(e, t) for e, t in zip(expected[0], row, strict=True)) for row in rows]
    assert got == expected
    assert sorted(tables) == sorted(node.tables)


def test_wrong_password_is_refused(node: Node) -> None:
    done = run_probe(node, "not-the-token", "SELECT 1 AS one")
    assert done.returncode != 0
    assert "UNAUTHENTICATED" in done.stderr or "wrong credentials" in done.stderr, done.stderr
