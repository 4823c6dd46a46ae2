"""A writer-only sparkiq pipeline run as its own process, for crash and restart tests.

Usage: python -m tests.spark.writer_process <input_dir> <state_dir>
Runs every input file through the ``totals`` table (sum and count per key), then exits 0.
Set SPARKIQ_TEST_CRASH_AT to make it die at a chosen point of a chosen batch.
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import functions as F

from sparkiq import App
from sparkiq.testing import spark_session

SCHEMA = "k string, v long"


def totals(df):  # type: ignore[no-untyped-def]
    return df.groupBy("k").agg(F.sum("v").alias("total"), F.count("*").alias("n"))


def writer_app(spark: Any, source: str, state_dir: str) -> App:
    """The ``totals`` pipeline over ``source`` (one file a batch) on ``spark``, not started:
    the process below and a test restarting it on the test's own session build the same."""
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    app = App(spark, state_dir=state_dir, name="writer")
    app.materialize("totals", totals(stream), key="k", partitions=3)
    return app


def main() -> int:
    source, state_dir = sys.argv[1], sys.argv[2]
    spark = spark_session("sparkiq-writer", shuffle_partitions=2)
    app = writer_app(spark, source, state_dir)
    app.start(local_node=False)
    app.process_all_available()
    app.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
