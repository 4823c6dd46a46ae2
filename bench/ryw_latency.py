"""Read-your-writes: from a producer's send to its record being visible to a read.

A real Kafka broker (:func:`sparkiq.testing.kafka_broker`), a pipeline reading it with Spark's
Kafka source (a per-user count and sum, ``App.materialize``) at the demo's trigger (a
micro-batch every second), and a :class:`~sparkiq.Node` over the changelog in this process,
tailing it as an external reader does. Each sample sends one order for a new user (at a
random moment, so sends fall anywhere in the trigger interval), then:

* the **bounded read**: ``node.query`` of that user with ``PositionBound.after(ack)`` the
  moment the broker acknowledges the record; it returns once a committed batch has read the
  record, so the time from the send to its answer is read-your-writes latency;
* the **unbounded read**: a thread asking ``node.get`` for the user every millisecond, from
  the send until the row appears: the best a reader without a bound can do by polling.

The floor is the pipeline's own micro-batch duration (Spark's ``triggerExecution`` of the
batches in the same run): a record cannot be visible before a batch has read it, and a send
waits on average half a trigger interval for the next batch to start.

Run: ``python -m bench.ryw_latency [--quick | --smoke]``.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from bench._common import Report, Scale, entry_point, percentile, scratch_dir, spark_session
from sparkiq import App, KeyQuery, Node, PositionBound, StateQueryRequest
from sparkiq.testing import kafka_broker

TOPIC = "orders"
TABLE = "totals"
TRIGGER = "1 second"  # the demo's (sparkiq.demo)
SCHEMA = "user string, amount long"


def totals_pipeline(spark: Any, servers: str) -> Any:
    """Orders (``{"user", "amount"}`` JSON) from the topic, counted and summed per user."""
    from pyspark.sql import functions as F

    orders = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("o"))
        .select("o.*")
    )
    return orders.groupBy("user").agg(F.count("*").alias("orders"), F.sum("amount").alias("spent"))


def _send(producer: Any, user: str) -> Any:
    """Send one order for ``user``; the acknowledged message."""
    done = threading.Event()
    outcome: list[Any] = []

    def report(error: Any, message: Any) -> None:
        outcome.append(error if error is not None else message)
        done.set()

    value = json.dumps({"user": user, "amount": 1}).encode()
    producer.produce(TOPIC, key=user.encode(), value=value, on_delivery=report)
    while not done.is_set():
        producer.poll(0.001)
    if not hasattr(outcome[0], "offset"):
        raise RuntimeError(f"the broker did not acknowledge the order of {user}: {outcome[0]}")
    return outcome[0]


def _poll_until_visible(node: Node, user: str, stop: threading.Event, seen: list[float]) -> None:
    while not stop.is_set():
        if node.get(TABLE, user) is not None:
            seen.append(time.perf_counter())
            return
        time.sleep(0.001)


def run(scale: Scale = Scale.FULL, spark: Any = None) -> Report:
    """``spark``: the session to run on; it must have Spark's Kafka connector on its
    classpath (default: the local one of :func:`bench._common.spark_session`, started with
    it when ``make jvm-jars`` has fetched it)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    samples = scale.pick(40, 12, 1)
    report = Report(
        name="ryw_latency",
        title="Read-your-writes: Kafka send to visible",
        measures=(
            f"over {samples} orders, each for a new user and sent at a random moment: the time "
            "from the producer's send to a read that sees it, with a bound from the broker's "
            "acknowledgement and without (polling every millisecond); the pipeline triggers a "
            f"micro-batch every {TRIGGER} (the demo's)"
        ),
        baseline=(
            "the pipeline's own micro-batch duration (Spark's triggerExecution, same batches): "
            "no read can see a record before a batch has read it, and a send waits on average "
            "half a trigger interval for the next batch"
        ),
        target="bounded p50 <= micro-batch p50 + half the trigger interval + 100 ms",
        columns=["what", "samples", "p50 ms", "p99 ms", "max ms"],
        scale=scale,
    )
    spark = spark if spark is not None else spark_session()
    rng = random.Random(29)
    bounded: list[float] = []
    unbounded: list[float] = []
    with kafka_broker() as servers, scratch_dir("ryw") as root:
        admin = AdminClient({"bootstrap.servers": servers})
        admin.create_topics([NewTopic(TOPIC, num_partitions=4)])[TOPIC].result(timeout=60)
        producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
        _send(producer, "warm-up")
        state_dir = f"{root}/state"
        app = App(spark, state_dir=state_dir, name="ryw")
        app.materialize(
            TABLE,
            totals_pipeline(spark, servers),
            key="user",
            partitions=4,
            trigger={"processingTime": TRIGGER},
        )
        app.start()
        node: Node | None = None
        try:
            app.process_all_available(timeout=300)
            node = Node(state_dir, node_id="reader").start()
            assert node.wait_for(TABLE, 0, timeout=120), "the reader did not apply batch 0"
            for index in range(samples):
                time.sleep(rng.uniform(0.0, 1.0))
                user = f"user-{index}"
                stop, seen = threading.Event(), []
                poller = threading.Thread(
                    target=_poll_until_visible, args=(node, user, stop, seen), daemon=True
                )
                poller.start()
                sent = time.perf_counter()
                ack = _send(producer, user)
                request = (
                    StateQueryRequest.in_store(TABLE)
                    .with_query(KeyQuery.with_key(user))
                    .with_position_bound(PositionBound.after(ack))
                )
                answer = node.query(request).only_partition_result()
                answered = time.perf_counter()
                if not answer.is_success or answer.result is None:
                    raise RuntimeError(f"the bounded read of {user} missed its write: {answer}")
                bounded.append((answered - sent) * 1000)
                poller.join(60)
                stop.set()
                if not seen:
                    raise RuntimeError(f"{user} was not visible to the polling reader in 60 s")
                unbounded.append((seen[0] - sent) * 1000)
            progress = app.tables[TABLE].query.recentProgress
        finally:
            if node is not None:
                node.stop()
            app.stop()
            producer.flush(10)
    batches = [
        float(p["durationMs"]["triggerExecution"])
        for p in progress
        if p.get("numInputRows", 0) > 0 and "triggerExecution" in p.get("durationMs", {})
    ]
    if not batches:
        raise RuntimeError("Spark reported no micro-batch that read a record")

    def row(what: str, ms: Sequence[float]) -> list[str]:
        return [
            what,
            str(len(ms)),
            f"{percentile(ms, 50):.0f}",
            f"{percentile(ms, 99):.0f}",
            f"{max(ms):.0f}",
        ]

    report.rows += [
        row("micro-batch duration (floor)", batches),
        row("send -> bounded read answers", bounded),
        row("send -> unbounded polling sees it", unbounded),
    ]
    floor = percentile(batches, 50)
    expected = floor + 500.0  # half the trigger interval, on average, before the batch starts
    p50 = percentile(bounded, 50)
    report.readings = [
        f"bounded read p50 {p50:.0f} ms = micro-batch p50 {floor:.0f} ms + "
        f"{p50 - floor:.0f} ms (the average wait for the next trigger is 500 ms); "
        + ("met" if p50 <= expected + 100 else f"missed by {p50 - expected - 100:.0f} ms"),
        f"unbounded polling p50 {percentile(unbounded, 50):.0f} ms: a bound costs "
        f"{p50 - percentile(unbounded, 50):+.0f} ms at the median and needs no polling",
    ]
    report.figures = {
        "batch_ms": batches,
        "bounded_ms": bounded,
        "unbounded_ms": unbounded,
    }
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
