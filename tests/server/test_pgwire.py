"""The Postgres wire protocol endpoint, through real clients: psycopg 3 and Debian's psql.

Every tier 0-4 statement of the differential suite runs through psycopg (text and binary
results) and must give the rows ``Node.sql`` gives on the same node.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
import scramp
from pygwire import FrontendConnection
from pygwire import messages as m

from sparkiq import Node
from sparkiq.schema.kinds import KINDS
from sparkiq.server.pg.types import TYPE_OIDS
from sparkiq.sql import SqlEngine, SqlLimits
from sparkiq.wire.jsonapi import dumps
from tests.sql.tables import build_world
from tests.sql.test_differential import QUERIES

TOKEN = "pg-secret"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("pgworld"))
    build_world(root)
    with Node(root, store="memory", node_id="pg", token=TOKEN, pg_listen="127.0.0.1:0") as n:
        n.poll_once()
        yield n


def _dsn(node: Node, password: str = TOKEN) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    return f"host={host} port={port} user=tester dbname=sparkiq password={password}"


@pytest.fixture(scope="module")
def conn(node: Node) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(_dsn(node), autocommit=True) as c:
        yield c


def _normal(value: Any) -> Any:
    """A value as both sides can be compared: aware datetimes as naive local time (what
    PySpark gives), nested values as their JSON, floats to 12 significant digits (DuckDB's
    parallel aggregates differ in the last bits from one run to the next)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone().replace(tzinfo=None)
    if isinstance(value, dict | list):
        return json.loads(dumps(value))
    return value


def _rows(rows: list[tuple[Any, ...]], ordered: bool) -> list[tuple[Any, ...]]:
    out = [tuple(_normal(v) for v in row) for row in rows]
    return out if ordered else sorted(out, key=repr)


@pytest.mark.parametrize(("sql", "ordered"), QUERIES, ids=[q for q, _ in QUERIES])
def test_psycopg_gets_the_rows_node_sql_gives(
    node: Node, conn: psycopg.Connection[Any], sql: str, ordered: bool
) -> None:
    expected = node.sql(sql)
    cursor = conn.execute(sql)
    assert cursor.description is not None
    assert [d.name for d in cursor.description] == expected.columns
    assert _rows(cursor.fetchall(), ordered) == _rows(expected.tuples(), ordered)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM ck ORDER BY region, id LIMIT 20",
        "SELECT * FROM w ORDER BY k LIMIT 20",
        "SELECT * FROM xk ORDER BY key",
        "SELECT * FROM tk ORDER BY key LIMIT 5",
        "SELECT count(*), sum(n), avg(n) FROM t",
    ],
)
def test_binary_results_equal_text_results(conn: psycopg.Connection[Any], sql: str) -> None:
    text = conn.execute(sql).fetchall()
    binary = conn.cursor(binary=True).execute(sql).fetchall()
    assert binary == text
    assert text  # the statements return rows


def test_type_oids_follow_the_kinds_table(conn: psycopg.Connection[Any]) -> None:
    cursor = conn.execute("SELECT * FROM ck LIMIT 1")
    assert cursor.description is not None
    oids = {d.name: d.type_code for d in cursor.description}
    assert oids == {"region": 25, "id": 23, "amount": 1700, "ts": 1184}
    cursor = conn.execute("SELECT * FROM w LIMIT 1")
    assert cursor.description is not None
    oids = {d.name: d.type_code for d in cursor.description}
    assert oids == {"k": 25, "n": 20, "tag": 25, "price": 701, "day": 1082, "info": 114}
    cursor = conn.execute(
        "SELECT count(*) AS c, max(price) AS p, upper(tag) AS u FROM w GROUP BY 3"
    )
    assert cursor.description is not None
    assert [d.type_code for d in cursor.description] == [20, 701, 25]
    expected = {
        "string": "text",
        "long": "int8",
        "integer": "int4",
        "short": "int2",
        "byte": "int2",
        "double": "float8",
        "float": "float4",
        "boolean": "bool",
        "date": "date",
        "timestamp": "timestamptz",
        "timestamp_ntz": "timestamp",
        "decimal": "numeric",
        "binary": "bytea",
        "struct": "json",
        "array": "json",
        "map": "json",
    }
    assert {name: KINDS[name].pg for name in expected} == expected
    for kind in KINDS.values():
        assert TYPE_OIDS[kind.pg] == kind.pg_oid, kind.name


def test_parameters_are_bound_as_literals(conn: psycopg.Connection[Any], node: Node) -> None:
    assert conn.execute("SELECT * FROM t WHERE k = %s", ["k006"]).fetchall() == [("k006", 60)]
    rows = conn.execute("SELECT key, v FROM ik WHERE key = %s", [-47]).fetchall()
    assert rows == node.sql("SELECT key, v FROM ik WHERE key = -47").tuples()
    rows = conn.execute("SELECT k FROM t WHERE k = %s", ["it's; $1"]).fetchall()
    assert rows == []


@pytest.mark.parametrize(
    ("sql", "sqlstate"),
    [
        ("SELEC * FROM t", "42601"),
        ("SELECT * FROM nope", "42P01"),
        ("SELECT nope FROM t", "42703"),
        ("DELETE FROM t WHERE k = 'k001'", "42501"),
        ("SELECT * FROM t", "54000"),  # over SqlLimits.max_result_rows (set below)
    ],
)
def test_errors_carry_sqlstate_and_the_connection_stays_usable(
    node: Node, sql: str, sqlstate: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # this node's engine, with a smaller row limit (the limits are fixed when it is made)
    monkeypatch.setattr(node, "_sql", SqlEngine(node._lookup, SqlLimits(max_result_rows=10)))
    try:
        with psycopg.connect(_dsn(node), autocommit=True) as c:
            with pytest.raises(psycopg.Error) as caught:
                c.execute(sql)
            assert caught.value.sqlstate == sqlstate
            assert c.execute("SELECT n FROM t WHERE k = 'k005'").fetchall() == [(5,)]
            with pytest.raises(psycopg.Error):  # the simple protocol too
                c.cursor().execute(sql, prepare=False)
            assert c.execute("SELECT 1 AS one").fetchall() == [(1,)]
        with psycopg.connect(_dsn(node)) as c:  # in a transaction, as psycopg's default
            with pytest.raises(psycopg.Error):
                c.execute(sql)
            c.rollback()
            assert c.execute("SELECT n FROM t WHERE k = 'k006'").fetchall() == [(60,)]
    finally:
        node._sql = None


def _raw_startup(node: Node, password: str) -> dict[str, str]:
    """The ErrorResponse fields a raw client gets for ``password`` (or {} on success); it
    logs in with SCRAM-SHA-256 (``scramp``'s client, which checks the server's signature)
    and would send no password in clear text."""
    assert node.pg_address is not None
    sock = socket.create_connection(node.pg_address, timeout=10)
    client = FrontendConnection()
    scram: scramp.ScramClient | None = None
    try:
        sock.sendall(client.send(m.StartupMessage(params={"user": "raw", "database": "x"})))
        while True:
            data = sock.recv(65536)
            assert data, "the server closed the connection without an answer"
            for msg in client.receive(data):
                assert not isinstance(msg, m.AuthenticationCleartextPassword)
                if isinstance(msg, m.AuthenticationSASL):
                    assert msg.mechanisms == ["SCRAM-SHA-256"]
                    scram = scramp.ScramClient(msg.mechanisms, "raw", password)
                    first = scram.get_client_first().encode()
                    sock.sendall(client.send(m.SASLInitialResponse("SCRAM-SHA-256", first)))
                elif isinstance(msg, m.AuthenticationSASLContinue):
                    assert scram is not None
                    scram.set_server_first(bytes(msg.data).decode())
                    sock.sendall(client.send(m.SASLResponse(scram.get_client_final().encode())))
                elif isinstance(msg, m.AuthenticationSASLFinal):
                    assert scram is not None
                    scram.set_server_final(bytes(msg.data).decode())  # raises if forged
                elif isinstance(msg, m.ErrorResponse):
                    return dict(msg.fields)
                elif isinstance(msg, m.ReadyForQuery):
                    return {}
    finally:
        sock.close()


def test_the_password_is_the_node_token_proven_with_scram(node: Node) -> None:
    fields = _raw_startup(node, "wrong")
    assert fields["C"] == "28P01"
    assert fields["S"] == "FATAL"
    assert _raw_startup(node, TOKEN) == {}
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(_dsn(node, "wrong"))


def test_session_statements_and_version(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SET application_name = 'grafana'")
    conn.execute("SET DateStyle TO ISO")
    conn.execute("SET extra_float_digits = 3")
    assert conn.execute("SHOW application_name").fetchall() == [("grafana",)]
    assert conn.execute("SHOW server_version").fetchone()[0].startswith("14.0")  # type: ignore[index]
    version = conn.execute("SELECT version()").fetchall()
    assert version[0][0].startswith("PostgreSQL 14.0 (sparkiq")
    tables = conn.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1"
    ).fetchall()
    assert [t for (t,) in tables] == ["ck", "dk", "ik", "lk", "t", "tk", "w", "win", "xk"]
    columns = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'ck' "
        "ORDER BY ordinal_position"
    ).fetchall()
    assert [c for (c,) in columns] == ["region", "id", "amount", "ts"]


def _psql(node: Node, command: str, password: str = TOKEN) -> subprocess.CompletedProcess[str]:
    assert node.pg_address is not None
    host, port = node.pg_address
    env = dict(os.environ, PGPASSWORD=password, PGCONNECT_TIMEOUT="10")
    return subprocess.run(
        [
            *("psql", "-X", "-h", host, "-p", str(port), "-U", "tester", "-d", "sparkiq"),
            *("-A", "-F", "|", "-c", command),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


psql_needed = pytest.mark.skipif(
    shutil.which("psql") is None, reason="psql (Debian's postgresql-client) is not installed"
)


@psql_needed
def test_psql_runs_queries_and_lists_tables_and_columns(node: Node) -> None:
    done = _psql(node, "SELECT k, n FROM t WHERE k IN ('k001', 'k002') ORDER BY k")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["k|n", "k001|1", "k002|2", "(2 rows)"]
    done = _psql(node, "\\dt")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == "Schema|Name|Type|Owner"
    assert "public|ck|table|sparkiq" in lines
    assert "public|win|table|sparkiq" in lines
    done = _psql(node, "\\d ck")
    assert done.returncode == 0, done.stderr
    columns = [line.split("|")[:2] for line in done.stdout.splitlines()[2:6]]
    assert columns == [
        ["region", "text"],
        ["id", "integer"],
        ["amount", "numeric(10,2)"],
        ["ts", "timestamp with time zone"],
    ]


@psql_needed
def test_psql_errors_and_wrong_password(node: Node) -> None:
    done = _psql(node, "SELECT nope FROM t")
    assert done.returncode == 1
    assert "unknown column 'nope'" in done.stderr
    done = _psql(node, "SELECT 1 AS x", password="wrong")
    assert done.returncode == 2
    assert "password authentication failed" in done.stderr


def test_stop_closes_the_endpoint(tmp_path: Any) -> None:
    build_world(str(tmp_path))
    node = Node(str(tmp_path), store="memory", pg_listen="127.0.0.1:0").start()
    node.poll_once()
    assert node.pg_address is not None
    address = node.pg_address
    with psycopg.connect(f"host={address[0]} port={address[1]} user=u dbname=d") as c:
        assert c.execute("SELECT n FROM t WHERE k = 'k005'").fetchall() == [(5,)]
        node.stop()
        with pytest.raises(psycopg.OperationalError):
            c.execute("SELECT 1")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"host={address[0]} port={address[1]} user=u dbname=d", connect_timeout=5)


def test_numeric_values_of_every_scale_survive_binary(conn: psycopg.Connection[Any]) -> None:
    rows = conn.cursor(binary=True).execute("SELECT * FROM xk ORDER BY key").fetchall()
    text_rows = conn.execute("SELECT * FROM xk ORDER BY key").fetchall()
    assert rows == text_rows
    assert all(isinstance(key, Decimal) for key, _ in rows)


def test_prepared_statements_are_reused(conn: psycopg.Connection[Any], node: Node) -> None:
    # psycopg prepares a statement (a named Parse, then Bind/Execute only) from its 5th run.
    for i in range(1, 12):
        key = f"k{i:03d}"
        rows = conn.execute("SELECT k, n FROM t WHERE k = %s", [key]).fetchall()
        assert rows == node.sql(f"SELECT k, n FROM t WHERE k = '{key}'").tuples()
    assert conn.execute("SELECT k, n FROM t WHERE k = %s", ["k001"], prepare=True).fetchall() == [
        ("k001", 1)
    ]


def _frames(data: bytes) -> list[tuple[bytes, bytes]]:
    """The whole backend messages in ``data``: ``(identifier, payload)`` each."""
    out, pos = [], 0
    while pos + 5 <= len(data):
        (length,) = struct.unpack_from("!i", data, pos + 1)
        if pos + 1 + length > len(data):
            break
        out.append((data[pos : pos + 1], data[pos + 5 : pos + 1 + length]))
        pos += 1 + length
    return out


def _until(sock: socket.socket, ident: bytes) -> bytes:
    """Read until a whole message ``ident`` arrived; its payload."""
    data = b""
    while True:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection before a {ident!r} message"
        data += chunk
        for found, payload in _frames(data):
            if found == ident:
                return payload


def _raw_login(node: Node, then: bytes, receive_buffer: int = 0) -> socket.socket:
    """A socket logged in with SCRAM by hand, ``then`` sent in the packet of the proof
    (``receive_buffer``: the socket's SO_RCVBUF, set before it connects; 0: the default)."""
    assert node.pg_address is not None
    scram = scramp.ScramClient(["SCRAM-SHA-256"], "raw", TOKEN)
    sock = socket.socket()
    if receive_buffer:  # a small window: the node's writes stop short of the whole answer
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(30)
    sock.connect(node.pg_address)
    sock.sendall(m.StartupMessage(params={"user": "raw", "database": "x"}).to_wire())
    _until(sock, b"R")  # AuthenticationSASL
    first = scram.get_client_first().encode()
    sock.sendall(m.SASLInitialResponse("SCRAM-SHA-256", first).to_wire())
    scram.set_server_first(_until(sock, b"R")[4:].decode())
    sock.sendall(m.SASLResponse(scram.get_client_final().encode()).to_wire() + then)
    return sock


@pytest.mark.parametrize(
    "bad",
    [
        b"Y\x00\x00\x00\x04",  # no such message
        b"B\x00\x00\x00\x08p\x00s\x00",  # a Bind cut short after its names
        # a Bind whose one value claims 9 bytes where 2 follow
        b"B\x00\x00\x00\x15\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09ab\x00\x00\x00\x00\x00",
    ],
    ids=["unknown", "short-bind", "overlong-value"],
)
def test_messages_sent_along_with_the_last_login_message_are_answered(
    node: Node, bad: bytes
) -> None:
    """A client may send its first query in the same packet as its SCRAM proof: the node
    answers it after the login, in order; a message no client sends, or one that is not
    what its identifier says, ends the connection with 08P01 (after the answers to what
    came before it)."""
    with _raw_login(node, m.Query("SELECT k, n FROM t WHERE k = 'k002'").to_wire() + bad) as sock:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    frames = _frames(data)
    kinds = b"".join(ident for ident, _ in frames if ident not in (b"S", b"R", b"K"))
    assert kinds == b"ZTDCZE", frames
    row = frames[[ident for ident, _ in frames].index(b"D")][1]
    assert row == b"\x00\x02\x00\x00\x00\x04k002\x00\x00\x00\x012"
    assert b"C08P01\x00" in frames[-1][1]


def test_a_client_that_pipelines_lookups_and_reads_late_gets_every_answer_in_order(
    node: Node,
) -> None:
    """Thousands of prepared lookups of 40 keys each sent in a stream while the client does
    not read yet: the node's answers outgrow the socket buffers (the reactor then hands the
    connection to its thread, pg/parking.py), and every answer arrives, in order, with the
    rows ``node.sql`` gives; then a statement DuckDB runs, and lookups again."""
    present = [k for (k,) in node.sql("SELECT k FROM t ORDER BY k LIMIT 40").tuples()]
    marks = ", ".join(f"${i + 1}" for i in range(len(present)))
    text = f"SELECT k, n FROM t WHERE k IN ({marks})"
    literals = ", ".join(f"'{k}'" for k in present)
    expected = [
        tuple(None if v is None else str(v) for v in row)
        for row in node.sql(f"SELECT k, n FROM t WHERE k IN ({literals})").tuples()
    ]
    assert len(expected) == len(present)
    parse = m.Parse("get", text, [25] * len(present)).to_wire()
    values = [k.encode() for k in present]
    lookup = (
        m.Bind("", "get", [0], values, [0]).to_wire()
        + m.Execute("", 0).to_wire()
        + m.Sync().to_wire()
    )
    rounds = 600
    scan = m.Query("SELECT count(*) AS c FROM t WHERE n > 0").to_wire()
    stream = lookup * rounds + scan + lookup * 5
    with _raw_login(node, parse + m.Sync().to_wire(), receive_buffer=4096) as sock:
        data = b""
        while sum(1 for ident, _ in _frames(data) if ident == b"Z") < 2:  # login, Parse
            data += sock.recv(65536)
        assert b"E" not in {ident for ident, _ in _frames(data)}
        time.sleep(0.2)  # the connection, idle, is parked with the reactor
        sender = threading.Thread(target=sock.sendall, args=(stream,))
        sender.start()
        time.sleep(1.0)  # the node writes until the small window and its buffer are full
        data = b""
        want = rounds + 1 + 5  # a ReadyForQuery per round and for the scan
        while sum(1 for ident, _ in _frames(data) if ident == b"Z") < want:
            chunk = sock.recv(1 << 20)
            assert chunk, "the node closed the connection"
            data += chunk
        sender.join()
    frames = _frames(data)
    assert b"E" not in {ident for ident, _ in frames}
    tags = [payload for ident, payload in frames if ident == b"C"]
    assert tags == [b"SELECT 40\x00"] * rounds + [b"SELECT 1\x00"] + [b"SELECT 40\x00"] * 5
    got = [_data_row(payload) for ident, payload in frames if ident == b"D"]
    (count,) = node.sql("SELECT count(*) AS c FROM t WHERE n > 0").tuples()[0]
    assert got == expected * rounds + [(str(count),)] + expected * 5


def _data_row(payload: bytes) -> tuple[str | None, ...]:
    (count,) = struct.unpack_from("!h", payload)
    pos, values = 2, []
    for _ in range(count):
        (size,) = struct.unpack_from("!i", payload, pos)
        pos += 4
        values.append(None if size < 0 else payload[pos : pos + size].decode())
        pos += max(size, 0)
    return tuple(values)


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_results_of_hundreds_of_rows_arrive_whole(node: Node, prepare: bool) -> None:
    """Rows are sent in batches of 256 messages (a cancel request is looked at between
    them): every batch arrives, in order."""
    sql = "SELECT a.k AS ak, b.k AS bk FROM t a CROSS JOIN t b ORDER BY ak, bk LIMIT 700"
    expected = node.sql(sql).tuples()
    assert len(expected) == 700
    with psycopg.connect(_dsn(node), autocommit=True) as conn:
        if prepare:
            rows = conn.execute(sql, prepare=True).fetchall()
        else:
            rows = psycopg.ClientCursor(conn).execute(sql).fetchall()
    assert rows == expected
