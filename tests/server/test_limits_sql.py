"""SQL limits of a real ``sparkiq serve`` process: statements that would take unbounded
memory, spill, result bytes or time are refused with a 4xx within bounded time, the
process's peak resident size stays bounded (read from ``/proc/<pid>/status``), DuckDB
spills into a directory of its own (never ``<cwd>/.tmp``), a fragment cannot buy more time
than the node's statement timeout, and key lookups keep answering meanwhile.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest

from sparkiq.query.request import StateQueryRequest
from sparkiq.sql import SqlFragmentQuery
from sparkiq.sql.duck import DuckPool, run
from sparkiq.sql.errors import SqlLimitError
from sparkiq.wire import protocol
from tests import forked_python, http_calls
from tests.changelog.helpers import expected_rows
from tests.cluster.serve_processes import free_port
from tests.server.serve_subprocess import serving
from tests.server.test_hostile import PROBE_PATH, PROBE_ROW, TOKEN, Probe, auth
from tests.sql.tables import T_HISTORY, build_world

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc"),
]

TIMEOUT = 3.0  # the node's SqlLimits.timeout_seconds
SLACK = 6.0  # for a loaded machine: answers come within TIMEOUT + SLACK
MEMORY = "256MB"
MIB = 1 << 20
# What the node may grow while hostile statements run: twice the memory limit (the
# watchdog's budget), the largest result it may build, and room for Python's own objects.
GROWTH = 2 * 256 * 10**6 + 32 * MIB + 256 * MIB


@dataclass
class Served:
    url_base: str
    process: forked_python.Process
    cwd: Path
    log: Path

    def url(self, path: str) -> str:
        return f"{self.url_base}{path}"

    def status(self, field: str) -> int:
        """A ``/proc/<pid>/status`` size (``VmRSS``, ``VmHWM``) in bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} in /proc/{self.process.pid}/status")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    state_dir = tmp_path_factory.mktemp("limits-sql")
    build_world(str(state_dir))
    cwd = tmp_path_factory.mktemp("limits-cwd")
    port = free_port()
    env = {
        "SPARKIQ_SQL_TIMEOUT_SECONDS": str(TIMEOUT),
        "SPARKIQ_SQL_MEMORY_LIMIT": MEMORY,
        "SPARKIQ_SQL_SPILL_LIMIT": "64MB",
        "SPARKIQ_SQL_MAX_RESULT_BYTES": str(32 * MIB),
    }
    args = [
        "--state-dir", str(state_dir), "--node-id", "n0",
        "--listen", f"127.0.0.1:{port}", "--token", TOKEN,
    ]  # fmt: skip

    def node(process: forked_python.Process) -> Served:
        return Served(f"http://127.0.0.1:{port}", process, cwd, cwd / "node.log")

    def ready(process: forked_python.Process) -> bool:
        # ready, and hosting every partition (a lone node takes them all)
        served = node(process)
        counts = [sql(served, f"SELECT count(*) AS c FROM {t}", 5) for t in ("ik", "t")]
        lookup = http_calls.get(served.url(PROBE_PATH), headers=auth(), timeout=1)
        return lookup.status_code == 200 and all(c.status_code == 200 for c in counts)

    with serving(args, cwd, ready, env=env, errors=(httpx.HTTPError,), timeout=60) as process:
        yield node(process)


def sql(node: Served, text: str, timeout: float = 60) -> httpx.Response:
    return http_calls.post(node.url("/query"), json={"sql": text}, headers=auth(), timeout=timeout)


def refused_sql(node: Served, text: str, codes: tuple[str, ...]) -> dict[str, Any]:
    """Run ``text`` while lookups go on: a 400 with one of ``codes`` within bounded time,
    peak memory bounded, the node answering correctly afterwards."""
    rss_before = node.status("VmRSS")
    with Probe(node):  # type: ignore[arg-type]  # Probe only needs .url()
        started = time.monotonic()
        response = sql(node, text)
        elapsed = time.monotonic() - started
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["code"] in codes, error
    assert elapsed < TIMEOUT + SLACK, f"answered after {elapsed:.1f} s"
    peak = node.status("VmHWM")
    assert peak - rss_before < GROWTH, f"peak {peak / MIB:.0f} MiB from {rss_before / MIB:.0f}"
    assert sql(node, "SELECT v FROM ik WHERE key = 1").json()["rows"] == [{"v": 17}]
    lookup = http_calls.get(node.url(PROBE_PATH), headers=auth(), timeout=10)
    assert lookup.json()["row"] == PROBE_ROW
    return error


def test_a_two_gigabyte_string_is_refused(served: Served) -> None:
    error = refused_sql(served, "SELECT length(repeat('x', 2000000000)) AS n", ("value_too_large",))
    assert "repeat" in error["message"] and "max_value_bytes" in error["message"]


@pytest.mark.parametrize(
    "text",
    [
        "SELECT lpad('a', 2000000000, 'b') AS s",
        "SELECT range(2000000000) AS r",
        "SELECT printf('%1000000000d', 1) AS s",
        "SELECT replace(repeat('a', 1000000), 'a', repeat('b', 1000)) AS s",
    ],
)
def test_other_value_builders_are_refused(served: Served, text: str) -> None:
    refused_sql(served, text, ("value_too_large",))


def test_qualified_function_calls_cannot_reach_the_unguarded_function(served: Served) -> None:
    refused_sql(served, "SELECT system.main.repeat('x', 2000000000) AS s", ("qualified_function",))


def test_a_huge_cross_join_runs_out_of_time(served: Served) -> None:
    refused_sql(served, "SELECT count(*) AS c FROM t a, t b, t c, t d, t e", ("timeout",))


def test_a_gigabyte_result_is_refused(served: Served) -> None:
    """40,000 rows of a 60 kB string (2.4 GB): refused long before it all exists (by its
    size, or by the clock when the machine is too busy to build 32 MB in 3 s)."""
    error = refused_sql(
        served,
        "SELECT a.k, repeat('x', 60000) AS pad FROM t a, t b",
        ("result_too_large", "out_of_memory", "timeout"),
    )
    assert "SqlLimits." in error["message"]


@pytest.mark.parametrize("arrow", [False, True], ids=["rows", "arrow"])
def test_result_bytes_are_counted_while_fetching(arrow: bool) -> None:
    """The size check itself, in-process and without a clock: 2,000 rows of 1 kB pass a
    4 MB budget, 8,000 do not (rows as DuckDB fetches them, or Arrow for fragments)."""
    pool = DuckPool("256MB", 1, max_result_bytes=4 << 20)
    table = pa.table({"i": list(range(8000))})
    try:
        sql = "SELECT i, repeat('x', 1000) AS pad FROM r WHERE i < {n} ORDER BY i"
        names, rows = run(pool, sql.format(n=2000), {"r": table}, timeout=60, arrow=arrow)
        assert names == ["i", "pad"]
        count = rows.num_rows if arrow else len(rows)
        assert count == 2000
        with pytest.raises(SqlLimitError, match="max_result_bytes=4194304") as caught:
            run(pool, sql.format(n=8000), {"r": table}, timeout=60, arrow=arrow)
        assert caught.value.code == "result_too_large"
        # the connection is usable afterwards: the unfinished result was abandoned
        assert run(pool, "SELECT count(*) FROM r", {"r": table}, timeout=60)[1] == [(8000,)]
    finally:
        pool.close()


def test_an_aggregate_growing_without_bound_is_stopped(served: Served) -> None:
    refused_sql(
        served,
        "SELECT string_agg(repeat('x', 60000), ',') AS s FROM t a, t b, t c",
        ("out_of_memory", "timeout"),
    )


def test_spilling_is_bounded_and_never_in_the_working_directory(served: Served) -> None:
    refused_sql(
        served,
        "SELECT max(r) AS r FROM (SELECT row_number() OVER (ORDER BY md5(pad)) AS r, pad "
        "FROM (SELECT repeat(md5(a.k || b.k), 300) AS pad FROM t a, t b) x) y",
        ("out_of_memory", "timeout"),
    )
    assert not (served.cwd / ".tmp").exists()
    assert sorted(p.name for p in served.cwd.iterdir()) == ["node.log"]


def test_a_fragment_cannot_outlive_the_statement_timeout(served: Served) -> None:
    """A fragment asking for a million seconds gets the node's statement timeout."""
    cross = ", ".join(f"__sq_part p{i}" for i in range(7))
    fragment = SqlFragmentQuery(
        columns=("k",), sql=f"SELECT count(*) AS c FROM {cross}", timeout_ms=10**9
    )
    request = StateQueryRequest.in_store("t").with_query(fragment).with_partitions({0})
    body = protocol.encode_request(request, local=True)
    with Probe(served):  # type: ignore[arg-type]
        started = time.monotonic()
        response = http_calls.post(
            served.url("/internal/query"),
            content=body,
            headers=auth() | {"content-type": protocol.CONTENT_TYPE},
            timeout=60,
        )
        elapsed = time.monotonic() - started
    assert response.status_code == 400, response.content[:500]
    assert response.json()["error"]["code"] == "timeout"
    assert elapsed < TIMEOUT + SLACK, f"answered after {elapsed:.1f} s"


@pytest.mark.parametrize(
    "text",
    [
        "SELECT * FROM t WHERE " + " OR ".join(f"k = 'k{i:04d}'" for i in range(2000)),
        "SELECT * FROM t WHERE k IN (" + ", ".join(f"'k{i:04d}'" for i in range(5000)) + ")",
        "SELECT count(*) AS c FROM t WHERE " + " AND ".join(["n >= n"] * 3000),
    ],
    ids=["or-2000", "in-5000", "and-3000"],
)
def test_thousands_of_terms_are_refused_before_planning(served: Served, text: str) -> None:
    error = refused_sql(served, text, ("too_many_terms",))
    assert "SqlLimits.max_terms=1000" in error["message"]


def test_long_in_lists_within_the_limit_answer(served: Served) -> None:
    keys = [f"k{i:03d}" for i in range(900)]
    listed = ", ".join(f"'{k}'" for k in keys)
    response = sql(served, f"SELECT k, n FROM t WHERE k IN ({listed}) ORDER BY k")
    assert response.status_code == 200, response.text[:300]
    truth = expected_rows(T_HISTORY)
    expected = sorted((r["k"], r["n"]) for k, r in truth.items() if k in set(keys))
    assert [(r["k"], r["n"]) for r in response.json()["rows"]] == expected
