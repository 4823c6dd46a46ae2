"""The Postgres endpoint through pg8000 and asyncpg, and cancel requests.

pg8000 speaks the extended protocol with text results and its own type handling; asyncpg
prepares every statement, asks the server for parameter and result types, reads binary
results and runs its type introspection query on ``pg_type`` (``set_type_codec``). Every
tier 0-4 statement of the differential suite must give the rows ``Node.sql`` gives.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import asyncpg
import pg8000.dbapi
import pg8000.native
import psycopg
import pyarrow as pa
import pytest
from pygwire import FrontendConnection
from pygwire import messages as m

from sparkiq import Node
from sparkiq.server.pg.parameters import bind_parameters, parameter_slots
from sparkiq.server.pg.types import describe_columns
from sparkiq.sql.errors import SqlError
from tests.server.test_pgwire import TOKEN, _rows
from tests.sql.tables import build_world
from tests.sql.test_differential import QUERIES


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("pgclients"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", token=TOKEN, pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


def _address(node: Node) -> tuple[str, int]:
    assert node.pg_address is not None
    return node.pg_address


@pytest.fixture(scope="module")
def pg8000_conn(node: Node) -> Iterator[pg8000.native.Connection]:
    host, port = _address(node)
    conn = pg8000.native.Connection("tester", host=host, port=port, password=TOKEN)
    yield conn
    conn.close()


async def _asyncpg(node: Node, password: str = TOKEN) -> asyncpg.Connection:
    host, port = _address(node)
    return await asyncpg.connect(
        host=host, port=port, user="tester", password=password, database="sparkiq"
    )


# -- pg8000 -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("sql", "ordered"), QUERIES, ids=[q for q, _ in QUERIES])
def test_pg8000_gets_the_rows_node_sql_gives(
    node: Node, pg8000_conn: pg8000.native.Connection, sql: str, ordered: bool
) -> None:
    expected = node.sql(sql)
    rows = pg8000_conn.run(sql)
    assert [c["name"] for c in pg8000_conn.columns] == expected.columns
    assert _rows([tuple(r) for r in rows], ordered) == _rows(expected.tuples(), ordered)


def test_pg8000_types_parameters_errors_and_password(
    node: Node, pg8000_conn: pg8000.native.Connection
) -> None:
    rows = pg8000_conn.run("SELECT region, id, amount, ts FROM ck WHERE region = 'eu' AND id = 3")
    assert [c["type_oid"] for c in pg8000_conn.columns] == [25, 23, 1700, 1184]
    expected = node.sql("SELECT region, id, amount, ts FROM ck WHERE region = 'eu' AND id = 3")
    assert _rows([tuple(r) for r in rows], True) == _rows(expected.tuples(), True)
    # pg8000 sends typed parameters (text, int8) through the extended protocol
    assert pg8000_conn.run("SELECT k, n FROM t WHERE k = :k", k="k005") == [["k005", 5]]
    assert pg8000_conn.run("SELECT key, v FROM ik WHERE key = :k", k=-47) == [
        list(r) for r in node.sql("SELECT key, v FROM ik WHERE key = -47").tuples()
    ]
    with pytest.raises(pg8000.native.DatabaseError) as caught:
        pg8000_conn.run("SELECT nope FROM t")
    assert caught.value.args[0]["C"] == "42703"
    assert pg8000_conn.run("SELECT n FROM t WHERE k = 'k006'") == [[60]]
    # the DB-API flavour, in a transaction as DB-API wants
    host, port = _address(node)
    conn = pg8000.dbapi.connect("tester", host=host, port=port, password=TOKEN)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT k, n FROM t WHERE k IN (%s, %s) ORDER BY k", ("k001", "k002"))
        assert cursor.fetchall() == (["k001", 1], ["k002", 2])
        with pytest.raises(pg8000.dbapi.DatabaseError):
            cursor.execute("SELEC 1")
        conn.rollback()
        cursor.execute("SELECT count(*) FROM t")
        assert cursor.fetchone() == [node.sql("SELECT count(*) FROM t").tuples()[0][0]]
    finally:
        conn.close()
    with pytest.raises(pg8000.native.DatabaseError) as refused:
        pg8000.native.Connection("tester", host=host, port=port, password="wrong")
    assert refused.value.args[0]["C"] == "28P01"


# -- asyncpg ----------------------------------------------------------------------------------


def test_asyncpg_gets_the_rows_node_sql_gives(node: Node) -> None:
    async def run() -> list[tuple[str, list[str], list[tuple[Any, ...]], bool]]:
        conn = await _asyncpg(node)
        try:
            # asyncpg hands json over as text unless told how; this runs its type
            # introspection query on the emulated pg_type.
            await conn.set_type_codec(
                "json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
            )
            out = []
            for sql, ordered in QUERIES:
                statement = await conn.prepare(sql)
                names = [a.name for a in statement.get_attributes()]
                out.append((sql, names, [tuple(r) for r in await statement.fetch()], ordered))
            return out
        finally:
            await conn.close()

    for sql, names, rows, ordered in asyncio.run(run()):
        expected = node.sql(sql)
        assert names == expected.columns, sql
        assert _rows(rows, ordered) == _rows(expected.tuples(), ordered), sql


def test_asyncpg_types_prepared_statements_cursors_and_errors(node: Node) -> None:
    async def run() -> None:
        conn = await _asyncpg(node)
        try:
            statement = await conn.prepare("SELECT * FROM ck WHERE region = $1 AND id = $2")
            types = {a.name: (a.type.oid, a.type.name) for a in statement.get_attributes()}
            assert types == {
                "region": (25, "text"),
                "id": (23, "int4"),
                "amount": (1700, "numeric"),
                "ts": (1184, "timestamptz"),
            }
            # parameters compared with a column are described with its type
            assert [t.name for t in statement.get_parameters()] == ["text", "int4"]
            rows = await statement.fetch("eu", 3)
            expected = node.sql("SELECT * FROM ck WHERE region = 'eu' AND id = 3")
            assert _rows([tuple(r) for r in rows], True) == _rows(expected.tuples(), True)
            assert await conn.fetchval("SELECT n FROM t WHERE k = $1", "k006") == 60
            async with conn.transaction():
                keys = [r[0] async for r in conn.cursor("SELECT k FROM t ORDER BY k", prefetch=7)]
            assert keys == [k for (k,) in node.sql("SELECT k FROM t ORDER BY k").tuples()]
            with pytest.raises(asyncpg.PostgresError) as caught:
                await conn.fetch("SELECT * FROM nope")
            assert caught.value.sqlstate == "42P01"
            with pytest.raises(asyncpg.PostgresError) as caught:
                await conn.execute("DROP TABLE t")
            assert caught.value.sqlstate == "42501"
            assert (
                await conn.fetchval("SELECT count(*) FROM t WHERE n > 100")
                == (node.sql("SELECT count(*) FROM t WHERE n > 100").tuples()[0][0])
            )
        finally:
            await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError):
            await _asyncpg(node, "wrong")

    asyncio.run(run())


@pytest.mark.parametrize(
    ("sql", "args", "literal"),
    [
        ("SELECT * FROM ik WHERE key = $1", (-47,), "SELECT * FROM ik WHERE key = -47"),
        (
            "SELECT * FROM lk WHERE key BETWEEN $1 AND $2",
            (-100000000190, 50000000095),
            "SELECT * FROM lk WHERE key BETWEEN -100000000190 AND 50000000095",
        ),
        (
            "SELECT * FROM xk WHERE key IN ($1, $2) OR key = $3",
            (Decimal("1.375"), Decimal("2.25"), Decimal("-12.5")),
            "SELECT * FROM xk WHERE key IN (1.375, 2.25) OR key = -12.5",
        ),
        (
            "SELECT * FROM dk WHERE key >= $1 AND key < $2",
            (dt.date(2024, 2, 1), dt.date(2024, 2, 5)),
            "SELECT * FROM dk WHERE key >= DATE '2024-02-01' AND key < DATE '2024-02-05'",
        ),
        (
            "SELECT * FROM tk WHERE key = $1",
            (dt.datetime(2024, 3, 1, 6, 10).astimezone(),),  # the local time, as an instant
            "SELECT * FROM tk WHERE key = TIMESTAMP '2024-03-01 06:10:00'",
        ),
        (
            "SELECT k, price FROM w WHERE tag = $1 AND price > $2",
            ("red", 30.5),
            "SELECT k, price FROM w WHERE tag = 'red' AND price > 30.5",
        ),
        (
            "SELECT * FROM t ORDER BY k LIMIT $1 OFFSET $2",
            (5, 10),
            "SELECT * FROM t ORDER BY k LIMIT 5 OFFSET 10",
        ),
    ],
)
def test_asyncpg_binary_parameters_of_each_key_type(
    node: Node, sql: str, args: tuple[Any, ...], literal: str
) -> None:
    async def run() -> list[tuple[Any, ...]]:
        conn = await _asyncpg(node)
        try:
            return [tuple(r) for r in await conn.fetch(sql, *args)]
        finally:
            await conn.close()

    expected = node.sql(literal).tuples()
    assert expected  # the statements select rows
    ordered = "ORDER BY" in sql
    assert _rows(asyncio.run(run()), ordered) == _rows(expected, ordered)


# -- cancel requests ----------------------------------------------------------------------


def _wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_cancel_request_cancels_the_running_statement(node: Node) -> None:
    """psql's Ctrl-C: a CancelRequest on a new connection with the session's key. The
    statement is held at the endpoint's statement gate (all its slots taken) so the cancel
    lands while it runs, whatever the machine's speed."""
    pg = node._pg
    assert pg is not None
    host, port = _address(node)
    dsn = f"host={host} port={port} user=tester password={TOKEN} dbname=sparkiq"
    with psycopg.connect(dsn, autocommit=True) as conn:
        gate = pg.answers._running
        slots = 0
        while gate.acquire(blocking=False):
            slots += 1
        outcome: dict[str, Any] = {}

        def query() -> None:
            try:
                outcome["rows"] = conn.execute("SELECT count(*) FROM t").fetchall()
            except psycopg.Error as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=query)
        try:
            thread.start()
            _wait_for(lambda: pg.statements_running == 1, "the statement to start")
            conn.cancel_safe(timeout=10)
        finally:
            for _ in range(slots):
                gate.release()
        thread.join(30)
        assert not thread.is_alive()
        error = outcome.get("error")
        assert isinstance(error, psycopg.errors.QueryCanceled), outcome
        assert error.sqlstate == "57014"
        assert "canceling statement due to user request" in str(error)
        # the connection goes on, and the cancel does not outlive its statement
        assert conn.execute("SELECT n FROM t WHERE k = 'k005'").fetchall() == [(5,)]
        conn.cancel_safe(timeout=10)  # idle: nothing to cancel
        assert conn.execute("SELECT n FROM t WHERE k = 'k006'").fetchall() == [(60,)]
    assert pg.statements_running == 0


def test_a_cancel_request_with_a_wrong_key_changes_nothing(node: Node) -> None:
    host, port = _address(node)
    dsn = f"host={host} port={port} user=tester password={TOKEN} dbname=sparkiq"
    with psycopg.connect(dsn, autocommit=True) as conn:
        process_id = conn.info.backend_pid
        for pid, secret in ((process_id, b"\x00\x00\x00\x00"), (999_999, b"abcd")):
            with socket.create_connection((host, port), timeout=10) as sock:
                client = FrontendConnection()
                sock.sendall(client.send(m.CancelRequest(process_id=pid, secret_key=secret)))
                assert sock.recv(1024) == b""  # answered by closing, as Postgres does
        assert conn.execute("SELECT n FROM t WHERE k = 'k005'").fetchall() == [(5,)]


@pytest.mark.parametrize(
    "value",
    ["0", "0.001", "-12.500", "1375.0001", "12345678901234567890.123456789", "1E+20", "-0.5"],
)
def test_binary_numeric_parameters_read_back_exactly(value: str) -> None:
    number = Decimal(value)
    (column,) = describe_columns(pa.schema([("x", pa.decimal128(38, 9))]))
    encoded = column.encoder(True)(number)  # what a binary client sends
    bound = bind_parameters("SELECT $1", [encoded], [1], [1700])
    literal = bound.removeprefix("SELECT ")
    assert Decimal(literal) == number
    assert "E" not in literal  # a plain SQL number


def test_parameters_bind_in_code_only_from_slots_cut_once() -> None:
    """A prepared statement's text is cut around its ``$n`` once (``parameter_slots``) and
    every Bind fills the cuts: a ``$n`` inside a literal, a quoted identifier or a comment
    stays as written, ``$01`` is ``$1``, a parameter named twice is bound twice."""
    text = "SELECT '$1', \"$2\", $1 /* $2 */, $02 FROM t WHERE a = $1 -- $3"
    slots = parameter_slots(text)
    assert [s for s in slots if not isinstance(s, str)] == [(0, 2), (1, 3), (0, 2)]
    expected = "SELECT '$1', \"$2\", 'it''s' /* $2 */, 7 FROM t WHERE a = 'it''s' -- $3"
    values = [b"it's", b"7"]
    assert bind_parameters(text, values, [], [0, 23], slots=slots) == expected
    assert bind_parameters(text, values, [], [0, 23]) == expected
    with pytest.raises(SqlError, match=r"parameter \$2 has no value"):
        bind_parameters(text, values[:1], [], [0, 23], slots=slots)
