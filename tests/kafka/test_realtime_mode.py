"""Spark's real-time mode served by sparkiq: a stateful real-time query writes its totals to a
compacted topic as each order arrives, and ``sparkiq.follow_topic`` serves that topic.

Ground truth: the orders the broker acknowledged, counted here. The query runs with one
input partition and one state partition: a real-time query runs all its stages' tasks at
once, and the test session has two task slots."""

from __future__ import annotations

import inspect
import json
import uuid
from collections import Counter
from typing import Any

import pytest

import sparkiq
from sparkiq.testing import KafkaBroker
from sparkiq.testing.cluster import wait_until
from tests.kafka.topics import create_compacted, send

DEADLINE = 180.0  # a busy machine: generous, the condition ends the wait
COLUMNS = "user STRING, orders BIGINT, spent BIGINT"


def _realtime_trigger_or_skip() -> None:
    from pyspark.sql.streaming import DataStreamWriter

    if "realTime" not in inspect.signature(DataStreamWriter.trigger).parameters:
        pytest.skip("this Spark has no real-time mode (trigger(realTime=...), Spark 4.1+)")


def _orders(users: list[str], amounts: list[int]) -> list[tuple[bytes, bytes]]:
    return [
        (u.encode(), json.dumps({"user": u, "amount": a}).encode())
        for u, a in zip(users, amounts, strict=True)
    ]


def _start(spark: Any, servers: str, source: str, sink: str, checkpoint: str) -> Any:
    from pyspark.sql import functions as F

    totals = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), "user string, amount long").alias("o"))
        .groupBy("o.user")
        .agg(F.count("*").alias("orders"), F.sum("o.amount").alias("spent"))
    )
    return (
        totals.select(
            F.col("user").cast("binary").alias("key"),
            F.to_json(F.struct("user", "orders", "spent")).cast("binary").alias("value"),
        )
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("topic", sink)
        .option("checkpointLocation", checkpoint)
        .outputMode("update")
        .trigger(realTime="30 seconds")
        .start()
    )


def test_a_real_time_query_followed_as_a_table(
    kafka_spark: Any, kafka_cluster: KafkaBroker, tmp_path: Any
) -> None:
    _realtime_trigger_or_skip()
    servers = kafka_cluster.bootstrap_servers
    source, sink = f"orders-{uuid.uuid4().hex[:8]}", f"totals-{uuid.uuid4().hex[:8]}"
    create_compacted(servers, source, 1)
    create_compacted(servers, sink, 1)
    users = [f"u{i % 7}" for i in range(40)]
    amounts = [i % 5 + 1 for i in range(40)]
    delivered = send(servers, source, _orders(users[:25], amounts[:25]))
    previous = kafka_spark.conf.get("spark.sql.shuffle.partitions")
    kafka_spark.conf.set("spark.sql.shuffle.partitions", "1")
    query = None
    followed = sparkiq.follow_topic(
        servers,
        sink,
        name="totals",
        key="user",
        columns=COLUMNS,
        key_format="kafka",
        value_format="json",
        local_dir=str(tmp_path / "follower"),
    )
    try:
        query = _start(kafka_spark, servers, source, sink, str(tmp_path / "checkpoint"))

        def matches(count: int) -> bool:
            orders = Counter(users[:count])
            spent: Counter[str] = Counter()
            for user, amount in zip(users[:count], amounts[:count], strict=True):
                spent[user] += amount
            want = {u: {"user": u, "orders": orders[u], "spent": spent[u]} for u in orders}
            return all(followed.get("totals", u) == row for u, row in want.items())

        wait_until(lambda: matches(25), DEADLINE, f"the totals never matched: {query.status}")
        # The query keeps running: later orders reach the table without a new batch.
        delivered += send(servers, source, _orders(users[25:], amounts[25:]))
        wait_until(lambda: matches(40), DEADLINE, f"later orders never arrived: {query.status}")
        assert len(delivered) == 40
        answer = followed.sql("SELECT sum(orders) AS n, sum(spent) AS s FROM totals")
        assert answer.rows == [{"n": 40, "s": sum(amounts)}]
    finally:
        if query is not None:
            query.stop()
        followed.close()
        kafka_spark.conf.set("spark.sql.shuffle.partitions", previous)
