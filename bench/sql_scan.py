"""SQL pull queries in-process: scans and aggregates over 1M rows, and key lookups.

A table of 1M keys (``k string``, ``n long``, ``total double``) in 8 partitions is written by
hand (no Spark) and applied once by a :class:`~sparkiq.Node` (RocksDB). Then, taking turns
so drift on a shared machine hits every method alike:

* tier 2 filter scan - ``SELECT k, n, total FROM t WHERE n < 100 AND total > 500``;
* tier 3 group-by - ``SELECT n % 100 AS g, count(*), sum(total), avg(n) FROM t GROUP BY 1``;

each through ``node.sql`` (fragments per partition: RocksDB scan, rows to Arrow, DuckDB
filter or partial aggregate; then the final DuckDB query) and, as the floor, DuckDB alone
over the same rows already in one Arrow table in memory. A third line reads every partition
to Arrow without any SQL (``partition_table``), the part of the scan that is sparkiq's.

* key lookup - ``node.sql("SELECT * FROM t WHERE k = '<key>'")`` against ``node.get``, each
  call timed on its own.

Run: ``python -m bench.sql_scan [--quick]``.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from bench._changelog import HandWrittenTable, caught_up_node, key_name
from bench._common import Report, entry_point, fmt_ratio, median, percentile, scratch_dir
from sparkiq.sql import SqlEngine
from sparkiq.sql.fragment import SqlFragmentQuery, partition_table

TABLE = "t"
SCAN = f"SELECT k, n, total FROM {TABLE} WHERE n < 100 AND total > 500"
GROUP = f"SELECT n % 100 AS g, count(*) AS c, sum(total) AS s, avg(n) AS a FROM {TABLE} GROUP BY 1"


def _build(state_dir: str, n_rows: int, partitions: int) -> tuple[pa.Table, list[str]]:
    table = HandWrittenTable(state_dir, TABLE, partitions)
    rng = random.Random(3)
    keys = [key_name(i) for i in range(n_rows)]
    ns = [rng.randrange(0, 10_000) for _ in keys]
    totals = [rng.random() * 1000 for _ in keys]
    chunk = 200_000
    changes: dict[int, dict[bytes, bytes | None]] = {}
    for start in range(0, n_rows, chunk):
        part = table.encode(
            keys[start : start + chunk], ns[start : start + chunk], totals[start : start + chunk]
        )
        for p, c in part.items():
            changes.setdefault(p, {}).update(c)
    table.write_batch(0, changes)
    arrow = pa.table(
        {
            "k": pa.array(keys, pa.string()),
            "n": pa.array(ns, pa.int64()),
            "total": pa.array(totals, pa.float64()),
        }
    )
    return arrow, keys


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _per_call_us(fn: Callable[[Any], Any], args: Sequence[Any]) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    for arg in args:
        t0 = clock()
        fn(arg)
        out.append((clock() - t0) / 1000)
    return out


def run(quick: bool = False) -> Report:
    n_rows, partitions = (200_000 if quick else 1_000_000), 8
    rounds = 3 if quick else 5
    n_lookups = 20_000 if quick else 100_000
    report = Report(
        name="sql_scan",
        title="SQL pull queries in-process",
        measures=(
            f"wall time of a tier 2 filter scan and a tier 3 group-by over {n_rows:,} rows "
            f"({partitions} partitions, RocksDB), median of {rounds} runs; per-call latency of "
            f"{n_lookups:,} SQL key lookups"
        ),
        baseline=(
            "scans: DuckDB alone over the same rows in one in-memory Arrow table (no storage, "
            "no decoding); lookups: `node.get`"
        ),
        target="lookups within a small multiple of node.get (tens of us)",
        columns=["query", "method", "median", "vs floor"],
        quick=quick,
    )
    with scratch_dir("sqlscan") as root:
        state_dir = os.path.join(root, "state")
        t0 = time.perf_counter()
        arrow, keys = _build(state_dir, n_rows, partitions)
        with caught_up_node(state_dir, partitions) as node:
            built_s = time.perf_counter() - t0
            engine = SqlEngine(node)
            floor = duckdb.connect(":memory:")
            floor.register(TABLE, arrow)
            stores = [r.store for r in node.replica(TABLE).partitions.values()]
            fragment = SqlFragmentQuery(("k", "n", "total"))

            def to_arrow() -> int:
                return sum(partition_table(s, fragment)[0].num_rows for s in stores)

            for sql in (SCAN, GROUP):  # warm-up and a correctness check against the floor
                got = sorted(map(repr, engine.execute(sql).tuples()))
                want = sorted(repr(tuple(r)) for r in floor.execute(sql).fetchall())
                assert len(got) == len(want), (sql, len(got), len(want))
            times: dict[str, list[float]] = {}
            for _ in range(rounds):
                for name, fn in {
                    "scan: node.sql": lambda: engine.execute(SCAN),
                    "scan: DuckDB over Arrow (floor)": lambda: floor.execute(SCAN).fetchall(),
                    "group-by: node.sql": lambda: engine.execute(GROUP),
                    "group-by: DuckDB over Arrow (floor)": lambda: floor.execute(GROUP).fetchall(),
                    "all partitions to Arrow (no SQL)": to_arrow,
                }.items():
                    times.setdefault(name, []).append(_timed(fn))
            medians = {name: median(values) for name, values in times.items()}
            for query, prefix in (("tier 2 filter scan", "scan"), ("tier 3 group-by", "group-by")):
                base = medians[f"{prefix}: DuckDB over Arrow (floor)"]
                for method in ("node.sql", "DuckDB over Arrow (floor)"):
                    value = medians[f"{prefix}: {method}"]
                    report.rows.append(
                        [query, method, f"{value * 1000:,.1f} ms", fmt_ratio(value / base)]
                    )
            decode = medians["all partitions to Arrow (no SQL)"]
            report.rows.append(
                [
                    "(part of both)",
                    "RocksDB scan + rows to Arrow",
                    f"{decode * 1000:,.1f} ms",
                    fmt_ratio(decode / medians["scan: DuckDB over Arrow (floor)"]),
                ]
            )

            rng = random.Random(5)
            sample = rng.choices(keys, k=n_lookups)
            texts = [f"SELECT * FROM {TABLE} WHERE k = '{k}'" for k in sample]
            assert engine.execute(texts[0]).rows == [node.get(TABLE, sample[0])]
            sql_us: list[float] = []
            get_us: list[float] = []
            step = max(1, n_lookups // 10)
            for start in range(0, n_lookups, step):  # take turns
                sql_us += _per_call_us(engine.execute, texts[start : start + step])
                get_us += _per_call_us(lambda k: node.get(TABLE, k), sample[start : start + step])
            sql_p50, get_p50 = percentile(sql_us, 50), percentile(get_us, 50)
            report.rows.append(["key lookup", "node.get", f"{get_p50:.1f} us", "1.0x"])
            report.rows.append(
                [
                    "key lookup",
                    "node.sql (Python path)",
                    f"{sql_p50:.1f} us",
                    fmt_ratio(sql_p50 / get_p50),
                ]
            )
            report.readings.append(
                f"filter scan {medians['scan: node.sql'] * 1000:,.0f} ms vs floor "
                f"{medians['scan: DuckDB over Arrow (floor)'] * 1000:,.1f} ms; group-by "
                f"{medians['group-by: node.sql'] * 1000:,.0f} ms vs floor "
                f"{medians['group-by: DuckDB over Arrow (floor)'] * 1000:,.1f} ms; SQL key lookup "
                f"p50 {sql_p50:.1f} us = {sql_p50 / get_p50:.1f}x node.get (p99 "
                f"{percentile(sql_us, 99):.1f} us)"
            )
            report.notes.append(f"table built and applied in {built_s:.1f} s")
            report.figures.update(
                {"medians_s": medians, "lookup_p50_us": {"sql": sql_p50, "get": get_p50}}
            )
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
