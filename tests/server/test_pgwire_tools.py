"""pgcli and Superset's catalog reads against a live node.

- **pgcli** 4 (with pgspecial), driven through its own library code on a real connection:
  ``PGExecute`` connects as the shell does (server version, ``SHOW TIME ZONE``), pgcli's
  completion refreshers run every metadata query the shell sends in the background
  (``search_path``, schemata, tables, columns, views, types, databases, functions, foreign
  keys) into a real ``PGCompleter``, whose completions are then asked for; ``\\d``,
  ``\\dt``, ``\\d ck`` and a query go through ``PGExecute.run`` and pgspecial. The
  interactive prompt itself is not driven.
- **Superset** reads a database's tables through SQLAlchemy's inspector; the calls its
  dataset and SQL Lab screens make beyond those of test_pgwire_python_stack.py.

Every answer is compared with the node's schema or ``Node.sql``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from pgcli.completion_refresher import CompletionRefresher
from pgcli.pgcompleter import PGCompleter
from pgcli.pgexecute import PGExecute
from pgspecial.main import PGSpecial
from prompt_toolkit.document import Document

from sparkiq import Node
from tests.sql.tables import build_world

TOKEN = "tools-secret"
CK_TYPES = ["text", "integer", "numeric", "timestamp with time zone"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("tools"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", token=TOKEN, pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


@pytest.fixture(scope="module")
def pgcli(node: Node) -> Iterator[PGExecute]:
    assert node.pg_address is not None
    host, port = node.pg_address
    executor = PGExecute("sparkiq", "analyst", TOKEN, host, port)
    yield executor
    executor.conn.close()


def node_rows(node: Node, sql: str) -> list[tuple[Any, ...]]:
    result = node.sql(sql)
    return [tuple(row[c] for c in result.columns) for row in result.rows]


def run(pgcli: PGExecute, command: str) -> tuple[list[str], list[tuple[Any, ...]], str]:
    """Headers, rows and status of the one result of ``command`` (SQL or a backslash
    command), as the shell gets them."""
    [(_title, cursor, headers, status, *_)] = list(pgcli.run(command, pgspecial=PGSpecial()))
    return list(headers), [tuple(r) for r in cursor], status or ""


def test_pgcli_connects_as_the_shell_does(pgcli: PGExecute) -> None:
    assert pgcli.server_version.startswith("14.0")
    assert pgcli.get_timezone() == "UTC"
    assert pgcli.search_path() == ["pg_catalog", "public"]
    assert not pgcli.is_virtual_database()  # a real server, not pgbouncer's console
    assert pgcli.databases() == ["sparkiq"]


def test_pgcli_completion_metadata(node: Node, pgcli: PGExecute) -> None:
    assert pgcli.schemata() == ["information_schema", "pg_catalog", "public"]
    assert list(pgcli.tables()) == [("public", t) for t in sorted(node.tables)]
    columns = list(pgcli.table_columns())
    assert [(c[1], c[2]) for c in columns] == [
        (t, f.name) for t in sorted(node.tables) for f in node.schema(t).fields
    ]
    assert [c[3] for c in columns if c[1] == "ck"] == CK_TYPES
    # what the node has none of: views, user types and functions, foreign keys
    assert list(pgcli.views()) == [] and list(pgcli.view_columns()) == []
    assert list(pgcli.datatypes()) == []
    assert list(pgcli.functions()) == []
    assert list(pgcli.foreignkeys()) == []


def test_pgcli_completes_tables_and_columns(node: Node, pgcli: PGExecute) -> None:
    completer = PGCompleter(smart_completion=True, pgspecial=PGSpecial())
    for refresh in CompletionRefresher.refreshers.values():  # what \refresh runs
        refresh(completer, pgcli)
    tables = {c.text for c in completer.get_completions(Document("SELECT * FROM "), None)}
    assert set(node.tables) <= tables
    text = "SELECT  FROM ck"
    offered = completer.get_completions(Document(text, cursor_position=len("SELECT ")), None)
    assert {f.name for f in node.schema("ck").fields} <= {c.text for c in offered}


def test_pgcli_backslash_d_and_a_query(node: Node, pgcli: PGExecute) -> None:
    headers, rows, _ = run(pgcli, "\\dt")
    assert headers == ["Schema", "Name", "Type", "Owner"]
    assert rows == [("public", t, "table", "sparkiq") for t in sorted(node.tables)]
    assert run(pgcli, "\\d")[1] == rows
    headers, rows, footer = run(pgcli, "\\d ck")
    assert headers == ["Column", "Type", "Modifiers"]
    schema = node.schema("ck")
    assert [r[0] for r in rows] == [f.name for f in schema.fields]
    assert [r[1] for r in rows] == ["text", "integer", "numeric(10,2)", "timestamp with time zone"]
    assert [r[0] for r in rows if "not null" in r[2]] == list(schema.key_columns)
    assert '"ck_pkey" PRIMARY KEY, btree (region, id)' in footer
    query = "SELECT region, sum(amount) AS total FROM ck GROUP BY region ORDER BY region"
    headers, rows, status = run(pgcli, query)
    assert headers == ["region", "total"]
    assert rows == node_rows(node, query)
    assert status == f"SELECT {len(rows)}"


def test_superset_inspector_calls(node: Node) -> None:
    assert node.pg_address is not None
    host, port = node.pg_address
    engine = sa.create_engine(f"postgresql+psycopg://analyst:{TOKEN}@{host}:{port}/sparkiq")
    try:
        inspector = sa.inspect(engine)
        assert inspector.get_schema_names() == ["information_schema", "public"]
        assert inspector.has_table("ck") and not inspector.has_table("nope")
        assert inspector.get_view_names() == []
        assert inspector.get_materialized_view_names() == []
        for table in node.tables:
            # the primary key's index is the only one, and get_indexes leaves it out
            assert inspector.get_indexes(table) == []
            assert inspector.get_foreign_keys(table) == []
            assert inspector.get_unique_constraints(table) == []
            assert inspector.get_check_constraints(table) == []
            assert inspector.get_table_comment(table) == {"text": None}
            schema = node.schema(table)  # a windowed table's rows are keyed by their window too
            window = [schema.window_column] if schema.window_column else []
            key = inspector.get_pk_constraint(table)
            assert key["constrained_columns"] == [*schema.key_columns, *window]
    finally:
        engine.dispose()


def test_array_literals_and_parameters_in_catalog_queries(node: Node) -> None:
    """The array spellings tools send (arrays.py): typed, untyped in ANY, quoted elements
    and NULL, and a list bound as a parameter."""
    assert node.pg_address is not None
    host, port = node.pg_address
    dsn = f"host={host} port={port} user=analyst password={TOKEN} dbname=sparkiq"
    query = "SELECT relname FROM pg_catalog.pg_class WHERE relname = ANY({}) ORDER BY 1"
    with psycopg.connect(dsn, autocommit=True) as cursor:
        for array in ("""'{ck,"t",NULL,"no,pe"}'::text[]""", "'{ck, t}'", "ARRAY['ck', 't']"):
            assert cursor.execute(query.format(array)).fetchall() == [("ck",), ("t",)], array
        assert cursor.execute(query.format("%s"), [["t", "ck", "x"]]).fetchall() == [
            ("ck",),
            ("t",),
        ]
        assert cursor.execute(query.format("'{}'::text[]")).fetchall() == []
