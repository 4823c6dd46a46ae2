"""A sparkiq driver reading Kafka, run as its own process, for crash and restart tests.

Usage: python -m tests.kafka.writer_process <bootstrap_servers> <topic> <state_dir>
Materializes the orders of ``topic`` (tests/kafka/pipeline.py: count and sum per user) as
table ``totals``, at most 40 records a batch so that a few records make several batches,
until the topic's records are all processed, then exits 0. Set SPARKIQ_TEST_CRASH_AT
(sparkiq.spark.sink.CRASH_ENV) to make it die at a chosen point of a chosen batch.
"""

from __future__ import annotations

import sys
from typing import Any

from sparkiq import App
from sparkiq.testing import spark_kafka_jars, spark_session
from tests.kafka.pipeline import KAFKA_POLLING_DELAY, parse, stream, totals

#: Records per batch, over all partitions (Spark's ``maxOffsetsPerTrigger``).
BATCH_RECORDS = 40


def writer_app(spark: Any, bootstrap_servers: str, topic: str, state_dir: str) -> App:
    """The ``totals`` pipeline over ``topic`` on ``spark``, not started: the process below
    and a test restarting it on the test's own session build the same."""
    records = stream(spark, bootstrap_servers, topic, maxOffsetsPerTrigger=str(BATCH_RECORDS))
    app = App(spark, state_dir=state_dir, name="kafka-writer")
    app.materialize("totals", totals(parse(records)), key="user", partitions=4)
    return app


def main() -> int:
    bootstrap_servers, topic, state_dir = sys.argv[1:4]
    # spark.jars counts only when the JVM starts: this is the process's first session
    config = {
        "spark.jars": ",".join(spark_kafka_jars()),
        "spark.sql.streaming.pollingDelay": KAFKA_POLLING_DELAY,  # as the tests' sessions
    }
    spark = spark_session("sparkiq-kafka-writer", shuffle_partitions=2, config=config)
    app = writer_app(spark, bootstrap_servers, topic, state_dir)
    app.start(local_node=False)
    app.process_all_available()
    app.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
