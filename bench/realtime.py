"""Real-time mode: a Kafka send to a queryable answer, against micro-batches with the sink.

One stateful pipeline over a real Kafka broker -- orders (``{"user", "amount"}`` JSON) read
with Spark's Kafka source, ``groupBy("user").agg(count, sum)``, update mode -- run twice on
the same records, one mode after the other (each holds the local Spark's task slots):

* **real-time mode** (``trigger(realTime=...)``, Spark 4.1+): the query's long-running tasks
  write each changed total to a compacted topic (key: the user, UTF-8; value: the row as
  JSON) as soon as its order arrives, and ``sparkiq.follow_topic`` serves that topic;
* **micro-batches with sparkiq's sink** (``App.materialize``, a batch as soon as the
  previous one ends): the App's own node serves the table.

Each sample sends one order, at a random moment, for one of 20 users, and a thread asks the
reader for that user every half millisecond until the row counts the order: the time from
the send to that answer is what a client that writes and then reads waits. The floor is the
broker's own round trip in the same run: from the send until a plain consumer of the input
topic receives the record. Spark's streaming shuffle flushes its buffers every
``spark.shuffle.streaming.networkBufferMaxWaitTimeMs`` (50 ms by default, 5 ms in the
benchmarks' session: :func:`bench._common.spark_session`).

Run: ``python -m bench.realtime [--quick | --smoke]``.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from bench._common import Report, Scale, entry_point, percentile, scratch_dir, spark_session
from bench.ryw_latency import TOPIC as ORDERS
from bench.ryw_latency import totals_pipeline
from sparkiq import App, follow_topic
from sparkiq.testing import kafka_broker

TOTALS = "totals-rt"
TABLE = "totals"
USERS = 20
COLUMNS = "user STRING, orders BIGINT, spent BIGINT"
TARGET_MS = 50.0
SPIN_S = 0.0005


def _start_realtime(spark: Any, servers: str, checkpoint: str) -> Any:
    from pyspark.sql import functions as F

    rows = totals_pipeline(spark, servers).select(
        F.col("user").cast("binary").alias("key"),
        F.to_json(F.struct("user", "orders", "spent")).cast("binary").alias("value"),
    )
    return (
        rows.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("kafka.linger.ms", "0")
        .option("topic", TOTALS)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .trigger(realTime="30 seconds")
        .start()
    )


def _send(producer: Any, user: str) -> None:
    producer.produce(ORDERS, key=user.encode(), value=json.dumps({"user": user, "amount": 1}))
    producer.flush(30)


def _wait_for(get: Callable[[str], Any], user: str, count: int, deadline: float) -> float:
    """Poll until ``user``'s row counts ``count`` orders; the time it did (perf_counter)."""
    while time.perf_counter() < deadline:
        row = get(user)
        if row is not None and row["orders"] >= count:
            return time.perf_counter()
        time.sleep(SPIN_S)
    raise RuntimeError(f"{user}'s order {count} was not visible in time")


def _samples(
    producer: Any,
    get: Callable[[str], Any],
    counts: dict[str, int],
    samples: int,
    rng: random.Random,
) -> list[float]:
    """``samples`` sends, each timed until ``get`` shows it (ms)."""
    out: list[float] = []
    for index in range(samples):
        time.sleep(rng.uniform(0.0, 0.2))
        user = f"user-{index % USERS}"
        counts[user] = counts.get(user, 0) + 1
        sent = time.perf_counter()
        _send(producer, user)
        seen = _wait_for(get, user, counts[user], sent + 120)
        out.append((seen - sent) * 1000)
    return out


def _broker_round_trips(producer: Any, servers: str, samples: int) -> list[float]:
    """From a send until a plain consumer of the input topic has the record (ms)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"floor-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 1,
        }
    )
    try:
        end = consumer.get_watermark_offsets(TopicPartition(ORDERS, 0), timeout=30)[1]
        consumer.assign([TopicPartition(ORDERS, 0, end)])
        out = []
        for _ in range(samples):
            sent = time.perf_counter()
            _send(producer, "floor")
            while True:
                message = consumer.poll(5)
                if message is None:
                    raise RuntimeError("the floor's consumer got nothing in 5 s")
                if message.error() is None:
                    break
            out.append((time.perf_counter() - sent) * 1000)
        return out
    finally:
        consumer.close()


def _measure(
    spark: Any, samples: int, rng: random.Random
) -> tuple[list[float], list[float], list[float], list[dict[str, Any]]]:
    """The floor, then each mode's samples (ms), and the micro-batches' progress."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    counts: dict[str, int] = {}
    with kafka_broker() as servers, scratch_dir("realtime") as root:
        admin = AdminClient({"bootstrap.servers": servers})
        for topic, config in ((ORDERS, {}), (TOTALS, {"cleanup.policy": "compact"})):
            new = NewTopic(topic, num_partitions=1, config=config)
            admin.create_topics([new])[topic].result(timeout=60)
        producer = Producer({"bootstrap.servers": servers, "linger.ms": 0})
        floor = _broker_round_trips(producer, servers, samples)

        query = _start_realtime(spark, servers, f"{root}/rtm-checkpoint")
        followed = None
        try:
            followed = follow_topic(
                servers,
                TOTALS,
                name=TABLE,
                key="user",
                columns=COLUMNS,
                key_format="kafka",
                value_format="json",
                local_dir=f"{root}/follower",
                poll_interval=0.001,
            )
            _send(producer, "warm-up")
            counts["warm-up"] = 1
            _wait_for(lambda u: followed.get(TABLE, u), "warm-up", 1, time.perf_counter() + 300)
            realtime = _samples(producer, lambda u: followed.get(TABLE, u), counts, samples, rng)
        finally:
            if followed is not None:
                followed.close()
            query.stop()

        app = App(spark, state_dir=f"{root}/state", name="microbatch")
        app.materialize(TABLE, totals_pipeline(spark, servers), key="user", partitions=1)
        app.start()
        try:
            app.process_all_available(timeout=300)
            micro = _samples(producer, lambda u: app.get(TABLE, u), counts, samples, rng)
            progress = app.tables[TABLE].query.recentProgress
        finally:
            app.stop()
            producer.flush(10)
    return floor, realtime, micro, progress


def run(scale: Scale = Scale.FULL, spark: Any = None) -> Report:
    """``spark``: the session to run on, with Spark's Kafka connector and at least two task
    slots (default: :func:`bench._common.spark_session`)."""
    samples = scale.pick(200, 40, 5)
    report = Report(
        name="realtime",
        title="Real-time mode: Kafka send to queryable",
        measures=(
            f"over {samples} orders per mode, each sent at a random moment for one of {USERS} "
            "users: the time from the producer's send until a reader polling every 0.5 ms "
            "sees that the user's total counts it; one stateful pipeline (count and sum per user, "
            "update mode) in real-time mode with sparkiq.follow_topic over its output topic, "
            "then in micro-batches with sparkiq's sink"
        ),
        baseline=(
            "the broker's round trip in the same run: a send until a plain consumer of the "
            "input topic receives it"
        ),
        target=f"real-time mode p50 <= {TARGET_MS:.0f} ms",
        columns=["path", "samples", "p50 ms", "p99 ms", "max ms", "p50 vs floor"],
        scale=scale,
    )
    spark = spark if spark is not None else spark_session()
    rng = random.Random(31)
    previous_shuffle = spark.conf.get("spark.sql.shuffle.partitions")
    # One input partition and one state partition: a real-time query runs every stage's
    # tasks at once, and the local session has two task slots.
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        floor, realtime, micro, progress = _measure(spark, samples, rng)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous_shuffle)
    batches = [
        float(p["durationMs"]["triggerExecution"])
        for p in progress
        if p.get("numInputRows", 0) > 0 and "triggerExecution" in p.get("durationMs", {})
    ]
    base = percentile(floor, 50)

    def row(path: str, ms: Sequence[float]) -> list[str]:
        p50 = percentile(ms, 50)
        return [
            path,
            str(len(ms)),
            f"{p50:.1f}",
            f"{percentile(ms, 99):.1f}",
            f"{max(ms):.1f}",
            f"{p50 / base:.1f}x",
        ]

    report.rows += [
        row("broker round trip (floor)", floor),
        row("real-time mode + follow_topic", realtime),
        row("micro-batches + sparkiq's sink", micro),
    ]
    if batches:
        report.rows.append(row("(micro-batch duration)", batches))
    p50 = percentile(realtime, 50)
    verdict = "met" if p50 <= TARGET_MS else f"missed by {p50 - TARGET_MS:.1f} ms"
    report.readings = [
        f"real-time mode p50 {p50:.1f} ms, p99 {percentile(realtime, 99):.1f} ms (target "
        f"p50 <= {TARGET_MS:.0f} ms: {verdict}); micro-batches with the sink p50 "
        f"{percentile(micro, 50):.0f} ms ({percentile(micro, 50) / p50:.1f}x); the broker's "
        f"round trip {base:.1f} ms"
    ]
    report.figures = {"floor_ms": floor, "realtime_ms": realtime, "microbatch_ms": micro}
    return report


main = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
