"""Attach (zero-change mode): what serving a query from its checkpoint costs the query, how
fresh it is, and how fast a large state restores.

Three measurements on one local[2] session:

* **Micro-batch duration** of the pipeline of ``bench.sink`` (``groupBy("k").agg(count,
  sum)``, one file of 10k rows per batch, 4 shuffle partitions), run three ways, alternating:
  *untouched* (the query alone, ``format("noop")``), *attached* (the same untouched query
  while ``sparkiq.attach`` tails its checkpoint in this process) and *materialize* (an
  ``App`` writing it through sparkiq's sink with a local node). Medians of
  ``durationMs.triggerExecution`` after warm-up; the ratios to untouched are the headline.
* **Commit -> queryable**: during the attached run a thread polls every millisecond for
  ``commits/<N>`` and for the handle having applied batch ``N`` in every partition; the
  latency is the difference (target: p50 <= 50 ms).
* **Restore**: a query aggregates ``KEYS`` distinct keys in one batch; ``sparkiq.attach``
  then restores the whole state (reading Spark's delta files, decoding the UnsafeRows into
  sparkiq keys and rows, writing RocksDB and the columnar versions) -- rows/s, against two
  floors measured on the same files right after: reading them alone (checksums, lz4 blocks,
  record framing: ``StateFiles.changes``) and reading plus converting every row
  (``CheckpointSource.read_changes``, the replica's whole share before the store write).

Run: ``python -m bench.attach [--quick | --smoke]``.
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import sparkiq
from bench._common import (
    Report,
    Scale,
    entry_point,
    median,
    percentile,
    scratch_dir,
    spark_session,
    write_json_rows,
)
from bench.sink import (
    KEYSPACE,
    _aggregation,
    _durations,
    _run_app,
    rows_per_file,
    warmup_batches,
    write_input,
)
from sparkiq.checkpoint.source import CheckpointCatalog

FRESHNESS_TARGET_MS = 50.0


def _run_untouched(spark: Any, source: str, root: str) -> list[tuple[int, int, int]]:
    query = (
        _aggregation(spark, source)
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", os.path.join(root, "checkpoint"))
        .start()
    )
    try:
        query.processAllAvailable()
        return _durations(query.recentProgress)
    finally:
        query.stop()


class _Freshness(threading.Thread):
    """Polls every millisecond: when ``commits/<N>`` appeared, when ``handle`` served N."""

    def __init__(self, checkpoint: str, handle: sparkiq.Attached, warmup: int) -> None:
        super().__init__(daemon=True)
        self.warmup = warmup
        self.commits = os.path.join(checkpoint, "commits")
        self.handle = handle
        self.committed: dict[int, float] = {}
        self.served: dict[int, float] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        next_commit = next_served = 0
        while not self.stop_event.is_set():
            now = time.perf_counter()
            while os.path.exists(os.path.join(self.commits, str(next_commit))):
                self.committed[next_commit] = now
                next_commit += 1
            if self.handle.tables:
                applied = self.handle.batch_id
                while next_served <= applied:
                    self.served[next_served] = now
                    next_served += 1
            time.sleep(0.001)

    def latencies_ms(self) -> list[float]:
        return [
            (self.served[b] - self.committed[b]) * 1000
            for b in sorted(self.committed)
            if b in self.served and b >= self.warmup
        ]


def _run_attached(
    spark: Any, source: str, root: str, latencies: list[float], warmup: int
) -> list[tuple[int, int, int]]:
    checkpoint = os.path.join(root, "checkpoint")
    query = (
        _aggregation(spark, source)
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        while not os.path.exists(os.path.join(checkpoint, "metadata")):
            time.sleep(0.01)
        handle = sparkiq.attach(checkpoint, name="bench", local_dir=os.path.join(root, "local"))
        watcher = _Freshness(checkpoint, handle, warmup)
        watcher.start()
        try:
            query.processAllAvailable()
            batch = int(query.lastProgress["batchId"])
            if not handle.wait_for(batch, timeout=120):
                raise RuntimeError(f"the attached handle did not reach batch {batch}")
            time.sleep(0.05)
            assert handle.get("bench_agg", "key-000000") is not None
        finally:
            watcher.stop_event.set()
            watcher.join()
            handle.close()
        latencies += watcher.latencies_ms()
        return _durations(query.recentProgress)
    finally:
        query.stop()


def _restore_floors(checkpoint: str, keys: int) -> tuple[float, float]:
    """Seconds to read the state files alone, and to read and convert them, for every
    partition of the one store (each the best of three: the floors are what the machine
    allows)."""
    catalog = CheckpointCatalog(checkpoint, "floor")
    (plan,) = catalog.plans()
    source = catalog.open(plan.name)
    record = source.read_commit(0)
    assert record is not None
    partitions = range(plan.info.partitions)

    def read() -> int:
        return sum(len(list(source.files(p).changes(1))) for p in partitions)

    def convert() -> int:
        return sum(len(source.read_changes(record, p)[0]) for p in partitions)

    best = {}
    for work in (read, convert):
        times = []
        for _ in range(3):
            started = time.perf_counter()
            rows = work()
            times.append(time.perf_counter() - started)
            if rows != keys:
                raise RuntimeError(f"{work.__name__} saw {rows} rows, expected {keys}")
        best[work.__name__] = min(times)
    return best["read"], best["convert"]


def _restore(spark: Any, root: str, keys: int) -> tuple[float, int, float, float]:
    from pyspark.sql import functions as F

    source = os.path.join(root, "big")
    os.makedirs(source)
    write_json_rows(source, 0, [(f"key-{i:08d}", i % 100) for i in range(keys)])
    checkpoint = os.path.join(root, "big-checkpoint")
    frame = spark.readStream.schema("k string, v long").json(source)
    query = (
        frame.groupBy("k")
        .agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.processAllAvailable()
    query.stop()
    started = time.perf_counter()
    with sparkiq.attach(checkpoint, name="big", local_dir=os.path.join(root, "big-local")) as h:
        if not h.wait_for(0, timeout=600):
            raise RuntimeError(f"restore did not finish: {h.status()}")
        seconds = time.perf_counter() - started
        rows = int(h.sql("SELECT count(*) AS n FROM big_agg").rows[0]["n"])
    if rows != keys:
        raise RuntimeError(f"restored {rows} rows, expected {keys}")
    read_s, convert_s = _restore_floors(checkpoint, keys)
    return seconds, rows, read_s, convert_s


def run(scale: Scale = Scale.FULL, spark: Any = None) -> Report:
    """``spark``: the session to run on (default: the local one of :func:`spark_session`)."""
    batches = scale.pick(12, 8, 1)
    rounds = scale.pick(3, 1, 1)
    keys = scale.pick(1_000_000, 100_000, 1_000)
    rows, warmup = rows_per_file(scale), warmup_batches(scale)
    report = Report(
        name="attach",
        title="Attach: serving a query from its checkpoint",
        measures=(
            "micro-batch duration of a streaming aggregation (one file of "
            f"{rows:,} rows per batch, keys drawn from {KEYSPACE:,}, local[2], 4 "
            f"shuffle partitions; {batches - warmup} batches per run after "
            f"{warmup} warm-up, {rounds} run(s) per mode, each round starting with "
            "the next mode), commit -> "
            f"queryable latency of the attached run, and the restore of a {keys:,}-key state"
        ),
        baseline='the same query untouched (`format("noop")`, nothing of sparkiq)',
        target=f"commit -> queryable p50 <= {FRESHNESS_TARGET_MS:.0f} ms",
        columns=["mode", "batches", "triggerExecution median ms", "ratio to untouched"],
        scale=scale,
    )
    rng = random.Random(13)
    results: dict[str, list[tuple[int, int, int]]] = {
        "untouched": [],
        "attached": [],
        "materialize": [],
    }
    latencies: list[float] = []
    previous: str | None = None
    with scratch_dir("attach") as root:
        spark = spark if spark is not None else spark_session()
        previous = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        try:
            source = write_input(os.path.join(root, "in"), batches, rng, rows)
            modes = {
                "untouched": lambda r: _run_untouched(spark, source, os.path.join(root, f"u{r}")),
                "attached": lambda r: _run_attached(
                    spark, source, os.path.join(root, f"a{r}"), latencies, warmup
                ),
                "materialize": lambda r: _run_app(spark, source, os.path.join(root, f"m{r}")),
            }
            order = list(modes)
            for r in range(rounds):
                # Each round starts with another mode: whatever the first query of a round
                # pays (codegen, page cache, JIT) must not fall on one mode every time.
                first = r % len(order)
                runs = {name: modes[name](r) for name in order[first:] + order[:first]}
                for name, found in runs.items():
                    if len(found) != batches:
                        raise RuntimeError(f"{name} ran {len(found)} batches, not {batches}")
                    results[name] += [d for d in found if d[0] >= warmup]
            restore_s, restored, read_s, convert_s = _restore(spark, root, keys)
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", previous)
    medians = {name: median([d[1] for d in found]) for name, found in results.items()}
    base = medians["untouched"]
    for name, value in medians.items():
        report.rows.append([name, str(len(results[name])), f"{value:,.0f}", f"{value / base:.2f}x"])
    p50 = percentile(latencies, 50) if latencies else float("nan")
    p99 = percentile(latencies, 99) if latencies else float("nan")
    report.readings = [
        f"attached: {medians['attached']:,.0f} ms per micro-batch, "
        f"{medians['attached'] / base:.2f}x untouched ({base:,.0f} ms); materialize: "
        f"{medians['materialize']:,.0f} ms, {medians['materialize'] / base:.2f}x.",
        f"commit -> queryable: p50 {p50:.0f} ms, p99 {p99:.0f} ms over {len(latencies)} "
        f"batches (target p50 <= {FRESHNESS_TARGET_MS:.0f} ms: "
        f"{'met' if p50 <= FRESHNESS_TARGET_MS else 'NOT met'}).",
        f"restore of {restored:,} keys from Spark's state files: {restore_s:.1f} s "
        f"({restored / restore_s:,.0f} rows/s); floors on the same files: reading them "
        f"{read_s:.2f} s ({restored / read_s:,.0f} rows/s, the restore takes "
        f"{restore_s / read_s:.1f}x), reading and converting every row to sparkiq's keys and "
        f"rows {convert_s:.2f} s ({restored / convert_s:,.0f} rows/s, "
        f"{convert_s / restore_s:.0%} of the restore).",
    ]
    report.figures = {
        "median_trigger_ms": medians,
        "freshness_ms": {"p50": p50, "p99": p99, "all": latencies},
        "restore": {
            "keys": restored,
            "seconds": restore_s,
            "rows_per_s": restored / restore_s,
            "read_files_s": read_s,
            "read_and_convert_s": convert_s,
        },
        "all_batches": results,
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
