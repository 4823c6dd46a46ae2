"""Decoding a Spark checkpoint's state files: rows/s of sparkiq's UnsafeRow decoder against
the floor of reading the same bytes.

A streaming aggregation (``groupBy("k").agg(sum, count, min, max, avg)`` over a file source,
one micro-batch, HDFS-backed state store, lz4) writes its state's ``N.delta`` files. Then,
timed in this process, each repeated and the median kept:

* floor - reading the files: checksum files verified, lz4-java blocks decompressed and their
  XXH32 checked, the records split into key and value bytes (``HdfsStateFiles.changes``);
* decode - the same, then every key and value decoded into PySpark's values by the store's
  schemas (``RowDecoder.key`` / ``.value``: what the State Data Source differential tests use);
* convert - the same, then every key and value turned straight into sparkiq's encoded key and
  stored row (``StateRowConverter``), which is the work a replica adds per applied row.

All see the same rows (checked against the key count). Reported: rows/s of each and its cost
as a ratio of the floor; the target is the replica's path (convert).

Run: ``python -m bench.checkpoint_decode [--quick | --smoke]``.
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
    median,
    scratch_dir,
    spark_session,
    verdict,
    write_json_rows,
)
from sparkiq.checkpoint import Checkpoint, RowDecoder
from sparkiq.checkpoint.convert import StateRowConverter
from sparkiq.checkpoint.source import plan_tables

TARGET_ROWS_PER_S = 200_000.0


def run(scale: Scale = Scale.FULL, spark: Any = None) -> Report:
    """``spark``: the session to run on (default: the local one of :func:`spark_session`)."""
    from pyspark.sql import functions as F

    n_keys = scale.pick(200_000, 20_000, 500)
    repeats = scale.pick(5, 3, 1)
    report = Report(
        name="checkpoint_decode",
        title="Checkpoint state: decoding UnsafeRows vs reading the files",
        measures=(
            f"reading every row of a streaming aggregation's state files ({n_keys:,} keys: "
            "string key; sum, count, min, max, avg buffer), 4 partitions, lz4"
        ),
        baseline="reading the same files: checksums, lz4 framing, records (no row decoding)",
        target=f"the replica's path (convert) >= {TARGET_ROWS_PER_S:,.0f} rows/s",
        columns=["path", "median", "rows/s", "ratio"],
        scale=scale,
    )
    spark = spark if spark is not None else spark_session()
    rng = random.Random(7)
    with scratch_dir("checkpoint-decode") as root:
        source = os.path.join(root, "in")
        os.makedirs(source)
        write_json_rows(source, 0, [(f"key-{i:07d}", rng.randrange(1000)) for i in range(n_keys)])
        frame = spark.readStream.schema("k string, v long").json(source)
        agg = frame.groupBy("k").agg(F.sum("v"), F.count("*"), F.min("v"), F.max("v"), F.avg("v"))
        checkpoint = os.path.join(root, "ck")
        query = (
            agg.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        ck = Checkpoint(checkpoint)
        (store,) = ck.stores()
        files = [ck.files(store, p) for p in range(store.partitions)]
        decoder = RowDecoder(store)
        (plan,) = plan_tables("bench", [store])
        converter = StateRowConverter(
            plan.name,
            store.key_schema,
            store.value_schema,
            plan.schema,
            plan.key_paths,
            plan.value_indexes,
            plan.folds,
            store.describe(),
        )

        def read() -> int:
            return sum(1 for f in files for _ in f.changes(1))

        def decode() -> int:
            key, value, n = decoder.key, decoder.value, 0
            for f in files:
                for k, v in f.changes(1):
                    key(k)
                    value(v)  # type: ignore[arg-type]
                    n += 1
            return n

        def convert() -> int:
            return sum(len(converter.convert(f.changes(1))) for f in files)

        times: dict[str, list[float]] = {"read": [], "decode": [], "convert": []}
        for _ in range(repeats):
            for name, work in (("read", read), ("decode", decode), ("convert", convert)):
                t0 = time.perf_counter()
                rows = work()
                times[name].append(time.perf_counter() - t0)
                assert rows == n_keys, (name, rows)
    read_s, decode_s = median(times["read"]), median(times["decode"])
    convert_s = median(times["convert"])
    read_rate, decode_rate, convert_rate = n_keys / read_s, n_keys / decode_s, n_keys / convert_s
    report.rows = [
        ["floor: read files", f"{read_s * 1000:,.0f} ms", f"{read_rate:,.0f}", "1x (baseline)"],
        [
            "read + decode keys and values",
            f"{decode_s * 1000:,.0f} ms",
            f"{decode_rate:,.0f}",
            f"{decode_s / read_s:.1f}x the floor",
        ],
        [
            "read + convert to sparkiq keys and rows",
            f"{convert_s * 1000:,.0f} ms",
            f"{convert_rate:,.0f}",
            f"{convert_s / read_s:.1f}x the floor",
        ],
    ]
    report.readings = [
        f"The replica's path (convert) runs at {convert_rate:,.0f} rows/s: "
        + verdict(convert_rate, TARGET_ROWS_PER_S, "rows/s", at_most=False)
        + f"; it costs {convert_s / read_s:.1f}x reading the files (decoding into PySpark "
        f"values: {decode_rate:,.0f} rows/s, {decode_s / read_s:.1f}x)."
    ]
    report.figures = {
        "rows": n_keys,
        "read_median_s": read_s,
        "decode_median_s": decode_s,
        "read_rows_per_s": read_rate,
        "decode_rows_per_s": decode_rate,
        "convert_median_s": convert_s,
        "convert_rows_per_s": convert_rate,
        "ratio": decode_s / read_s,
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
