"""The Python data stack over the Postgres endpoint: SQLAlchemy 2, pandas and polars.

Each connects as its users do (an engine from a URL, ``inspect()``, ``text()`` with bound
parameters, ``read_sql``/``read_database``), and every answer is compared with ``Node.sql``
on the same node. Also the statements they send before any query: multi-word ``SHOW``
forms, savepoints, and the ``SHOW TABLES``/``DESCRIBE`` a person types.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import polars as pl
import psycopg
import pytest
import sqlalchemy as sa

from sparkiq import Node
from tests.sql.tables import build_world

TOKEN = "stack-secret"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("stack"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", token=TOKEN, pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


def url(node: Node) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    return f"postgresql+psycopg://analyst:{TOKEN}@{host}:{port}/sparkiq"


@pytest.fixture(scope="module")
def engine(node: Node) -> Iterator[sa.Engine]:
    engine = sa.create_engine(url(node))
    yield engine
    engine.dispose()


def rows_of(node: Node, sql: str) -> list[tuple[Any, ...]]:
    result = node.sql(sql)
    return [tuple(row[c] for c in result.columns) for row in result.rows]


def test_sqlalchemy_connects_and_binds_parameters(node: Node, engine: sa.Engine) -> None:
    with engine.connect() as connection:
        got = connection.execute(
            sa.text("SELECT k, n FROM t WHERE n >= :low ORDER BY k"), {"low": 3}
        ).all()
        with connection.begin_nested():  # a SAVEPOINT, as ORMs and psycopg's blocks send
            total = connection.execute(sa.text("SELECT sum(n) FROM t")).scalar_one()
    assert [tuple(r) for r in got] == rows_of(node, "SELECT k, n FROM t WHERE n >= 3 ORDER BY k")
    assert total == rows_of(node, "SELECT sum(n) FROM t")[0][0]


def test_sqlalchemy_inspects_tables_columns_and_primary_keys(node: Node, engine: sa.Engine) -> None:
    inspector = sa.inspect(engine)
    assert sorted(inspector.get_table_names()) == sorted(node.tables)
    for table in ("t", "ck"):
        schema = node.schema(table)
        columns = inspector.get_columns(table)
        assert [c["name"] for c in columns] == [f.name for f in schema.fields]
        assert {c["name"] for c in columns if not c["nullable"]} == set(schema.key_columns)
        key = inspector.get_pk_constraint(table)
        assert key["constrained_columns"] == list(schema.key_columns)
        assert key["name"] == f"{table}_pkey"


def test_pandas_and_polars_read_through_an_engine_and_a_url(node: Node, engine: sa.Engine) -> None:
    query = "SELECT k, n FROM t ORDER BY k"
    expected = rows_of(node, query)
    through_engine = pd.read_sql(query, engine)
    assert list(through_engine.itertuples(index=False, name=None)) == expected
    through_url = pd.read_sql(query, url(node))
    assert list(through_url.itertuples(index=False, name=None)) == expected
    frame = pl.read_database(query, engine)
    assert frame.columns == ["k", "n"]
    assert frame.rows() == expected


def test_multi_word_show_describe_and_show_tables(node: Node) -> None:
    assert node.pg_address is not None
    host, port = node.pg_address
    dsn = f"host={host} port={port} user=analyst password={TOKEN} dbname=sparkiq"
    with psycopg.connect(dsn, autocommit=True) as c:
        assert c.execute("SHOW TRANSACTION ISOLATION LEVEL").fetchall() == [("read committed",)]
        assert c.execute("show time zone").fetchall() == [("UTC",)]
        assert c.execute("SHOW TABLES").fetchall() == [(t,) for t in sorted(node.tables)]
        schema = node.schema("ck")
        described = c.execute("DESCRIBE ck").fetchall()
        assert [r[0] for r in described] == [f.name for f in schema.fields]
        assert [r[0] for r in described if r[3] == "PRI"] == list(schema.key_columns)
        assert [r[1] for r in described][:2] == ["text", "integer"]
        assert c.execute("SHOW COLUMNS FROM ck").fetchall() == described
        assert c.execute('DESCRIBE public."ck"').fetchall() == described
        with pytest.raises(psycopg.errors.UndefinedTable, match="SHOW TABLES"):
            c.execute("DESCRIBE nope")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="no_such_thing"):
            c.execute("SHOW no_such_thing")
