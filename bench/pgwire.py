"""Key lookups over the Postgres wire protocol against REST SQL, on one node, same run.

A table of 100k keys in 8 partitions is written by hand (no Spark) and served by one
:class:`~sparkiq.Node` (RocksDB) with both ``listen`` (REST) and ``pg_listen``. One client
at a time asks ``SELECT * FROM lookup WHERE k = '<random key>'``, taking turns so drift on
the shared machine hits every method alike:

* psycopg 3, extended protocol (``conn.execute``: Parse/Bind/Describe/Execute/Sync);
* psycopg 3, simple protocol (``ClientCursor``: one Query message);
* REST: ``POST /query`` with httpx on a keep-alive connection (JSON answer);

each round trip timed on its own (median, p99) and queries/s = 1 / mean. Client and node
share one process and the two cores, so the figures are sequential latency, not capacity.

Then capacity: a ``sparkiq serve`` process with ``--pg-listen`` and, as another process each,
a closed loop of 32 connections as fast as answers come: psycopg prepared key lookups
(:mod:`bench._pg_load`) against the REST GET of the same keys (:mod:`bench._http_load`),
taking turns; queries/s each, and their ratio (issue 28's target: >= 0.5x).

Run: ``python -m bench.pgwire [--quick | --smoke]``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import httpx
import psycopg

from bench._changelog import key_name
from bench._common import Report, Scale, entry_point, median, percentile, scratch_dir
from bench._flames import enabled as flames_enabled
from bench._flames import flame
from bench.http import _free_port, _serve, _stop, _wait, load, run_generator
from bench.lookup import _build
from sparkiq import Node

TABLE = "lookup"
CONNECTIONS = 32
CLOSED_TARGET = 0.5  # PG wire queries/s over the REST GET's, closed loop (issue 28)


def run(scale: Scale = Scale.FULL) -> Report:
    n_keys, rounds = scale.pick((100_000, 3_000), (20_000, 300), (1_000, 20))
    with scratch_dir("pgwire") as state_dir:
        _build(state_dir, n_keys, 8)
        node = Node(state_dir, listen="127.0.0.1:0", pg_listen="127.0.0.1:0")
        node.start()
        try:
            node.poll_once()
            assert node.pg_address is not None and node.url is not None
            host, port = node.pg_address
            pg = psycopg.connect(f"host={host} port={port} user=bench dbname=sparkiq")
            pg.autocommit = True
            simple = psycopg.ClientCursor(pg)
            http = httpx.Client(base_url=node.url, timeout=30)
            rng = random.Random(11)
            keys = [key_name(rng.randrange(n_keys)) for _ in range(rounds)]
            sample = node.sql(f"SELECT * FROM {TABLE} WHERE k = '{keys[0]}'").tuples()
            assert sample, "the benchmark keys must exist"

            def extended(key: str) -> None:
                rows = pg.execute(f"SELECT * FROM {TABLE} WHERE k = '{key}'").fetchall()
                assert len(rows) == 1

            def simple_query(key: str) -> None:
                simple.execute(f"SELECT * FROM {TABLE} WHERE k = '{key}'")
                assert len(simple.fetchall()) == 1

            def rest(key: str) -> None:
                answer = http.post(
                    "/query", json={"sql": f"SELECT * FROM {TABLE} WHERE k = '{key}'"}
                )
                assert answer.status_code == 200 and len(answer.json()["rows"]) == 1

            methods: dict[str, Callable[[str], None]] = {
                "REST: POST /query (httpx, JSON)": rest,
                "PG wire: psycopg extended protocol": extended,
                "PG wire: psycopg simple protocol": simple_query,
            }
            times: dict[str, list[float]] = {name: [] for name in methods}
            for key in keys[:50]:  # warm plans and connections
                for fn in methods.values():
                    fn(key)
            for key in keys:
                for name, fn in methods.items():
                    start = time.perf_counter()
                    fn(key)
                    times[name].append(time.perf_counter() - start)
            pg.close()
            http.close()
        finally:
            node.stop()
    report = Report(
        name="pgwire",
        title="Postgres wire protocol vs REST SQL: key lookups on one node",
        measures=f"`SELECT * FROM {TABLE} WHERE k = '<key>'` on random keys of a "
        f"{n_keys:,}-key, 8-partition table, {rounds:,} round trips per method, one at a time, "
        "methods taking turns; client and node in one process; then a closed loop of "
        f"{CONNECTIONS} connections per protocol against one `sparkiq serve`, taking turns",
        baseline="REST SQL (`POST /query`) on the same node in the same run; closed loop: the "
        "REST GET of the same keys on the same `sparkiq serve`",
        target=f"closed loop: PG wire >= {CLOSED_TARGET}x the REST GET (one at a time: none)",
        columns=["method", "p50 us", "p99 us", "queries/s", "vs REST"],
        scale=scale,
    )
    base = sum(times["REST: POST /query (httpx, JSON)"]) / rounds
    for name, values in times.items():
        mean = sum(values) / len(values)
        report.rows.append(
            [
                name,
                f"{median(values) * 1e6:,.0f}",
                f"{percentile(values, 99) * 1e6:,.0f}",
                f"{1 / mean:,.0f}",
                f"{base / mean:.2f}x",
            ]
        )
    pg_rate = rounds / sum(times["PG wire: psycopg extended protocol"])
    report.readings.append(
        f"PG wire (psycopg, extended): {pg_rate:,.0f} queries/s = {base * pg_rate:.2f}x REST SQL "
        f"({1 / base:,.0f} queries/s), one client at a time"
    )
    with scratch_dir("pgwire-closed") as state_dir:
        _build(state_dir, n_keys, 8)
        _closed_loop(report, state_dir, keys, scale)
    return report


def _closed_loop(report: Report, state_dir: str, keys: list[str], scale: Scale) -> None:
    """The closed-loop rows: a ``sparkiq serve`` process, 32 connections of each protocol."""
    duration, rounds = scale.pick((5.0, 3), (3.0, 2), (0.5, 1))
    http_port, pg_port = _free_port(), _free_port()
    node = _serve(
        state_dir, "bench", http_port, standbys=0, extra=["--pg-listen", f"127.0.0.1:{pg_port}"]
    )
    rates: dict[str, list[float]] = {"rest": [], "pg": []}
    latencies: dict[str, list[float]] = {"rest": [], "pg": []}
    errors, pg_cores = 0, []
    try:
        _wait(f"http://127.0.0.1:{http_port}", "/readyz")
        paths = [f"/stores/{TABLE}/keys/{k}" for k in keys]
        dsn = f"host=127.0.0.1 port={pg_port} user=bench dbname=sparkiq"
        runs: dict[str, Callable[[float], dict[str, Any]]] = {
            "rest": lambda seconds: load(http_port, paths, "closed", seconds),
            "pg": lambda seconds: _pg_closed(dsn, keys, seconds),
        }
        for run_one in runs.values():  # warm plans, connections and caches
            run_one(min(duration, 1.0))
        if flames_enabled():  # a pass of its own, the figures' runs left unsampled
            with flame("pgwire-prepared", pid=node.pid):
                runs["pg"](4.0)
        for turn in range(rounds):
            order = list(runs) if turn % 2 == 0 else list(reversed(runs))
            for name in order:
                result = runs[name](duration)
                rates[name].append(result["requests"] / result["seconds"])
                latencies[name].extend(result["latencies_us"])
                errors += result["errors"]
                if name == "pg":
                    pg_cores.append(result["cpu_seconds"] / result["seconds"])
    finally:
        _stop(node)
    rest, pg = median(rates["rest"]), median(rates["pg"])
    columns = ["closed loop, 32 connections each", "queries/s", "p50 us", "p99 us", "vs REST GET"]
    rows = [
        [name, f"{rate:,.0f}", f"{percentile(latencies[key], 50):,.0f}",
         f"{percentile(latencies[key], 99):,.0f}", f"{rate / rest:.2f}x"]
        for name, key, rate in (
            ("REST: GET /stores/{store}/keys/{key} (raw HTTP/1.1)", "rest", rest),
            ("PG wire: psycopg, prepared (extended protocol)", "pg", pg),
        )
    ]  # fmt: skip
    report.more_tables.append((columns, rows))
    met = "met" if pg / rest >= CLOSED_TARGET else "not met"
    report.readings.append(
        f"closed loop, {CONNECTIONS} connections each, one `sparkiq serve`: PG wire (psycopg, "
        f"prepared) {pg:,.0f} queries/s = {pg / rest:.2f}x the REST GET of the same keys "
        f"({rest:,.0f} req/s); target (>= {CLOSED_TARGET}x) {met}"
        + (f"; {errors} errors" if errors else "")
    )
    report.notes.append(
        f"The generators share the two cores with the node: psycopg's own Python took "
        f"{median(pg_cores):.2f} of a core per second of its runs, the rest went to the node "
        "(the HTTP generator writes prepared bytes to raw sockets)."
    )
    report.figures["closed_loop"] = {"rest_rps": rest, "pg_qps": pg, "errors": errors}


def _pg_closed(dsn: str, keys: list[str], duration: float) -> dict[str, Any]:
    """One closed-loop run of :mod:`bench._pg_load` in its own process."""
    spec = {
        "dsn": dsn,
        "keys": keys,
        "query": f"SELECT * FROM {TABLE} WHERE k = %s",
        "connections": CONNECTIONS,
        "duration": duration,
    }
    return run_generator("bench._pg_load", spec)


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
