"""The Kafka round a standalone cluster's driver runs (tests/spark/standalone_driver.py, for
tests/spark/test_standalone.py): the executor reads the topic.

:func:`kafka_round` creates ``topic`` on the broker at ``servers``, materializes the Kafka
differential's three tables from it (tests/kafka/differential.py), produces the
differential's first round of records and checks every table against Spark batch mode over
the topic (computed on the same cluster) and the records the broker acknowledged, appending
one JSON line to ``report``. A failed check raises its AssertionError.

One round: what a cluster changes (the executor, its own JVM, reads the topic with the
connector the driver ships it, and runs the three pipelines' tasks) is all in the first
round; the later rounds test the watermark and positions across micro-batches, the same on
any master (tests/kafka/test_kafka_source.py), each round here costing a micro-batch and
three batch jobs on the cluster.
"""

from __future__ import annotations

import json
import time
from typing import Any

from sparkiq import App
from tests.kafka.differential import KafkaDifferential

#: The differential's rounds run on the cluster (see above).
ROUNDS = 1


def kafka_round(spark: Any, servers: str, topic: str, state_dir: str, report: str) -> None:
    """The Kafka differential's first :data:`ROUNDS` rounds on ``spark`` (a session with
    Spark's Kafka connector), one report line each."""
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
