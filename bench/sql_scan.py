"""SQL pull queries in-process: scans and aggregates over 1M rows, and key lookups.

A table of 1M keys (``k string``, ``n long``, ``total double``) in 8 partitions is written by
hand (no Spark) and applied once by a :class:`~sparkiq.Node` (RocksDB plus Arrow versions).
Then, taking turns so drift on a shared machine hits every method alike:

* tier 2 filter scan - ``SELECT k, n, total FROM t WHERE n < 100 AND total > 500``;
* tier 3 group-by - ``SELECT n % 100 AS g, count(*), sum(total), avg(n) FROM t GROUP BY 1``;
* tier 2 top-N - ``SELECT k, n, total FROM t ORDER BY total DESC LIMIT 10``;

each through ``node.sql`` (the columnar path: every partition's Arrow version at one batch,
one DuckDB query), through the fragment path a cluster uses for partitions on other nodes
(forced here by hiding the columnar source: one fragment run over the node's partitions,
then the final query), through a cluster of two nodes over HTTP where each hosts half the
partitions (no standbys: neither can read the table alone, so each answers one fragment and
the node asked merges them), and, as the floor, DuckDB alone over the same rows in a native
in-memory DuckDB table (and, for reference, registered as Arrow).
A last line reads every partition from RocksDB into Arrow, what scans cost before versions.

* key lookup - ``node.sql("SELECT * FROM t WHERE k = '<key>'")`` against ``node.get``, each
  call timed on its own.
* join with key lookups - 20 keys of ``t`` (``k IN (...)``) joined to a 100-row table
  ``groups`` (2 partitions): the looked-up rows reach DuckDB as Arrow, read by one request
  per table; through ``node.sql``, the per-partition fragment path and, as the floor, DuckDB
  over native tables; each call timed on its own.

Run: ``python -m bench.sql_scan [--quick | --smoke]``.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from bench._changelog import as_arrow, caught_up_node, key_name, open_table
from bench._common import Report, Scale, entry_point, fmt_ratio, median, percentile, scratch_dir
from bench._flames import flame_calls
from sparkiq.sql import SqlEngine
from sparkiq.sql.fragment import SqlFragmentQuery, _without_cyclic_gc
from sparkiq.sql.fragment import _partition_table as _rocksdb_table
from sparkiq.testing import start_cluster, write_table

TABLE = "t"
SCAN = f"SELECT k, n, total FROM {TABLE} WHERE n < 100 AND total > 500"
GROUP = f"SELECT n % 100 AS g, count(*) AS c, sum(total) AS s, avg(n) AS a FROM {TABLE} GROUP BY 1"
TOP_N = f"SELECT k, n, total FROM {TABLE} ORDER BY total DESC LIMIT 10"
QUERIES = {"tier 2 filter scan": SCAN, "tier 3 group-by": GROUP, "tier 2 top-N": TOP_N}
GROUPS = [{"g": g, "label": f"group {g}"} for g in range(100)]
JOIN = (
    f"SELECT t.k, t.total, g.label FROM {TABLE} AS t JOIN groups AS g ON t.n % 100 = g.g "
    "WHERE t.k IN ({keys})"
)


class _Fragments:
    """The node as a plain QuerySource (not a ColumnarSource): statements then read every
    partition through fragments, as a cluster does for partitions hosted elsewhere."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.tables = source.tables
        self.schema = source.schema
        self.partition_count = source.partition_count
        self.query = source.query


def _build(state_dir: str, n_rows: int, partitions: int) -> tuple[pa.Table, list[str]]:
    table = open_table(state_dir, TABLE, partitions)
    rng = random.Random(3)
    keys = [key_name(i) for i in range(n_rows)]
    ns = [rng.randrange(0, 10_000) for _ in keys]
    totals = [rng.random() * 1000 for _ in keys]
    chunk = 200_000
    changes: dict[int, dict[bytes, bytes | None]] = {}
    for start in range(0, n_rows, chunk):
        part = table.changes(
            as_arrow(
                keys[start : start + chunk],
                ns[start : start + chunk],
                totals[start : start + chunk],
            )
        )
        for p, c in part.items():
            changes.setdefault(p, {}).update(c)
    table.write_changes(batch_id=0, changes=changes)
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


def run(scale: Scale = Scale.FULL) -> Report:
    n_rows, partitions = scale.pick(1_000_000, 200_000, 2_000), 8
    rounds = scale.pick(5, 3, 1)
    n_lookups = scale.pick(100_000, 20_000, 200)
    report = Report(
        name="sql_scan",
        title="SQL pull queries in-process",
        measures=(
            f"wall time of a tier 2 filter scan, a tier 3 group-by and a tier 2 top-N over "
            f"{n_rows:,} rows ({partitions} partitions), median of {rounds} runs; per-call "
            f"latency of {n_lookups:,} SQL key lookups"
        ),
        baseline=(
            "scans: DuckDB alone over the same rows in a native in-memory DuckDB table (no "
            "storage, no decoding); lookups: `node.get`"
        ),
        target=(
            "scans <= 5x the native DuckDB table; lookups within a small multiple of node.get "
            "(tens of us)"
        ),
        columns=["query", "method", "median", "vs floor"],
        scale=scale,
    )
    with scratch_dir("sqlscan") as root:
        state_dir = os.path.join(root, "state")
        t0 = time.perf_counter()
        arrow, keys = _build(state_dir, n_rows, partitions)
        with caught_up_node(state_dir, partitions) as node, contextlib.ExitStack() as stack:
            built_s = time.perf_counter() - t0
            engine = SqlEngine(node._lookup)
            fragments = SqlEngine(_Fragments(node._lookup))  # type: ignore[arg-type]
            floor = duckdb.connect(":memory:")
            floor.register("arrow_rows", arrow)
            floor.execute(f"CREATE TABLE {TABLE} AS SELECT * FROM arrow_rows")
            as_arrow = duckdb.connect(":memory:")
            as_arrow.register(TABLE, arrow)
            stores = [r.store for r in node.replica(TABLE).partitions.values()]
            fragment = SqlFragmentQuery(("k", "n", "total"))

            def from_rocksdb() -> int:
                with _without_cyclic_gc():  # as scans read RocksDB
                    return sum(_rocksdb_table(s, fragment)[0].num_rows for s in stores)

            cluster = stack.enter_context(
                start_cluster(state_dir, 2, standbys=0, settle_timeout=300)
            )
            asked = cluster[0]
            for sql in QUERIES.values():  # warm-up and a correctness check against the floor
                want = sorted(repr(tuple(r)) for r in floor.execute(sql).fetchall())
                for which in (engine.execute, fragments.execute, asked.sql):
                    got = sorted(map(repr, which(sql).tuples()))
                    assert got == want or len(got) == len(want), (sql, len(got), len(want))
            times: dict[str, list[float]] = {}
            methods: dict[str, Callable[[str], Any]] = {
                "node.sql (columnar)": engine.execute,
                "node.sql (fragments)": fragments.execute,
                "2 nodes over HTTP, half each": asked.sql,
                "DuckDB native table (floor)": lambda q: floor.execute(q).fetchall(),
                "DuckDB over Arrow": lambda q: as_arrow.execute(q).fetchall(),
            }
            for _ in range(rounds):
                for query, sql in QUERIES.items():
                    for method, fn in methods.items():
                        times.setdefault(f"{query}: {method}", []).append(
                            _timed(lambda f=fn, q=sql: f(q))  # type: ignore[misc]
                        )
                times.setdefault("RocksDB to Arrow", []).append(_timed(from_rocksdb))
            medians = {name: median(values) for name, values in times.items()}
            flame_calls("sql_scan-columnar", engine.execute, list(QUERIES.values()))
            flame_calls("sql_scan-two-nodes", asked.sql, list(QUERIES.values()))
            for query in QUERIES:
                base = medians[f"{query}: DuckDB native table (floor)"]
                for method in methods:
                    value = medians[f"{query}: {method}"]
                    report.rows.append(
                        [query, method, f"{value * 1000:,.1f} ms", fmt_ratio(value / base)]
                    )
            decode = medians["RocksDB to Arrow"]
            report.rows.append(
                [
                    "(before versions)",
                    "RocksDB scan + rows to Arrow, no SQL",
                    f"{decode * 1000:,.1f} ms",
                    fmt_ratio(decode / medians["tier 2 filter scan: DuckDB native table (floor)"]),
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

            def against_floor(method: str) -> str:
                """Each query's median by ``method`` and its ratio to the floor."""
                return ", ".join(
                    f"{query} {medians[f'{query}: {method}'] * 1000:,.1f} ms = "
                    + fmt_ratio(
                        medians[f"{query}: {method}"]
                        / medians[f"{query}: DuckDB native table (floor)"]
                    )
                    for query in QUERIES
                )

            ratios = against_floor("node.sql (columnar)")
            spread = against_floor("2 nodes over HTTP, half each")
            report.readings.append(
                f"two nodes over HTTP, each hosting half the partitions, against a native "
                f"DuckDB table: {spread} (target <= 3x)"
            )
            report.readings.append(
                f"against a native DuckDB table: {ratios} (target <= 5x); SQL key lookup "
                f"p50 {sql_p50:.1f} us = {sql_p50 / get_p50:.1f}x node.get (p99 "
                f"{percentile(sql_us, 99):.1f} us)"
            )
            join_ms = _join_with_lookups(node, state_dir, keys, floor, rng, n_lookups)
            for method, value in join_ms.items():
                ratio = fmt_ratio(value / join_ms["DuckDB native tables (floor)"])
                report.rows.append(["join with key lookups", method, f"{value:,.2f} ms", ratio])
            report.readings.append(
                "join with 20 key lookups: "
                + ", ".join(f"{method} {value:,.2f} ms" for method, value in join_ms.items())
            )
            report.notes.append(f"table built and applied in {built_s:.1f} s")
            report.figures.update(
                {
                    "medians_s": medians,
                    "lookup_p50_us": {"sql": sql_p50, "get": get_p50},
                    "join_with_key_lookups_ms": join_ms,
                }
            )
    return report


def _join_with_lookups(
    node: Any,
    state_dir: str,
    keys: list[str],
    floor: duckdb.DuckDBPyConnection,
    rng: random.Random,
    n_lookups: int,
) -> dict[str, float]:
    """Median ms of a 20-key lookup joined to ``groups``, per method (taking turns)."""
    write_table(state_dir, "groups", GROUPS, key="g", partitions=2)
    node.refresh_tables()
    node.poll_once()
    engine = SqlEngine(node._lookup)
    fragments = SqlEngine(_Fragments(node._lookup))
    floor.register("groups_rows", pa.Table.from_pylist(GROUPS))
    floor.execute("CREATE TABLE groups AS SELECT * FROM groups_rows")
    texts = [
        JOIN.format(keys=", ".join(f"'{k}'" for k in rng.sample(keys, 20)))
        for _ in range(max(20, n_lookups // 200))
    ]
    methods: dict[str, Callable[[str], Any]] = {
        "node.sql (columnar)": engine.execute,
        "node.sql (fragments)": fragments.execute,
        "DuckDB native tables (floor)": lambda q: floor.execute(q).fetchall(),
    }
    want = sorted(map(repr, floor.execute(texts[0]).fetchall()))
    for which in (engine, fragments):  # warm-up and a correctness check
        assert sorted(map(repr, which.execute(texts[0]).tuples())) == want
    times: dict[str, list[float]] = {method: [] for method in methods}
    step = max(1, len(texts) // 10)
    for start in range(0, len(texts), step):  # take turns
        for method, fn in methods.items():
            times[method] += _per_call_us(fn, texts[start : start + step])
    return {method: median(values) / 1000 for method, values in times.items()}


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
