"""Arrow's Flight SQL JDBC driver (the one DBeaver and other JDBC tools load for Flight SQL)
against a live node's Flight SQL endpoint: user and password (the node's token), a query
and a ``PreparedStatement`` lookup with a string parameter whose rows are compared with
``Node.sql``, and what ``DatabaseMetaData`` says of the tables, columns and primary key,
compared with the node's own schemas.

The driver (``jvm/flight-jdbc``, copied to ``.jvm/flight-jdbc/`` by ``make jvm-jars``) runs
in a real JVM: ``tests/server/jdbc/FlightJdbcProbe.java`` through Java's single-file
launcher, printing its results as JSON. Arrow's Java memory code needs
``--add-opens=java.base/java.nio=ALL-UNNAMED`` on Java 17 (without it the driver fails
reading the first batch).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from sparkiq import Node
from tests.server.jdbc_probe import records, run_probe
from tests.sql.tables import build_world

TOKEN = "flight-jdbc-secret"
PROBE = "FlightJdbcProbe.java"
# java.sql.Types of ck's columns: VARCHAR, INTEGER, DECIMAL, TIMESTAMP
JDBC_TYPES = [12, 4, 3, 93]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("flight-jdbc"))
    build_world(root)
    with Node(root, store="memory", node_id="fj", token=TOKEN, flight_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


def run_flight_probe(node: Node, password: str) -> subprocess.CompletedProcess[str]:
    assert node.flight_address is not None
    host, port = node.flight_address
    args = [host, str(port), "me", password, "ck", "region", "eu"]
    opens = ["--add-opens=java.base/java.nio=ALL-UNNAMED"]
    return run_probe("flight-jdbc", "flight-sql-jdbc-driver-*.jar", PROBE, args, opens)


@pytest.fixture(scope="module")
def probe(node: Node) -> dict[str, Any]:
    done = run_flight_probe(node, TOKEN)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def as_text_of(expected: Any, text: str | None) -> Any:
    """``text`` (what JDBC's getString gave) read as the Python type of ``expected``."""
    if text is None or expected is None:
        return text
    if isinstance(expected, dt.datetime):
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
    if isinstance(expected, int | Decimal | float):
        return type(expected)(text)
    return text


def same_rows(node: Node, sql: str, answer: dict[str, Any]) -> None:
    truth = node.sql(sql)
    assert answer["columns"] == truth.columns
    expected = [tuple(r[c] for c in truth.columns) for r in truth.rows]
    assert len(expected) > 1
    got = [
        tuple(as_text_of(e, t) for e, t in zip(expected[0], row, strict=True))
        for row in answer["rows"]
    ]
    assert got == expected


def test_query_and_prepared_lookup_equal_node_sql(node: Node, probe: dict[str, Any]) -> None:
    assert probe["product"] == "sparkiq"
    same_rows(node, "SELECT * FROM ck ORDER BY 1, 2", probe["select_all"])
    same_rows(node, "SELECT * FROM ck WHERE region = 'eu' ORDER BY 1, 2", probe["lookup"])


def test_metadata_equals_the_node_schemas(node: Node, probe: dict[str, Any]) -> None:
    tables = records(probe["tables"])
    assert sorted(t["TABLE_NAME"] for t in tables) == sorted(node.tables)
    assert {(t["TABLE_CAT"], t["TABLE_SCHEM"], t["TABLE_TYPE"]) for t in tables} == {
        ("sparkiq", "public", "TABLE")
    }
    schema = node.schema("ck")
    columns = records(probe["columns"])
    assert [c["COLUMN_NAME"] for c in columns] == [f.name for f in schema.fields]
    assert [int(c["DATA_TYPE"]) for c in columns] == JDBC_TYPES
    keys = records(probe["primary_keys"])
    assert [(k["COLUMN_NAME"], int(k["KEY_SEQ"])) for k in keys] == [
        (name, i) for i, name in enumerate(schema.key_columns, start=1)
    ]


def test_wrong_password_is_refused(node: Node) -> None:
    done = run_flight_probe(node, "not-the-token")
    assert done.returncode != 0
    assert "wrong credentials" in done.stderr, done.stderr[-2000:]
