"""Errors and column names in the user's words, through every door of a real node: ``Node.sql``,
``POST /query``, :class:`~sparkiq.Client` and the Postgres endpoint (psycopg). Column names are
checked against a real Postgres server given the same statements, where one is installed."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from sparkiq import Client, InvalidQueryError, Node
from sparkiq.server.scrub import roots_of, scrub
from sparkiq.sql import SqlError, SqlUnsupportedError
from sparkiq.testing import wait_until
from tests import forked_python, http_calls
from tests.server.serve_subprocess import serving
from tests.sql.tables import build_world

TOKEN = "words-secret"
# What DuckDB says and a user did not write: never in a message
LEAKS = ("Error:", "INT32", "INT64", "Unimplemented", "Binder", "Conversion", "<", "__sq")

# (statement, error code, words the message must hold, the column the caret points at)
ERRORS = [
    ("SELCT * FROM t", "syntax", "syntax error at 'SELCT': did you mean SELECT?", 1),
    ("SELECT * FORM t", "syntax", "syntax error at 'FORM': did you mean FROM?", 10),
    ("SELECT k::int FROM t", "invalid_value", "column k holds 'k", 8),
    ("SELECT * FROM t WHERE k = 5", "invalid_value", "TRY_CAST(k AS INTEGER)", 23),
    ("SELECT * FROM t WHERE n = 'abc'", "invalid_value", "'abc' is not a bigint", None),
    ("SELECT CAST(n AS STRUCT(a INT)) FROM t", "impossible_cast", "column n (bigint)", 13),
    ("SELECT 2147483648::int", "out_of_range", "out of range for integer", None),
    ("SELECT k + 1 FROM t", "type_mismatch", "operator + cannot take (string, integer)", None),
    ("SELECT upper(n) FROM t", "type_mismatch", "function upper() cannot take (bigint)", 8),
    ("SELECT CAST('x' AS DATE)", "invalid_value", "write dates as 'YYYY-MM-DD'", None),
    ("INSERT INTO t VALUES ('a', 1)", "forbidden_statement", "INSERT statements are not", None),
]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("words"))
    build_world(root)
    with Node(
        root,
        store="memory",
        node_id="words",
        token=TOKEN,
        listen="127.0.0.1:0",
        pg_listen="127.0.0.1:0",
    ) as started:
        started.poll_once()
        yield started


@pytest.fixture(scope="module")
def pg(node: Node) -> Iterator[psycopg.Connection[Any]]:
    assert node.pg_address is not None
    host, port = node.pg_address
    dsn = f"host={host} port={port} user=tester dbname=sparkiq password={TOKEN}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture(scope="module")
def client(node: Node) -> Iterator[Client]:
    assert node.url is not None
    with Client(node.url, token=TOKEN) as opened:
        yield opened


def _plain(message: str) -> str:
    """``message`` without the key it quotes: which row's value fails a cast first depends
    on DuckDB's threads."""
    return re.sub(r"'k\d+'", "'k...'", message)


def _rest(node: Node, doc: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {TOKEN}"}
    return http_calls.post(f"{node.url}/query", json=doc, headers=headers, timeout=30)


@pytest.mark.parametrize(("sql", "code", "words", "column"), ERRORS, ids=[e[0] for e in ERRORS])
def test_sql_errors_are_in_the_users_words_through_every_door(
    node: Node,
    client: Client,
    pg: psycopg.Connection[Any],
    sql: str,
    code: str,
    words: str,
    column: int | None,
) -> None:
    with pytest.raises(SqlError) as caught:
        node.sql(sql)
    error = caught.value
    assert error.code == code, error
    assert words in error.message, error.message
    assert not any(leak in error.message for leak in LEAKS), error.message
    if column is not None:
        assert (error.line, error.column) == (1, column), error
        assert error.snippet == f"{sql}\n{' ' * (column - 1)}^"

    answer = _rest(node, {"sql": sql})
    assert answer.status_code == 400, answer.text
    body = answer.json()["error"]
    assert (body["code"], body.get("column")) == (code, column)
    assert _plain(body["message"]) == _plain(error.message)

    with pytest.raises(InvalidQueryError) as remote:
        client.sql(sql)
    assert _plain(remote.value.message) == _plain(error.message)

    with pytest.raises(psycopg.Error) as through_pg:
        pg.execute(sql)
    primary = through_pg.value.diag.message_primary or ""
    assert _plain(error.message).split(":")[0] in _plain(primary), primary
    assert not any(leak in primary for leak in LEAKS), primary


# statement -> the names Postgres gives its columns (checked against a real server below)
NAMES = {
    "SELECT count(*) FROM t": ["count"],
    "SELECT sum(n), max(n) AS top FROM t": ["sum", "top"],
    "SELECT n::int, upper(k) FROM t WHERE k = 'k003'": ["n", "upper"],
    "SELECT CAST(n AS INTEGER), 1, n + 1 FROM t WHERE k = 'k003'": ["n", "?column?", "?column?_1"],
    "SELECT k, count(*), count(n) FROM t GROUP BY k ORDER BY k LIMIT 1": ["k", "count", "count_1"],
    "SELECT * FROM (SELECT count(*) FROM t) AS s": ["count"],
    "SELECT s.*, 1 FROM (SELECT k, count(*) FROM t GROUP BY k) AS s ORDER BY k LIMIT 1": [
        "k",
        "count",
        "?column?",
    ],
    "SELECT CASE WHEN n > 1 THEN 'big' END, '1'::int, substr(k, 1, 2) FROM t ORDER BY k LIMIT 1": [
        "case",
        "int4",
        "substr",
    ],
}


def test_expressions_get_the_column_names_postgres_gives(
    node: Node, client: Client, pg: psycopg.Connection[Any]
) -> None:
    for sql, names in NAMES.items():
        local = node.sql(sql)
        assert local.columns == names, sql
        assert client.sql(sql).columns == names, sql
        assert client.sql(sql, format="arrow").to_arrow().column_names == names, sql
        cursor = pg.execute(sql)
        assert cursor.description is not None
        assert [d.name for d in cursor.description] == names, sql
        assert [tuple(r[c] for c in names) for r in local.rows] == cursor.fetchall(), sql


@pytest.fixture(scope="module")
def postgres() -> Iterator[psycopg.Connection[Any]]:
    """A real Postgres server (Debian's, if installed) with table ``t`` as the world's."""
    initdb, server = shutil.which("initdb"), shutil.which("postgres")
    if initdb is None or server is None:
        pytest.skip("needs a Postgres server (initdb, postgres)")
    # not under pytest's temporary root: that is private to this user, and Postgres may not
    # run as it
    root = Path(tempfile.mkdtemp(prefix="sparkiq-postgres-"))
    # Postgres refuses to run as root: as root, run it as nobody
    prefix = ["runuser", "-u", "nobody", "--"] if os.geteuid() == 0 else []
    if prefix:
        shutil.chown(root, "nobody")
    data = Path(root) / "data"
    subprocess.run(
        [*prefix, initdb, "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [server, "-D", str(data), "-k", str(root), "-c", "listen_addresses=", "-p", str(port)]
    process = subprocess.Popen([*prefix, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = psycopg.connect(
                    host=str(root), port=port, user="postgres", dbname="postgres", autocommit=True
                )
                break
            except psycopg.OperationalError:
                assert process.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        with conn:
            conn.execute("CREATE TABLE t (k text PRIMARY KEY, n bigint)")
            conn.execute("INSERT INTO t VALUES ('k003', 3)")
            yield conn
    finally:
        process.terminate()
        process.wait(timeout=60)
        shutil.rmtree(root, ignore_errors=True)


def test_the_names_are_the_ones_a_real_postgres_gives(
    postgres: psycopg.Connection[Any],
) -> None:
    for sql, names in NAMES.items():
        cursor = postgres.execute(sql)
        assert cursor.description is not None
        # Postgres repeats a name; rows of dicts cannot: the second gets a suffix here
        expected = [n.rsplit("_", 1)[0] if n.endswith("_1") else n for n in names]
        assert [d.name for d in cursor.description] == expected, sql


def test_client_sql_refuses_a_push_query_as_node_sql_does(node: Node, client: Client) -> None:
    sql = "SELECT * FROM t WHERE n > 1 EMIT CHANGES"
    with pytest.raises(SqlUnsupportedError) as local:
        node.sql(sql)
    started = time.monotonic()
    with pytest.raises(SqlUnsupportedError) as remote:
        client.sql(sql)  # before: a push stream, read forever
    assert time.monotonic() - started < 30
    assert (remote.value.code, remote.value.message) == (local.value.code, local.value.message)
    assert "stream()" in remote.value.message


def test_a_windowed_lookup_names_the_sql_and_rest_body_to_use(node: Node) -> None:
    headers = {"authorization": f"Bearer {TOKEN}"}
    answer = http_calls.get(f"{node.url}/stores/win/keys/a", headers=headers, timeout=30)
    assert answer.status_code == 400
    message = answer.json()["error"]["message"]
    sql = "SELECT * FROM win WHERE k = 'a'"
    assert sql in message and "WindowKeyQuery" not in message.split("; in Python")[0]
    body = {"query": {"type": "window_key", "key": "a", "from": None, "to": None}}
    assert 'POST /stores/win/query with {"query": {"type": "window_key", "key": "a"' in message
    # and both forms it names work
    assert node.sql(sql).rows == [r for r in node.sql("SELECT * FROM win").rows if r["k"] == "a"]
    done = http_calls.post(f"{node.url}/stores/win/query", json=body, headers=headers, timeout=30)
    assert done.status_code == 200, done.text


def test_serving_a_state_dir_without_tables_warns_at_start_and_in_readyz(
    tmp_path: Path,
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    typo = tmp_path / "stat"  # the tables are in "state"
    url = f"http://127.0.0.1:{port}"

    def up(_: forked_python.Process) -> bool:
        return http_calls.get(f"{url}/readyz", timeout=5).status_code in (200, 503)

    args = ["--state-dir", str(typo), "--listen", f"127.0.0.1:{port}"]
    warning = f"no tables are served: state_dir {str(typo)!r} holds no materialized table"
    logged = lambda: f"WARNING sparkiq.serve {warning}" in (tmp_path / "node.log").read_text()  # noqa: E731
    with serving(args, tmp_path, up, errors=(httpx.HTTPError,)):
        ready = http_calls.get(f"{url}/readyz", timeout=30).json()
        # logged once the node has started, which is after its server answers /readyz
        wait_until(logged, 60, "sparkiq serve did not warn that it serves no table")
    # /readyz answers without a token: it says so without the path
    assert ready["warning"].startswith("no tables are served: its state_dir holds no")
    assert str(typo) not in ready["warning"]


def test_a_relative_state_dir_does_not_eat_the_words_of_messages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The REST API removes the state_dir's paths from messages; given as "state", it also
    # removed the word "statements" (the user saw "INSERT <path> are not allowed")
    monkeypatch.chdir(tmp_path)
    build_world("state")
    with Node("state", store="memory", node_id="rel", listen="127.0.0.1:0") as node:
        node.poll_once()
        answer = http_calls.post(
            f"{node.url}/query", json={"sql": "INSERT INTO t VALUES ('a', 1)"}, timeout=30
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("INSERT statements are not allowed")
    # paths under it still go
    roots = roots_of("state")
    assert scrub("cannot read state/tables/t/table.json", roots) == "cannot read <path>"
    assert scrub(f"cannot read {tmp_path}/state/x", roots) == "cannot read <path>"
