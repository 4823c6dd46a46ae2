"""A sparkiq driver against a Spark standalone master, run as its own process by
tests/spark/test_standalone.py.

Usage: python -m tests.spark.standalone_driver <master> <staged> <source> <state_dir> <report>
       [<servers> <topic> <kafka_state_dir> <kafka_report>]

Runs the differential pipeline (tests/spark/test_differential.py, without its windowed table
to keep one core's work small) with ``state_dir`` exactly as given (a relative path means
relative to this process's working directory). It first
processes what ``<source>`` already holds (a restart resumes there), then moves the files of
``<staged>`` into ``<source>`` one at a time. After each step it waits until the App applied
every committed batch and compares every table's live rows with Spark batch mode over
``<source>`` (computed on the same cluster), appending one JSON line per step to ``<report>``
and keeping the newest ground truth, pickled, in ``<report>.truth``.
It ends with :meth:`App.compact`. ``SPARKIQ_TEST_CRASH_AT`` makes it die midway.

Given a Kafka broker's ``<servers>``, it then runs the Kafka round
(:func:`tests.spark.standalone_kafka.kafka_round`) with the cluster's executor reading
``<topic>``: the same driver and executor serve both pipelines, one JVM of each fewer than
a driver of its own would start. Spark's Kafka connector reaches the executor through
``spark.jars``. It exits 0.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from sparkiq import App
from sparkiq.testing import diff_table, spark_kafka_jars, spark_session
from tests.spark.short_jvm import executor_conf
from tests.spark.standalone_kafka import kafka_round
from tests.spark.test_differential import SCHEMA, aggregations, materialize_tables, normalize

#: Room for one executor with one core next to the test's own JVMs on a small machine.
CLUSTER_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.executor.memory": "512m",
    "spark.executor.cores": "1",
    "spark.cores.max": "1",
}


def batch_truth(spark: Any, source: Path) -> dict[str, dict[Any, dict[str, Any]]]:
    """The three tables computed by Spark in batch mode over every file so far, by key."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    df = spark.read.schema(SCHEMA + ", seq long").json(str(source))
    tables = aggregations(df.drop("seq"))
    truth = {
        "by_product": {r["product"]: r.asDict(True) for r in tables["by_product"].collect()},
        "by_user_day": {
            (r["user_id"], r["day"]): r.asDict(True) for r in tables["by_user_day"].collect()
        },
    }
    newest = Window.partitionBy("order_id").orderBy(F.desc("seq"))
    latest = (
        df.withColumn("rank", F.row_number().over(newest))
        .filter("rank = 1 AND status != 'deleted'")
        .select("order_id", "product", "amount", "status")
    )
    truth["orders"] = {r["order_id"]: r.asDict(True) for r in latest.collect()}
    return truth


def main() -> int:
    master, staged, source, state_dir, report = sys.argv[1:6]
    kafka = sys.argv[6:10]
    config = {**CLUSTER_CONF, **executor_conf()}
    if kafka:  # spark.jars counts only when the JVM starts: this is its first session
        config["spark.jars"] = ",".join(spark_kafka_jars())
    spark = spark_session(
        "sparkiq-standalone",
        master=master,
        shuffle_partitions=1,  # one core: each stateful stage is one task
        driver_memory="768m",
        config=config,
    )
    source_dir = Path(source).resolve()
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source_dir))
    # Snapshots are left to compact() at the end: the same Spark job on the executors.
    app = App(spark, state_dir=state_dir, name="standalone", snapshot_every=None)
    materialize_tables(app, stream, per_window=False)
    app.start()

    started = time.monotonic()

    def check() -> None:
        app.process_all_available(timeout=300)
        truth = batch_truth(spark, source_dir)
        diffs = {
            name: diff_table(app, name, list(rows.values()), normalize=normalize)
            for name, rows in truth.items()
        }
        # The newest truth, for the test's own reader (a trusted file of this test).
        Path(report + ".truth").write_bytes(pickle.dumps(truth))
        line = {
            "seconds": round(time.monotonic() - started, 1),
            "files": len(list(source_dir.glob("*.json"))),
            "cwd": os.getcwd(),
            "state_dir": app.state_dir,
            "rows": {name: len(rows) for name, rows in truth.items()},
            "diffs": {name: "" if d.is_empty else str(d) for name, d in diffs.items()},
        }
        with open(report, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")

    if any(source_dir.glob("*.json")):
        check()
    for staged_file in sorted(Path(staged).glob("*.json")):
        staged_file.rename(source_dir / staged_file.name)
        check()
    app.compact()
    app.stop()
    try:
        if kafka:
            kafka_round(spark, *kafka)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
