"""A sparkiq driver whose executors read Kafka, against a Spark standalone master, run as its
own process by tests/spark/test_standalone.py.

Usage: python -m tests.spark.standalone_kafka_driver <master> <servers> <topic> <state_dir> <report>

Runs the Kafka differential (tests/kafka/differential.py) on the cluster: it creates
``<topic>`` on the broker at ``<servers>``, materializes the three tables from it, produces
the differential's first round of records and checks every table against Spark batch mode
over the topic (computed on the same cluster) and the records the broker acknowledged,
appending one JSON line to ``<report>``. A failed check ends it with the AssertionError's
traceback and a non-zero exit; it exits 0 after the round.

One round: what a cluster changes (the executor, its own JVM, reads the topic with the
connector the driver ships it, and runs the three pipelines' tasks) is all in the first
round; the later rounds test the watermark and positions across micro-batches, the same on
any master (tests/kafka/test_kafka_source.py), each round here costing a micro-batch and
three batch jobs on the cluster.

Spark's Kafka connector reaches the executors through ``spark.jars``: the driver serves the
jars and each executor fetches them into its working directory before its first task.
"""

from __future__ import annotations

import json
import sys
import time

from sparkiq import App
from sparkiq.testing import spark_kafka_jars, spark_session
from tests.kafka.differential import KafkaDifferential
from tests.spark.short_jvm import executor_conf
from tests.spark.standalone_driver import CLUSTER_CONF

#: The differential's rounds run on the cluster (see above).
ROUNDS = 1


def main() -> int:
    master, servers, topic, state_dir, report = sys.argv[1:6]
    spark = spark_session(
        "sparkiq-standalone-kafka",
        master=master,
        shuffle_partitions=1,  # one core: each stateful stage is one task
        driver_memory="768m",
        config={**CLUSTER_CONF, **executor_conf(), "spark.jars": ",".join(spark_kafka_jars())},
    )
    differential = KafkaDifferential(spark, servers, topic)
    differential.create_topic()
    app = App(spark, state_dir=state_dir, name="standalone-kafka", snapshot_every=None)
    differential.materialize(app)
    app.start()
    started = time.monotonic()
    try:
        for rows in differential.run(app, app.state_dir, seed=27, rounds=ROUNDS):
            line = {"seconds": round(time.monotonic() - started, 1), "rows": rows}
            with open(report, "a", encoding="utf-8") as out:
                out.write(json.dumps(line) + "\n")
    finally:
        app.stop()
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
