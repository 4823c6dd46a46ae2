"""A second streaming job reads a table's change feed (``readStream.format("sparkiq")``), is
killed with SIGKILL mid-stream and restarted from its checkpoint: its sink holds every change
of the table's history exactly once.

The consumer is this module run as a process (its own SparkSession and JVM)::

    python -m tests.spark.test_datasource_restart <state_dir> <out_dir> <checkpoint> run

``run`` streams one table batch per micro-batch until killed; the test then resumes its
checkpoint on its own session with ``Trigger.AvailableNow`` to the table's newest batch (the
rest in one micro-batch).
The sink is Spark's Parquet file sink, which is exactly-once with its own log; ground truth is
plain Python over the writer's input files. The writer materializes only ``orders`` (the
table the consumer reads), as the differential pipeline defines it.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App
from tests.spark.test_datasource import feed_rows, order_changes
from tests.spark.test_differential import SCHEMA, write_orders

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def consume(spark: Any, state_dir: str, out_dir: str, checkpoint: str, mode: str) -> None:
    """Stream the table's change feed into Parquet files until killed (``run``) or to its
    newest batch (``drain``)."""
    from sparkiq import register_data_source

    register_data_source(spark)
    reader = spark.readStream.format("sparkiq").option("state_dir", state_dir)
    if mode == "run":  # small micro-batches, so that the kill lands mid-stream
        reader = reader.option("max_batches_per_trigger", 1)
    writer = reader.load("orders").writeStream.format("parquet")
    writer = writer.option("checkpointLocation", checkpoint)
    if mode == "drain":  # the rest in one micro-batch: several table batches at once
        writer = writer.trigger(availableNow=True)
    query = writer.start(out_dir)
    query.awaitTermination()


def consumer_process(state_dir: str, out_dir: str, checkpoint: str, mode: str) -> int:
    from sparkiq.testing import spark_session

    spark = spark_session("sparkiq-feed-consumer", shuffle_partitions=2)
    consume(spark, state_dir, out_dir, checkpoint, mode)
    spark.stop()
    return 0


def start_consumer(state: Path, out: Path, checkpoint: Path, mode: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.spark.test_datasource_restart"]
    with open(checkpoint.parent / f"consumer-{mode}.log", "ab") as log:
        return subprocess.Popen(
            [*command, str(state), str(out), str(checkpoint), mode],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,  # its JVM is in its process group: killed with it
        )


def materialize_orders(app: App, stream: Any) -> None:
    """The differential pipeline's ``orders`` table (tests/spark/test_differential.py): the
    latest row per order, a deleted order a tombstone. Its other tables would only add
    writer work the consumer never reads."""
    from pyspark.sql import functions as F

    gone = (F.col("status") == "deleted").alias("gone")
    columns = stream.select("order_id", "product", "amount", "status", gone)
    app.materialize("orders", columns, key="order_id", partitions=6, tombstone="gone")


def committed_micro_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len([p for p in commits.iterdir() if p.name.isdigit()]) if commits.exists() else 0


def test_a_killed_consumer_resumes_and_sees_each_change_once(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    state, out, checkpoint = tmp_path / "state", tmp_path / "out", tmp_path / "checkpoint"
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    app = App(spark, state_dir=str(state), name="feed", snapshot_every=None, retention=None)
    materialize_orders(app, stream)
    app.start(local_node=False)
    rng = random.Random(99)
    try:
        for index in range(5):
            write_orders(source, index, rng, count=120)
            app.process_all_available()

        consumer = start_consumer(state, out, checkpoint, "run")
        try:
            deadline = time.monotonic() + 300
            while committed_micro_batches(checkpoint) < 2:  # past its first micro-batches
                assert consumer.poll() is None, "the consumer exited early"
                assert time.monotonic() < deadline, "the consumer made no progress"
                time.sleep(0.05)
        finally:
            os.killpg(consumer.pid, signal.SIGKILL)
            consumer.wait()
        done = committed_micro_batches(checkpoint)
        assert done < 5, "killed too late to test a restart"

        # more table batches while the consumer is down
        for index in range(5, 7):
            write_orders(source, index, rng, count=120)
            app.process_all_available()
        # restarted on the test's own session (a JVM fewer): what resumes is the killed
        # process's checkpoint, whichever process reads it
        consume(spark, str(state), str(out), str(checkpoint), "drain")
    finally:
        app.stop()

    rows = spark.read.parquet(str(out)).collect()
    got = feed_rows(rows)
    expected = order_changes(source)
    assert sum(got.values()) == len(rows)
    assert got == expected, (Counter(got) - expected, expected - Counter(got))
    assert max(n for n in got.values()) == 1  # each change once: no duplicates
    assert sorted({r["sparkiq_batch"] for r in rows}) == list(range(7))


if __name__ == "__main__":
    sys.exit(consumer_process(*sys.argv[1:5]))
