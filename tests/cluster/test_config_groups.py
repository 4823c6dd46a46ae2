"""Every limits group of NodeConfig reaches the component that enforces it, on a real node.

One node per way of giving the groups -- ``SPARKIQ_<GROUP>_<NAME>`` variables in a mapping
passed to ``NodeConfig.resolve(environ=...)``, and ``Node`` keywords -- each on 127.0.0.1
with REST and Postgres, tiny limits, and a table of five rows. Each limit is checked on
both sides: what it refuses, and something just within it that is served (so a refusal
is the limit's, not a broken node's).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from sparkiq import AuthPolicy, ConfigError, HttpLimits, Node, NodeConfig, PgLimits, SqlLimits
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch

pytestmark = pytest.mark.timeout(120)

TOKEN = "groups-token"
ROWS = {f"k{i}": i for i in range(5)}
MAX_ROWS = 2
MAX_HEADER_BYTES = 2048
# the bar after a wrong token outlasts the test: a right token is then refused too
BAR_SECONDS = 600.0

VARIABLES = {
    "SPARKIQ_SQL_MAX_RESULT_ROWS": str(MAX_ROWS),
    "SPARKIQ_HTTP_MAX_HEADER_BYTES": str(MAX_HEADER_BYTES),
    "SPARKIQ_PG_MAX_CONNECTIONS": "1",
    "SPARKIQ_PG_MAX_UNAUTHENTICATED": "1",
    "SPARKIQ_AUTH_FREE_FAILURES": "0",
    "SPARKIQ_AUTH_BASE_DELAY": str(BAR_SECONDS),
    "SPARKIQ_AUTH_MAX_DELAY": str(BAR_SECONDS),
}
KEYWORDS = {
    "sql_limits": {"max_result_rows": MAX_ROWS},  # a mapping of some fields
    "http_limits": HttpLimits(max_header_bytes=MAX_HEADER_BYTES),  # an instance
    "pg_limits": PgLimits(max_connections=1, max_unauthenticated=1),
    "auth_policy": AuthPolicy(free_failures=0, base_delay=BAR_SECONDS, max_delay=BAR_SECONDS),
}


@pytest.fixture(scope="module", params=["variables", "keywords"])
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Node]:
    root = str(tmp_path_factory.mktemp(f"groups-{request.param}"))
    write_batch(make_table(root, partitions=2), 0, dict(ROWS))
    where = {"listen": "127.0.0.1:0", "pg_listen": "127.0.0.1:0", "store": "memory"}
    if request.param == "variables":
        config = NodeConfig.resolve(root, environ=VARIABLES, token=TOKEN, **where)
        made = Node(config=config)
    else:
        made = Node(root, token=TOKEN, **where, **KEYWORDS)  # type: ignore[arg-type]
    with made.start() as started:
        started.poll_once()
        yield started


def _post_sql(node: Node, sql: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {TOKEN}"}
    return http_calls.post(f"{node.url}/query", json={"sql": sql}, headers=headers, timeout=30)


def _dsn(node: Node) -> str:
    assert node.pg_address is not None
    host, port = node.pg_address
    return (
        f"host={host} port={port} user=u dbname=sparkiq password={TOKEN} "
        "connect_timeout=30 sslmode=disable"
    )


def _get_with_header(node: Node, padding: int) -> bytes:
    """The status line of a GET /healthz carrying ``padding`` bytes in one header."""
    host, port = node.url.removeprefix("http://").rsplit(":", 1)  # type: ignore[union-attr]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-pad: %s\r\n\r\n" % (b"x" * padding)
        )
        return sock.recv(4096).split(b"\r\n", 1)[0]


def test_each_group_reaches_its_component(node: Node) -> None:
    assert node.config.sql_limits.max_result_rows == MAX_ROWS
    # SqlLimits over REST: the engine refuses more rows than max_result_rows
    within = _post_sql(node, f"SELECT k FROM t ORDER BY k LIMIT {MAX_ROWS}")
    assert within.status_code == 200, within.text
    assert [r["k"] for r in within.json()["rows"]] == ["k0", "k1"]
    over = _post_sql(node, "SELECT k FROM t")
    assert over.status_code == 400 and over.json()["error"]["code"] == "too_many_rows"

    # HttpLimits: the transport refuses headers over max_header_bytes
    assert _get_with_header(node, 100).endswith(b" 200 OK")
    assert b" 431 " in _get_with_header(node, MAX_HEADER_BYTES)

    # SqlLimits over Postgres, and PgLimits: one connection at most
    with psycopg.connect(_dsn(node), autocommit=True) as held:
        assert held.execute("SELECT n FROM t WHERE k = 'k3'").fetchall() == [(3,)]
        with pytest.raises(psycopg.Error) as caught:
            held.execute("SELECT k FROM t")
        assert caught.value.sqlstate == "54000"
        with pytest.raises(psycopg.Error) as caught:  # the catalog answers within them too
            held.execute("SELECT typname FROM pg_catalog.pg_type")
        assert caught.value.sqlstate == "54000"
        with pytest.raises(psycopg.OperationalError, match="too many clients"):
            psycopg.connect(_dsn(node)).close()

    # AuthPolicy (last: it bars this address): no free failure, then a long bar, so even
    # the right token is refused after one wrong one
    url = f"{node.url}/stores/t/keys/k1"
    right = {"authorization": f"Bearer {TOKEN}"}
    assert http_calls.get(url, headers=right, timeout=30).status_code == 200
    wrong = http_calls.get(url, headers={"authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    barred = http_calls.get(url, headers=right, timeout=30)
    assert barred.status_code == 401
    assert barred.json()["error"]["retry_after_seconds"] > BAR_SECONDS / 2
    # the address is the connection's: a header naming another is not believed (a caller
    # on the node's host could otherwise send a new one with each guess, past the bar)
    forged = http_calls.get(url, headers=right | {"x-forwarded-for": "10.9.9.9"}, timeout=30)
    assert forged.status_code == 401


def test_groups_resolve_keyword_then_variable_then_default() -> None:
    env = {"SPARKIQ_SQL_MAX_RESULT_ROWS": "7", "SPARKIQ_SQL_TIMEOUT_SECONDS": "3"}
    merged = NodeConfig.resolve("/s", environ=env, sql_limits={"max_result_rows": 9})
    assert (merged.sql_limits.max_result_rows, merged.sql_limits.timeout_seconds) == (9, 3.0)
    assert merged.sql_limits.max_page_size == SqlLimits().max_page_size
    whole = NodeConfig.resolve("/s", environ=env, sql_limits=SqlLimits(max_result_rows=9))
    assert whole.sql_limits == SqlLimits(max_result_rows=9)  # an instance is taken whole
    ignored = NodeConfig.resolve("/s", environ=env, sql_limits=None)
    assert ignored.sql_limits == SqlLimits()  # None: the defaults, variables ignored
    assert NodeConfig.resolve("/s", environ={}) == NodeConfig("/s")
    with pytest.raises(ConfigError, match="sql_limits must be a SqlLimits or a mapping"):
        NodeConfig.resolve("/s", environ={}, sql_limits=5)
    with pytest.raises(ConfigError, match=r"unknown pg settings \['max_conections'\]"):
        NodeConfig.resolve("/s", environ={}, pg_limits={"max_conections": 3})
    with pytest.raises(ConfigError, match="SPARKIQ_AUTH_MAX_PEERS='many' is not a number"):
        NodeConfig.resolve("/s", environ={"SPARKIQ_AUTH_MAX_PEERS": "many"})
    with pytest.raises(ConfigError, match="AuthPolicy needs"):
        NodeConfig.resolve("/s", environ={}, auth_policy={"base_delay": 9, "max_delay": 1})


def test_a_node_reads_the_groups_once_when_it_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKIQ_SQL_MAX_RESULT_ROWS", "3")
    node = Node(str(tmp_path), store="memory")
    monkeypatch.setenv("SPARKIQ_SQL_MAX_RESULT_ROWS", "4")
    assert node.config.sql_limits.max_result_rows == 3
    given = Node(str(tmp_path), store="memory", sql_limits={"timeout_seconds": 2})
    assert (given.config.sql_limits.max_result_rows, given.config.sql_limits.timeout_seconds) == (
        4,
        2.0,
    )
