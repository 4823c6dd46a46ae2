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

Run: ``python -m bench.pgwire [--quick | --smoke]``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import httpx
import psycopg

from bench._changelog import key_name
from bench._common import Report, Scale, entry_point, median, percentile, scratch_dir
from bench.lookup import _build
from sparkiq import Node

TABLE = "lookup"


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
        "methods taking turns; client and node in one process",
        baseline="REST SQL (`POST /query`) on the same node in the same run",
        target="none (a comparison)",
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
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
