"""Hostile input against a real node over HTTP on 127.0.0.1.

Every case sends one malicious request and asserts three things: the node refuses it (4xx)
within a second, a key lookup issued meanwhile on another connection still answers within a
second (nothing held the event loop or the GIL), and the node answers correctly afterwards.
"A second" is a second of an idle core: on a loaded machine it is scaled by how much slower
than CPU time the wall clock runs at that moment (:func:`bound`).
Every error body is also checked for leaks: no filesystem path, no Python class name.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import sparkiq.server
from sparkiq import Node
from sparkiq.errors import ChangelogError, InvalidQueryError, StoreError
from sparkiq.server.app import PUBLIC_PATHS
from sparkiq.sql.parse import MAX_NESTING
from sparkiq.wire import protocol
from sparkiq.wire.values import pack
from tests import http_calls
from tests.cluster.cluster_helpers import start_http_cluster
from tests.sql.tables import build_world

pytestmark = pytest.mark.timeout(120)

TOKEN = "hostile-token"
BOUND = 1.0  # seconds of an idle core: a refusal, and any concurrent lookup, within this
PROBE_PATH = "/stores/ik/keys/1"  # ik holds keys -50, -47, ...: key 1 is the 18th row
PROBE_ROW = {"key": 1, "v": 17}
LEAKS = ("/tmp", "sqlglot", "Traceback", "pytest-of")


def bound() -> float:
    """:data:`BOUND` in wall-clock seconds on this machine now.

    The stalls these tests guard against cost 10-50 s of CPU (a 10**30000000 computed, a
    regular expression backtracking); on a machine at load 30 even a 60 ms answer takes a
    second of wall time. A reference computation measures how much slower than its own CPU
    time the wall clock runs right now, and the bound scales by that (never below BOUND).
    """
    started, cpu = time.monotonic(), time.thread_time()
    total = 0
    while time.thread_time() - cpu < 0.05:
        total += sum(range(1000))
    slowdown = (time.monotonic() - started) / max(time.thread_time() - cpu, 1e-3)
    return BOUND * max(1.0, slowdown)


def within_bound(elapsed: float) -> bool:
    """``elapsed < bound()``, measuring the machine (50 ms of CPU) only when ``elapsed`` is
    over :data:`BOUND` itself: most checks never need to, and the module makes hundreds."""
    return elapsed < BOUND or elapsed < bound()


@dataclass
class Hostile:
    node: Node
    state_dir: str

    def url(self, path: str) -> str:
        return f"{self.node.url}{path}"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    state_dir = str(tmp_path_factory.mktemp("hostile"))
    build_world(state_dir)
    (node,) = start_http_cluster(state_dir, 1, token=TOKEN)
    yield Hostile(node, state_dir)
    node.stop()


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {TOKEN}"}


def assert_no_leak(h: Hostile, response: httpx.Response) -> None:
    text = response.text
    for leak in (*LEAKS, h.state_dir):
        assert leak not in text, (leak, text[:500])


def assert_healthy(h: Hostile) -> None:
    """The node still answers a lookup correctly."""
    response = http_calls.get(h.url(PROBE_PATH), headers=auth(), timeout=10)
    assert response.status_code == 200
    assert response.json()["row"] == PROBE_ROW


class Probe:
    """Key lookups on their own connection, one after another, for as long as it runs:
    ``with Probe(h) as probe:`` returns once one lookup has answered (a cold client is not
    the hostile request's fault); leaving waits for one more lookup, issued after the
    hostile request was sent, then checks every lookup answered correctly and quickly."""

    def __init__(self, h: Hostile) -> None:
        self.h = h
        self.spans: list[tuple[float, float]] = []
        self.failures: list[str] = []
        self.done = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with http_calls.new_client(headers=auth(), timeout=10) as client:
            while not self.done.is_set():
                started = time.monotonic()
                response = client.get(self.h.url(PROBE_PATH))
                self.spans.append((started, time.monotonic()))
                if response.status_code != 200 or response.json()["row"] != PROBE_ROW:
                    self.failures.append(response.text)
                self.ready.set()
                time.sleep(0.005)

    def __enter__(self) -> Probe:
        self.thread.start()
        assert self.ready.wait(15), "the probe's first lookup never answered"
        self.since = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not any(s > self.since for s, _ in self.spans):
            time.sleep(0.01)
        self.done.set()
        self.thread.join(15)
        if exc[0] is not None:
            return
        assert not self.failures, self.failures[:3]
        meanwhile = [end - start for start, end in self.spans if end > self.since]
        assert meanwhile, "no lookup answered while or after the hostile request ran"
        limit = bound()
        assert max(meanwhile) < limit, f"a concurrent lookup took {max(meanwhile):.2f} s"


def refused(
    h: Hostile,
    method: str,
    path: str,
    *,
    json: Any = None,
    content: bytes | None = None,
    headers: dict[str, str] | None = None,
    status: int | tuple[int, ...] = 400,
) -> httpx.Response:
    """Send one hostile request while another connection keeps looking a key up; assert a
    quick 4xx, quick concurrent lookups and a healthy node afterwards."""
    assert_healthy(h)
    body = orjson.dumps(json) if json is not None else content
    # a POST names its body's type (a node refuses the types any web page may send)
    kind = {"content-type": "application/json" if json is not None else protocol.CONTENT_TYPE}
    with Probe(h):
        started = time.monotonic()
        response = http_calls.request(
            method, h.url(path), content=body, headers=auth() | kind | (headers or {}), timeout=30
        )
        elapsed = time.monotonic() - started
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, response.text[:500]
    assert within_bound(elapsed), f"{path}: answered after {elapsed:.2f} s"
    assert_no_leak(h, response)
    assert_healthy(h)
    return response


def error_of(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert isinstance(error, dict)
    return error


# -- 1. numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key", ["1e30000000", "-1e30000000", "1e99999999999", "0e99999999999", "1e-99999999999"]
)
def test_huge_decimal_key_exponents_are_refused_quickly(hostile: Hostile, key: str) -> None:
    if key == "0e99999999999":  # zero, whatever the exponent: a valid key with no row
        response = http_calls.get(hostile.url(f"/stores/xk/keys/{key}"), headers=auth(), timeout=5)
        assert response.status_code == 404
        return
    error = error_of(refused(hostile, "GET", f"/stores/xk/keys/{key}"))
    assert error["code"] == "invalid_query"
    assert "'key'" in error["message"]
    if "-" not in key.lstrip("-"):  # too large, not too precise
        assert "-999999999.999 to 999999999.999" in error["message"]
    else:
        assert "fractional digits" in error["message"]


def test_huge_decimal_key_in_a_json_request_is_refused_quickly(hostile: Hostile) -> None:
    body = {"query": {"type": "key", "key": "1e30000000"}}
    error = error_of(refused(hostile, "POST", "/stores/xk/query", json=body))
    assert error["field"] == "query.key" or "'key'" in error["message"]


def test_overlong_number_keys_are_refused_quickly(hostile: Hostile) -> None:
    for table in ("xk", "ik", "lk"):
        error = error_of(refused(hostile, "GET", f"/stores/{table}/keys/{'9' * 50_000}"))
        assert "at most 100" in error["message"]
        assert len(error["message"]) < 300  # the key is not echoed back whole


def test_huge_decimal_literal_in_sql_answers_quickly_and_correctly(hostile: Hostile) -> None:
    for sql in (
        "SELECT * FROM xk WHERE key = 1e99999999999",
        "SELECT * FROM xk WHERE key IN (1e99999999999, -1e30000000)",
        "SELECT * FROM xk WHERE key > 1e99999999999",
        "SELECT * FROM xk WHERE key = 0e99999999999",
        "SELECT * FROM xk WHERE key = 1e-99999999999",
        "SELECT * FROM xk WHERE key = -1e99999999999",
        "SELECT * FROM xk WHERE key BETWEEN -1e99999999999 AND -1e30000000",
    ):
        for _ in range(2):  # the second run binds the cached plan's template
            started = time.monotonic()
            response = http_calls.post(
                hostile.url("/query"), json={"sql": sql}, headers=auth(), timeout=30
            )
            assert within_bound(time.monotonic() - started), sql
            assert_no_leak(hostile, response)
            assert response.status_code == 200, response.text
            assert response.json()["rows"] == [], sql  # no decimal(12,3) is that far out
    assert_healthy(hostile)


def test_huge_numbers_in_push_queries_are_refused_or_harmless(hostile: Hostile) -> None:
    long_digits = "9" * 5000
    sql = f"SELECT * FROM xk WHERE v = {long_digits} EMIT CHANGES"
    error = error_of(refused(hostile, "POST", "/query", json={"sql": sql}))
    assert "at most 100" in error["message"]


# -- 2. the sandbox ----------------------------------------------------------------------------


def test_a_cte_name_outside_its_scope_does_not_read_the_catalog(hostile: Hostile) -> None:
    sql = (
        "SELECT name, setting FROM (WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM "
        "pg_settings) x, pg_settings"
    )
    error = error_of(refused(hostile, "POST", "/query", json={"sql": sql}))
    assert error["code"] == "unknown_table"
    assert error["field"] == "pg_settings"


# -- 3. push queries -----------------------------------------------------------------------------


def test_push_statements_have_the_pull_length_limit(hostile: Hostile) -> None:
    sql = f"SELECT * FROM t WHERE k = '{'x' * 150_000}' EMIT CHANGES"
    error = error_of(refused(hostile, "POST", "/query", json={"sql": sql}))
    assert error["code"] == "statement_too_long"
    assert "max_statement_chars=100000" in error["message"]


def test_pull_statements_are_measured_before_any_regex(hostile: Hostile) -> None:
    for sql in ("SELECT 1 " + "/* " * 40_000, " " * 150_000 + "SELECT 1", "SELECT '" * 20_000):
        error = error_of(refused(hostile, "POST", "/query", json={"sql": sql}))
        assert error["code"] == "statement_too_long"


def test_a_backtracking_like_pattern_costs_nothing(hostile: Hostile) -> None:
    """A LIKE that a regex engine would backtrack on for hours, evaluated on every row of a
    snapshot: the first change arrives within a second and lookups never wait."""
    long_key = " || ".join(["k"] * 40)  # 'w001w001...': 40 'w's to try '%w%w...' against
    pattern = "%w" * 14 + "%x"
    sql = f"SELECT k FROM w WHERE k = 'w001' OR {long_key} LIKE '{pattern}' EMIT CHANGES"
    with Probe(hostile):
        started = time.monotonic()
        with http_calls.stream(
            "POST",
            hostile.url("/query"),
            json={"sql": sql, "snapshot": True},
            headers=auth(),
            timeout=30,
        ) as response:
            assert response.status_code == 200
            first = orjson.loads(next(response.iter_lines()))
            elapsed = time.monotonic() - started
    assert first["row"] == {"k": "w001"} and first["snapshot"] is True
    assert within_bound(elapsed), f"first change after {elapsed:.2f} s"
    assert_healthy(hostile)


# -- 4. nesting, extreme window bounds, malformed node-protocol bodies ------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT " + "(" * 100 + "1" + ")" * 100,
        "SELECT * FROM t WHERE " + "(" * 100 + "n = 1" + ")" * 100,
        "SELECT " + "abs(" * 100 + "1" + ")" * 100,
        "SELECT " + "(SELECT " * 100 + "1" + ")" * 100,
        "SELECT " + "CASE WHEN TRUE THEN " * 100 + "1" + " END" * 100,
        "SELECT " + "NOT " * 2000 + "TRUE",  # no parentheses: sqlglot's own recursion
        "SELECT * FROM t WHERE " + "(" * 100 + "n = 1" + ")" * 100 + " EMIT CHANGES",
        "SELECT * FROM t WHERE " + "NOT " * 2000 + "n = 1 EMIT CHANGES",
    ],
)
def test_deep_nesting_is_a_400(hostile: Hostile, sql: str) -> None:
    error = error_of(refused(hostile, "POST", "/query", json={"sql": sql}))
    assert error["code"] == "nesting_too_deep"
    assert "nest" in error["message"]


def test_nesting_up_to_the_limit_answers(hostile: Hostile) -> None:
    for sql in (
        "SELECT " + "(" * MAX_NESTING + "1" + ")" * MAX_NESTING + " AS x",
        "SELECT " + "(SELECT " * (MAX_NESTING - 1) + "1 AS x" + ")" * (MAX_NESTING - 1) + " AS x",
        "SELECT " + "abs(" * MAX_NESTING + "1" + ")" * MAX_NESTING + " AS x",
    ):
        response = http_calls.post(
            hostile.url("/query"), json={"sql": sql}, headers=auth(), timeout=30
        )
        assert response.status_code == 200, response.text[:300]
        assert response.json()["rows"] == [{"x": 1}]
    # a long AND chain is deep as a tree but not nested: it answers (up to
    # SqlLimits.max_terms; tests/server/test_limits_sql.py refuses 3000 terms)
    sql = "SELECT count(*) AS c FROM t WHERE " + " AND ".join(["n >= 0"] * 450)
    response = http_calls.post(hostile.url("/query"), json={"sql": sql}, headers=auth(), timeout=30)
    assert response.status_code == 200, response.text[:300]
    assert response.json()["rows"][0]["c"] > 0


WINDOWS_OF_A = 12  # tests.sql.tables: key 'a' has a window every 2 hours of one day


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("0001-01-01T00:00:00", "9999-12-31T23:59:59.999999"),
        ("0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59.999999-14:00"),
        ("0001-01-01T00:00:00Z", None),
    ],
)
def test_extreme_window_bounds_answer(hostile: Hostile, lower: str, upper: str | None) -> None:
    for doc in (
        {"type": "window_key", "key": "a", "from": lower, "to": upper},
        {"type": "window_range", "from": lower, "to": upper},
    ):
        response = http_calls.post(
            hostile.url("/stores/win/query"), json={"query": doc}, headers=auth(), timeout=30
        )
        assert response.status_code == 200, response.text[:300]
        rows = [r for p in response.json()["partitions"].values() for r in p["rows"]]
        if doc["type"] == "window_key":
            assert len(rows) == WINDOWS_OF_A
        else:
            assert len(rows) > WINDOWS_OF_A


def test_extreme_window_bounds_over_the_node_protocol(hostile: Hostile) -> None:
    east = dt.timezone(dt.timedelta(hours=14))
    west = dt.timezone(dt.timedelta(hours=-14))
    for lower, upper in (
        (dt.datetime.min, dt.datetime.max),
        (dt.datetime.min.replace(tzinfo=east), dt.datetime.max.replace(tzinfo=west)),
    ):
        body = pack(
            {
                "v": 1,
                "store": "win",
                "query": {
                    "type": "WindowKeyQuery",
                    "fields": {"key": "a", "time_from": lower, "time_to": upper},
                },
            }
        )
        response = http_calls.post(
            hostile.url("/internal/query"),
            content=body,
            headers=auth() | {"content-type": protocol.CONTENT_TYPE},
            timeout=30,
        )
        assert response.status_code == 200, response.content[:300]


def _request(fields: Any, query_type: str = "KeyQuery", store: Any = "ik", **extra: Any) -> bytes:
    query = {"type": query_type, "fields": fields}
    return pack({"v": 1, "store": store, "query": query, **extra})


MALFORMED_INTERNAL = {
    "empty": b"",
    "not msgpack": b"\x80",
    "a number": pack(5),
    "an array": pack([1, 2]),
    "another version": pack({"v": 2}),
    "no query": pack({"v": 1, "store": "ik"}),
    "query not a map": pack({"v": 1, "store": "ik", "query": 5}),
    "fields not a map": _request([1]),
    "unknown field": _request({"nope": 1}),
    "key of another type": _request({"key": "x"}),
    "key of a map": _request({"key": {"a": 1}}),
    "store not a string": _request({"key": 1}, store=5),
    "partitions of strings": _request({"key": 1}, partitions="ab"),
    "bound not a token": _request({"key": 1}, bound=5),
    "bound corrupted": _request({"key": 1}, bound="p1.zzz"),
    "window bound a string": _request({"key": "a", "time_from": "x"}, "WindowKeyQuery", "win"),
    "window bound a number": _request({"time_to": 5}, "WindowRangeQuery", "win"),
    "nested 100000 deep": b"\x91" * 100_000,
}


@pytest.mark.parametrize("body", MALFORMED_INTERNAL.values(), ids=MALFORMED_INTERNAL.keys())
def test_malformed_internal_query_bodies_are_a_400(hostile: Hostile, body: bytes) -> None:
    error = error_of(refused(hostile, "POST", "/internal/query", content=body))
    assert error["message"]


#: Partition lists a caller may send (``partitions``): at most MAX_PARTITIONS, each once. A
#: list of 200,000 was answered on the event loop, a frame per partition, for 9.8 s.
HUGE = list(range(200_000))
PARTITION_LISTS = {
    "200,000 on the node protocol (a key, answered on the event loop)": (
        "/internal/query",
        _request({"key": 1}, partitions=HUGE, local=True),
        "200000 partitions named; a request names at most 65536",
    ),
    "200,000 on the node protocol (routed)": (
        "/internal/query",
        _request({}, "RangeQuery", partitions=HUGE),
        "200000 partitions named",
    ),
    "200,000 as JSON": (
        "/stores/ik/query",
        orjson.dumps({"query": {"type": "range"}, "partitions": [0] * 200_000}),
        "200000 partitions named",
    ),
    "one named twice (node protocol)": (
        "/internal/query",
        _request({"key": 1}, partitions=[3, 1, 3], local=True),
        "partitions [3] named more than once",
    ),
    "one named twice (JSON)": (
        "/stores/ik/query",
        b'{"query": {"type": "range"}, "partitions": [2, 2, 0, 0]}',
        "partitions [0, 2] named more than once",
    ),
    "a number out of range": (
        "/internal/query",
        _request({"key": 1}, partitions=[0, 65536], local=True),
        "partition numbers are 0 to 65535, got [65536]",
    ),
    "a negative number": (
        "/stores/ik/query",
        b'{"query": {"type": "range"}, "partitions": [-1]}',
        "partition numbers are 0 to 65535, got [-1]",
    ),
}


@pytest.mark.parametrize(
    ("path", "body", "message"), PARTITION_LISTS.values(), ids=PARTITION_LISTS.keys()
)
def test_partition_lists_are_bounded_when_parsed(
    hostile: Hostile, path: str, body: bytes, message: str
) -> None:
    kind = "application/json" if path.startswith("/stores") else protocol.CONTENT_TYPE
    response = refused(hostile, "POST", path, content=body, headers={"content-type": kind})
    error = error_of(response)
    assert error["field"] == "partitions" and message in error["message"], error
    # a list within the bounds is still answered (ik has 4 partitions)
    if path == "/internal/query":
        body = _request({"key": 1}, partitions=[0, 1, 2, 3], local=True)
    else:
        body = orjson.dumps({"query": {"type": "range"}, "partitions": [0, 1, 2, 3]})
    answered = http_calls.post(
        hostile.url(path), content=body, headers=auth() | {"content-type": kind}, timeout=30
    )
    assert answered.status_code == 200, answered.content[:300]


# -- 6. no paths or Python internals in messages ----------------------------------------------


def test_error_messages_carry_no_paths_or_class_names(
    hostile: Hostile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Errors raised deep inside (a replica's RocksDB, a SQL library) reach the caller with
    what they say about tables and partitions, without paths or Python class names."""
    replica = f"{hostile.state_dir}/replicas/n0/ik/2/rocksdb"
    failures: list[Exception] = [
        StoreError(f"RocksDB store at '{replica}' failed: IO error: {replica}/LOCK (table 'ik')"),
        ChangelogError("table 'ik': cannot read 's3://bucket/warehouse/ik/_manifest.json': denied"),
        InvalidQueryError("cannot compare <class 'sqlglot.expressions.Column'> in partition 2"),
        InvalidQueryError("KeyQuery: KeyQuery.__init__() got an unexpected keyword argument"),
        InvalidQueryError("expected sqlglot.expressions.Select for table 'ik'"),
    ]
    for failure in failures:

        def fail(*args: Any, failure: Exception = failure) -> Any:
            raise failure

        monkeypatch.setattr(hostile.node, "locate_key", fail)
        response = http_calls.get(hostile.url(PROBE_PATH), headers=auth(), timeout=10)
        assert 400 <= response.status_code < 600
        assert_no_leak(hostile, response)
        message = error_of(response)["message"]
        for word in ("<class", "__init__", "expressions.", "s3://", "rocksdb/LOCK"):
            assert word not in message, message
        assert "'ik'" in message or "partition 2" in message or "KeyQuery" in message, message
    monkeypatch.undo()
    assert_healthy(hostile)


# -- 7. what is public ---------------------------------------------------------------------------


def test_public_paths_are_the_documented_ones_and_hold_no_data(hostile: Hostile) -> None:
    docs = (Path(__file__).parents[2] / "docs" / "rest.md").read_text()
    sentence = docs[docs.index("except these public paths") :].split("\n\n")[0]
    documented = set(re.findall(r"`(/[a-z.]*)`", sentence))
    assert documented == PUBLIC_PATHS
    page = (Path(sparkiq.server.__file__).parent / "console.html").read_bytes()
    for path in sorted(PUBLIC_PATHS):
        response = http_calls.get(hostile.url(path), timeout=10)  # no token
        assert response.status_code == 200, path
        if path in ("/", "/console"):
            assert response.content == page  # the static page: nothing of the node's data
            assert response.headers["x-frame-options"] == "DENY"
    for path in ("/stores", "/metadata", "/metrics", PROBE_PATH):
        assert http_calls.get(hostile.url(path), timeout=10).status_code == 401, path
