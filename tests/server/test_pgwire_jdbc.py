"""pgJDBC, the Java driver of DBeaver, Metabase, Tableau and Superset's JDBC path, against a
live node: the ``DatabaseMetaData`` calls those tools make on connect, on browsing a schema
and on Metabase's sync (tables, columns, keys, indexes, types, keywords), a key lookup with a
``PreparedStatement`` parameter and an aggregate. Each answer is compared with the node's
own schema and ``Node.sql``.

The driver (``jvm/pg-jdbc``, copied to ``.jvm/pg-jdbc/`` by ``make jvm-jars``) runs in a real
JVM: ``tests/server/jdbc/PgJdbcProbe.java`` through Java's single-file launcher, printing its
results as JSON. It logs in with SCRAM-SHA-256, the node's token as the password.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from sparkiq import Node
from tests.server.jdbc_probe import records, run_probe
from tests.sql.tables import build_world

TOKEN = "jdbc-secret"
PROBE = "PgJdbcProbe.java"
# java.sql.Types of the Postgres types the endpoint gives ck's columns
JDBC_TYPES = {"text": 12, "int4": 4, "numeric": 2, "timestamptz": 93}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("jdbc"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", token=TOKEN, pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


@pytest.fixture(scope="module")
def probe(node: Node) -> dict[str, Any]:
    """What PgJdbcProbe saw of table ck (lookup: region = 'eu')."""
    assert node.pg_address is not None
    host, port = node.pg_address
    args = [host, str(port), TOKEN, "ck", "region", "eu"]
    done = run_probe("pg-jdbc", "postgresql-*.jar", PROBE, args)
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def as_text_of(expected: Any, text: str | None) -> Any:
    """``text`` (what JDBC's getString gave) read as the Python type of ``expected``."""
    if text is None or expected is None:
        return text
    if isinstance(expected, dt.datetime):  # timestamptz: the node's local time as an instant
        return dt.datetime.fromisoformat(text).astimezone().replace(tzinfo=None)
    if isinstance(expected, int | Decimal | float):
        return type(expected)(text)
    return text


def node_rows(node: Node, sql: str) -> list[tuple[Any, ...]]:
    result = node.sql(sql)
    return [tuple(row[c] for c in result.columns) for row in result.rows]


def jdbc_rows(answer: dict[str, Any], like: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    sample = like[0]
    return [
        tuple(as_text_of(e, t) for e, t in zip(sample, row, strict=True)) for row in answer["rows"]
    ]


def test_connects_and_reports_the_server(probe: dict[str, Any]) -> None:
    assert probe["product"] == "PostgreSQL"
    assert probe["major"] == "14"
    assert probe["version"].startswith("14.0")
    assert probe["driver"].startswith("42.7.")
    assert (probe["user"], probe["catalog"], probe["schema"]) == ("analyst", "sparkiq", "public")
    assert probe["version_row"]["rows"][0][0].startswith("PostgreSQL 14.0")
    keywords = probe["keywords"].split(",")
    assert "limit" in keywords and "select" not in keywords  # SQL:2003 words are left out


def test_catalogs_schemas_and_tables(node: Node, probe: dict[str, Any]) -> None:
    assert probe["catalogs"]["rows"] == [["sparkiq"]]
    assert ["public", "sparkiq"] in probe["schemas"]["rows"]
    assert probe["schemas_like"]["rows"] == [["public", "sparkiq"]]
    tables = records(probe["tables"])
    assert [t["TABLE_NAME"] for t in tables] == sorted(node.tables)
    assert {(t["TABLE_SCHEM"], t["TABLE_TYPE"]) for t in tables} == {("public", "TABLE")}
    every = records(probe["all_tables"])
    assert {t["TABLE_NAME"] for t in every if t["TABLE_TYPE"] == "TABLE"} == set(node.tables)
    # each table's primary key index, as Postgres lists them with no type filter
    assert {t["TABLE_NAME"] for t in every if t["TABLE_TYPE"] == "INDEX"} == {
        f"{t}_pkey" for t in node.tables
    }


def test_columns_keys_and_indexes(node: Node, probe: dict[str, Any]) -> None:
    schema = node.schema("ck")
    columns = records(probe["columns"])
    assert [c["COLUMN_NAME"] for c in columns] == [f.name for f in schema.fields]
    assert [c["TYPE_NAME"] for c in columns] == ["text", "int4", "numeric", "timestamptz"]
    assert [int(c["DATA_TYPE"]) for c in columns] == [JDBC_TYPES[c["TYPE_NAME"]] for c in columns]
    assert [(c["COLUMN_SIZE"], c["DECIMAL_DIGITS"]) for c in columns][2] == ("10", "2")
    assert [c["IS_NULLABLE"] for c in columns] == [
        "NO" if f.name in schema.key_columns else "YES" for f in schema.fields
    ]
    assert [int(c["ORDINAL_POSITION"]) for c in columns] == [1, 2, 3, 4]
    # Metabase's sync: every column of every table in one call
    every = records(probe["all_columns"])
    assert sorted((c["TABLE_NAME"], c["COLUMN_NAME"]) for c in every) == sorted(
        (t, f.name) for t in node.tables for f in node.schema(t).fields
    )
    keys = records(probe["primary_keys"])
    assert [(k["COLUMN_NAME"], int(k["KEY_SEQ"]), k["PK_NAME"]) for k in keys] == [
        (name, i, "ck_pkey") for i, name in enumerate(schema.key_columns, start=1)
    ]
    assert probe["imported_keys"]["rows"] == [] and probe["exported_keys"]["rows"] == []
    index = records(probe["index_info"])
    assert [(i["INDEX_NAME"], i["NON_UNIQUE"], i["COLUMN_NAME"]) for i in index] == [
        ("ck_pkey", "f", name) for name in schema.key_columns
    ]
    assert probe["table_privileges"]["rows"], "DBeaver's privileges tab lists the owner's grants"


def test_type_info_names_the_types_columns_have(probe: dict[str, Any]) -> None:
    types = {t["TYPE_NAME"]: int(t["DATA_TYPE"]) for t in records(probe["type_info"])}
    for name, code in JDBC_TYPES.items():
        assert types[name] == code


def test_statements_equal_node_sql(node: Node, probe: dict[str, Any]) -> None:
    everything = node_rows(node, "SELECT * FROM ck")
    assert sorted(jdbc_rows(probe["select_all"], everything)) == sorted(everything)
    # a PreparedStatement with setString: sent as a bound varchar parameter
    eu = node_rows(node, "SELECT * FROM ck WHERE region = 'eu'")
    assert len(eu) > 1
    assert sorted(jdbc_rows(probe["lookup"], eu)) == sorted(eu)
    assert probe["lookup_types"] == "region:text,id:int4,amount:numeric,ts:timestamptz"
    totals = node_rows(node, "SELECT count(*) AS n, min(region) AS low FROM ck")
    assert jdbc_rows(probe["aggregate"], totals) == totals
