"""One key's value through Spark's own state reader vs through ``App.get``.

A streaming aggregation (``groupBy("k").agg(count, sum)`` over a file source, 10k keys, one
micro-batch) is materialized by :class:`sparkiq.App`. Its Spark checkpoint then holds the
aggregation's state, so the same table can be read both ways:

* baseline - Spark's state data source, the way to read streaming state without sparkiq:
  ``spark.read.format("statestore").load(checkpoint).filter(col("key.k") == k).collect()``
  (a batch job over the checkpoint's state files), one call per key after a warm-up call;
* ``App.get(table, k)`` on the App's local node.

Both answer the same keys with the same counts (checked). Reported: median of 5 keys for
the state reader, median of many calls for ``App.get``, and their ratio.

Run: ``python -m bench.statestore [--quick | --smoke]``.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from bench._common import (
    Report,
    Scale,
    entry_point,
    fmt_ratio,
    median,
    percentile,
    scratch_dir,
    spark_session,
    verdict,
    write_json_rows,
)
from sparkiq import App

TABLE = "counts"
TARGET_RATIO = 10_000.0


def run(scale: Scale = Scale.FULL, spark: Any = None) -> Report:
    """``spark``: the session to run on (default: the local one of :func:`spark_session`)."""
    from pyspark.sql import functions as F

    n_keys, rows_per_key = scale.pick(10_000, 10_000, 500), 3
    n_state_reads = scale.pick(5, 3, 1)
    n_gets = scale.pick(100_000, 20_000, 200)
    report = Report(
        name="statestore",
        title="Key lookup: Spark's state reader vs App.get",
        measures=(
            f"reading one key of a streaming aggregation's state ({n_keys:,} keys, one batch, "
            "checkpoint on local disk)"
        ),
        baseline=(
            'Spark\'s state data source: `spark.read.format("statestore").load(checkpoint)'
            '.filter(col("key.k") == k).collect()`, reading the checkpoint of the very query '
            f"the App ran; median of {n_state_reads} keys after one warm-up read"
        ),
        target=f"`App.get` >= {TARGET_RATIO:,.0f}x faster (median vs median)",
        columns=["method", "median", "p99", "calls", "ratio"],
        scale=scale,
    )
    spark = spark if spark is not None else spark_session()
    rng = random.Random(5)
    keys = [f"key-{i:06d}" for i in range(n_keys)]
    with scratch_dir("statestore") as root:
        source = os.path.join(root, "in")
        os.makedirs(source)
        rows = [(k, rng.randrange(100)) for k in keys for _ in range(rows_per_key)]
        rng.shuffle(rows)
        write_json_rows(source, 0, rows)
        df = spark.readStream.schema("k string, v long").json(source)
        agg = df.groupBy("k").agg(F.count("*").alias("n"), F.sum("v").alias("total"))
        state_dir = os.path.join(root, "state")
        app = App(spark, state_dir=state_dir, name="bench")
        app.materialize(TABLE, agg, key="k", partitions=8)
        app.start()
        try:
            app.process_all_available()
            app.tables[TABLE].query.stop()  # state stays; nothing else runs while timing
            checkpoint = app.checkpoint_dir.rstrip("/") + "/" + TABLE

            def state_read(key: str) -> Any:
                return (
                    spark.read.format("statestore")
                    .load(checkpoint)
                    .filter(F.col("key.k") == key)
                    .collect()
                )

            t0 = time.perf_counter()
            first = state_read(keys[0])
            cold_s = time.perf_counter() - t0
            probes = rng.sample(keys, n_state_reads)
            state_times = []
            for key in probes:
                t0 = time.perf_counter()
                found = state_read(key)
                state_times.append(time.perf_counter() - t0)
                row = app.get(TABLE, key)
                assert row is not None and len(found) == 1, (key, row, found)
                state = found[0]["value"]  # the aggregation buffer: count, sum
                assert (state["count"], state["sum"]) == (row["n"], row["total"]), (found, row)
            assert first[0]["value"]["count"] == rows_per_key

            get = app.get
            sample = rng.choices(keys, k=n_gets)
            for key in sample[: min(2_000, n_gets // 2)]:
                get(TABLE, key)
            clock = time.perf_counter_ns
            get_ns = []
            for key in sample:
                t0 = clock()
                get(TABLE, key)
                get_ns.append(clock() - t0)
        finally:
            app.stop()

    state_med = median(state_times)
    get_med_s = median(get_ns) / 1e9
    speedup = state_med / get_med_s
    report.rows = [
        [
            "statestore reader: filter(key.k = k).collect()",
            f"{state_med * 1000:,.0f} ms",
            f"{max(state_times) * 1000:,.0f} ms (max)",
            str(len(state_times)),
            "1x (baseline)",
        ],
        [
            "App.get(table, k)",
            f"{get_med_s * 1e6:.1f} us",
            f"{percentile(get_ns, 99) / 1000:.1f} us",
            f"{len(get_ns):,}",
            f"{fmt_ratio(speedup)} faster",
        ],
    ]
    report.readings = [
        f"App.get is {speedup:,.0f}x faster than Spark's state reader: "
        + verdict(speedup, TARGET_RATIO, "x", at_most=False)
        + f". The first (cold) state read took {cold_s * 1000:,.0f} ms."
    ]
    report.figures = {
        "statestore_median_s": state_med,
        "statestore_cold_s": cold_s,
        "statestore_all_s": state_times,
        "app_get_median_us": get_med_s * 1e6,
        "app_get_p99_us": percentile(get_ns, 99) / 1000,
        "speedup": speedup,
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
