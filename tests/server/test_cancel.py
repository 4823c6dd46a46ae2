"""A statement whose caller left stops: an HTTP client that hangs up on ``/query``, a node that
gives up on a fragment it sent to ``/internal/query`` (a hedged copy that lost), psql's
Ctrl-C. Before, each ran on to the statement timeout, a core busy for nobody.

The node's statement timeout is 300 s and each statement here would run for minutes (a
four-way cross product of ``t`` hashed row by row), so a statement that ends within the
bound below after its caller left was canceled, not timed out, on any machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import psycopg
import pyarrow as pa
import pytest

from sparkiq import Node
from sparkiq.cancel import CancelSignal, cancellable
from sparkiq.query.request import StateQueryRequest
from sparkiq.sql import SqlFragmentQuery
from sparkiq.sql.duck import DuckPool, run
from sparkiq.sql.errors import SqlError, SqlLimitError
from sparkiq.sql.watchdog import statement_counts
from sparkiq.wire import protocol
from tests import http_calls
from tests.cluster.cluster_helpers import start_http_cluster
from tests.sql.planned import plan_ahead
from tests.sql.tables import T_HISTORY, build_world, expected_rows

TOKEN = "cancel-secret"
STATEMENT_TIMEOUT = 300  # seconds: far beyond any bound this file waits
ENDS_WITHIN = 60.0  # seconds from the caller leaving to DuckDB returning, at any load
SLOW = "SELECT sum(hash(a.k || b.k || c.k || d.k)) AS h FROM t a, t b, t c, t d"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp("cancel"))
    build_world(root)
    saved = os.environ.get("SPARKIQ_SQL_TIMEOUT_SECONDS")
    os.environ["SPARKIQ_SQL_TIMEOUT_SECONDS"] = str(STATEMENT_TIMEOUT)  # read by the engine
    try:
        with Node(
            root,
            store="memory",
            node_id="cancel",
            token=TOKEN,
            listen="127.0.0.1:0",
            pg_listen="127.0.0.1:0",
        ) as n:
            n.poll_once()
            plan_ahead(n, SLOW)
            yield n
    finally:
        if saved is None:
            os.environ.pop("SPARKIQ_SQL_TIMEOUT_SECONDS", None)
        else:
            os.environ["SPARKIQ_SQL_TIMEOUT_SECONDS"] = saved


def _wait_for(condition: Callable[[], bool], what: str, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"timed out waiting for {what}"
        time.sleep(0.02)
    return time.monotonic() - started


def _no_statement_running() -> None:
    """Wait until this process runs no DuckDB statement: the counts these tests read are the
    process's."""
    _wait_for(lambda: statement_counts()[0] == 0, "earlier statements to end", ENDS_WITHIN)


def _metric(node: Node, line_start: str) -> float:
    text = http_calls.get(f"{node.url}/metrics", headers=_auth(), timeout=30).text
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {line_start} in /metrics")


def _auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


def _hang_up_after_it_starts(node: Node, path: str, body: bytes, content_type: str) -> None:
    """POST ``body`` on a raw connection, wait until a DuckDB statement runs for it, close
    the connection and wait until the statement has ended."""
    _no_statement_running()
    before = statement_counts()[1]
    canceled = before["canceled"]
    host, port = node.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: {content_type}\r\n"
            f"authorization: Bearer {TOKEN}\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        conn.sendall(head.encode() + body)
        _wait_for(lambda: statement_counts()[0] == 1, "the statement to start", 60)
        assert _metric(node, "sparkiq_sql_statements_running") == 1
    _wait_for(lambda: statement_counts()[0] == 0, "the statement to end", ENDS_WITHIN)
    # every reason, before and after: once in a whole run the statement ended and was not
    # counted as canceled, and this count alone could not say how it ended instead
    after = statement_counts()[1]
    assert after["canceled"] == canceled + 1, f"interrupted before {before}, after {after}"
    assert _metric(node, "sparkiq_sql_statements_running") == 0
    counted = _metric(node, 'sparkiq_sql_statements_interrupted_total{reason="canceled"}')
    assert counted == canceled + 1


def _slow_fragment() -> SqlFragmentQuery:
    """A fragment over one partition (about a quarter of t) that runs for minutes."""
    cross = ", ".join(f"__sq_part p{i}" for i in range(6))
    joined = " || ".join(f"p{i}.k" for i in range(6))
    return SqlFragmentQuery(
        columns=("k",),
        sql=f"SELECT sum(hash({joined})) AS h FROM {cross}",
        timeout_ms=STATEMENT_TIMEOUT * 1000,
    )


def _still_answers(node: Node) -> None:
    response = http_calls.post(
        f"{node.url}/query",
        json={"sql": "SELECT k, n FROM t ORDER BY k"},
        headers=_auth(),
        timeout=60,
    )
    assert response.status_code == 200, response.text[:300]
    truth = sorted((r["k"], r["n"]) for r in expected_rows(T_HISTORY).values())
    assert [(r["k"], r["n"]) for r in response.json()["rows"]] == truth


def test_a_statement_stops_when_its_http_client_hangs_up(node: Node) -> None:
    body = orjson.dumps({"sql": SLOW})
    _hang_up_after_it_starts(node, "/query", body, "application/json")
    _still_answers(node)


def test_a_fragment_stops_when_the_node_that_sent_it_gives_up(node: Node) -> None:
    """What a router's losing hedged copy does: it closes its connection."""
    request = StateQueryRequest.in_store("t").with_query(_slow_fragment()).with_partitions({0})
    body = protocol.encode_request(request, local=True)
    _hang_up_after_it_starts(node, "/internal/query", body, protocol.CONTENT_TYPE)
    _still_answers(node)


def test_a_cancel_request_stops_the_statement_itself(node: Node) -> None:
    """psql's Ctrl-C: the client hears 57014 at once and DuckDB stops too."""
    assert node.pg_address is not None
    host, port = node.pg_address
    dsn = f"host={host} port={port} user=tester password={TOKEN} dbname=sparkiq"
    _no_statement_running()
    canceled = statement_counts()[1]["canceled"]
    outcome: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:

        def query() -> None:
            try:
                outcome["rows"] = conn.execute(SLOW).fetchall()
            except psycopg.Error as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=query)
        thread.start()
        _wait_for(lambda: statement_counts()[0] == 1, "the statement to start", 60)
        conn.cancel_safe(timeout=30)
        thread.join(ENDS_WITHIN)
        assert not thread.is_alive(), "the canceled statement did not return"
        _wait_for(lambda: statement_counts()[0] == 0, "the statement to end", ENDS_WITHIN)
        error = outcome.get("error")
        assert isinstance(error, psycopg.errors.QueryCanceled), outcome
        assert "canceling statement due to user request" in str(error)
        assert statement_counts()[1]["canceled"] == canceled + 1
        assert conn.execute("SELECT count(*) AS c FROM t").fetchall() == [
            (len(expected_rows(T_HISTORY)),)
        ]


def test_a_process_exits_cleanly_while_a_statement_runs(tmp_path: Any) -> None:
    """``sparkiq serve`` stopped (or a script ending) in the middle of a long statement:
    the statement is interrupted and the process exits 0 (it aborted in DuckDB's
    destructor, 'terminate called ... FATAL')."""
    build_world(str(tmp_path))
    script = f"""
import os, sys, threading, time
os.environ["SPARKIQ_SQL_TIMEOUT_SECONDS"] = "{STATEMENT_TIMEOUT}"
from sparkiq import Node
from sparkiq.sql.watchdog import statement_counts
node = Node({str(tmp_path)!r}, store="memory", node_id="exiting")
node.start()
node.poll_once()
threading.Thread(target=node.sql, args=({SLOW!r},), daemon=True).start()
deadline = time.monotonic() + 60
while statement_counts()[0] == 0:
    assert time.monotonic() < deadline, "the statement never started"
    time.sleep(0.02)
node.stop()
print("stopped", flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, timeout=ENDS_WITHIN * 2
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == "stopped"
    assert b"FATAL" not in done.stderr and b"terminate called" not in done.stderr


def test_a_node_whose_caller_left_cuts_its_sub_requests(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """n0 routes a fragment to n1, which hosts the partition; n0's caller leaves. n0 stops
    waiting, cuts the connection, and n1 interrupts the fragment (before, n1 ran it to the
    timeout and n0's router waited for it)."""
    monkeypatch.setenv("SPARKIQ_SQL_TIMEOUT_SECONDS", str(STATEMENT_TIMEOUT))
    build_world(str(tmp_path))
    nodes = start_http_cluster(str(tmp_path), 2, standbys=0)
    try:
        n0, n1 = nodes
        partition = min(s.partition for s in n1.status() if s.table == "t")
        request = StateQueryRequest.in_store("t").with_query(_slow_fragment())
        request = request.with_partitions({partition})
        _no_statement_running()
        canceled = statement_counts()[1]["canceled"]
        signal = CancelSignal()
        outcome: dict[str, Any] = {}

        def ask() -> None:
            with cancellable(signal):
                outcome["result"] = n0.query(request)

        thread = threading.Thread(target=ask)
        thread.start()
        _wait_for(lambda: statement_counts()[0] == 1, "n1's fragment to start", 60)
        signal.set()
        thread.join(ENDS_WITHIN)
        assert not thread.is_alive(), "n0 kept waiting for a sub-request nobody wanted"
        _wait_for(lambda: statement_counts()[0] == 0, "n1's fragment to end", ENDS_WITHIN)
        assert statement_counts()[1]["canceled"] == canceled + 1
        assert outcome["result"].partition_results[partition].is_failure
        assert n0.sql("SELECT count(*) AS c FROM t").rows == [{"c": len(expected_rows(T_HISTORY))}]
    finally:
        for node in nodes:
            node.stop()


def test_a_statement_whose_caller_left_before_it_began_is_stopped_too() -> None:
    """DuckDB clears an interrupt when a query starts: one that arrived while the tables
    were being registered was lost, and the statement ran on unwatched (a Postgres cancel
    right after a statement began did that). The watchdog interrupts until it ends."""
    table = pa.table({"k": [f"k{i:03d}" for i in range(200)]})
    cross = ", ".join(f"r r{i}" for i in range(5))
    joined = " || ".join(f"r{i}.k" for i in range(5))
    pool = DuckPool("256MB", 1)
    signal = CancelSignal()
    signal.set()
    started = time.monotonic()
    try:
        with cancellable(signal), pytest.raises(SqlLimitError) as raised:
            run(pool, f"SELECT sum(hash({joined})) AS h FROM {cross}", {"r": table}, timeout=600)
    finally:
        pool.close()
    assert raised.value.code == "canceled"
    assert time.monotonic() - started < ENDS_WITHIN


def test_a_closed_pool_opens_nothing_again() -> None:
    """At exit the pools close; the next step of a statement still under way (the engine's
    final query after its fragments) must fail, not open a new database that a daemon
    thread is inside of when the interpreter ends (that aborted the process)."""
    pool = DuckPool("64MB", 1)
    table = pa.table({"k": ["a", "b"]})
    assert run(pool, "SELECT count(*) AS c FROM r", {"r": table}, timeout=60)[1] == [(2,)]
    pool.close()
    outcome: dict[str, Any] = {}

    def statement() -> None:
        try:
            run(pool, "SELECT 1 AS one", {}, timeout=60)
        except SqlError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=statement)  # a thread with no cursor of its own yet
    thread.start()
    thread.join(60)
    assert outcome["error"].code == "closed", outcome
    assert "closed" in str(outcome["error"])
