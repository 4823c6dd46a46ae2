"""Spark's Kafka source through sparkiq, against a real broker: after each round of records
produced by a real client, the table equals Spark's batch answer over the topic and a
computation over the records produced, and the position is the topic's end offsets, in the
commit record and in a query's answer."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App, RangeQuery, StateQueryRequest
from sparkiq.changelog.log import Changelog
from sparkiq.testing import assert_table_matches, table_rows
from tests.kafka.client import Delivered, create_topic, end_offsets, produce

# The broker is one per worker, shared by the files of tests/kafka (test_kafka_lag.py too):
# a worker that runs none of them starts none.
pytestmark = pytest.mark.slow

TOPIC = "orders-source"
PARTITIONS = 4
SCHEMA = "user string, amount long"


def parse(frame: Any) -> Any:
    """Kafka records (JSON values) as orders."""
    from pyspark.sql import functions as F

    value = F.from_json(F.col("value").cast("string"), SCHEMA)
    return frame.select(value.alias("o")).select("o.*")


def totals(orders: Any) -> Any:
    """The pipeline under test: per user, how many orders and their total."""
    from pyspark.sql import functions as F

    return orders.groupBy("user").agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))


def expected_totals(delivered: list[Delivered]) -> dict[str, dict[str, Any]]:
    """The same computation in Python, over the records the broker acknowledged."""
    rows: dict[str, dict[str, Any]] = {}
    for record in delivered:
        assert record.value is not None
        order = json.loads(record.value)
        row = rows.setdefault(order["user"], {"user": order["user"], "orders": 0, "amount": 0})
        row["orders"] += 1
        row["amount"] += order["amount"]
    return rows


def orders(rng: random.Random, count: int) -> Iterator[tuple[str, str]]:
    for _ in range(count):
        user = f"u-{rng.randrange(25):02d}"
        yield user, json.dumps({"user": user, "amount": rng.randrange(1, 1000)})


def test_the_broker_serves_a_real_client(kafka_bootstrap: str) -> None:
    create_topic(kafka_bootstrap, "broker-smoke", 2)
    delivered = produce(kafka_bootstrap, "broker-smoke", [("a", "1"), ("b", "2"), ("c", "3")])
    assert sorted((d.key, d.value) for d in delivered) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    ends = end_offsets(kafka_bootstrap, "broker-smoke", 2)
    assert sum(ends.values()) == 3
    assert ends == {p: sum(d.partition == p for d in delivered) for p in range(2)}


def test_kafka_source_is_materialized_and_its_offsets_are_the_position(
    kafka_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    spark = kafka_spark
    create_topic(kafka_bootstrap, TOPIC, PARTITIONS)
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
    )
    app = App(spark, state_dir=str(tmp_path / "state"), name="kafka-source")
    app.materialize("totals", totals(parse(reader.load())), key="user", partitions=4)
    app.start()
    rng = random.Random(26)
    delivered: list[Delivered] = []
    try:
        for round_ in range(2):
            delivered += produce(kafka_bootstrap, TOPIC, orders(rng, 300))
            app.process_all_available(timeout=180)

            # every partition holds records, so the test covers the source's partitions
            assert {d.partition for d in delivered} == set(range(PARTITIONS)), round_
            produced_ends = {
                p: max(d.offset for d in delivered if d.partition == p) + 1
                for p in range(PARTITIONS)
            }
            assert end_offsets(kafka_bootstrap, TOPIC, PARTITIONS) == produced_ends

            # the live table: Spark's batch answer over the whole topic, and Python's
            batch = (
                spark.read.format("kafka")
                .option("kafka.bootstrap.servers", kafka_bootstrap)
                .option("subscribe", TOPIC)
                .option("startingOffsets", "earliest")
                .option("endingOffsets", "latest")
                .load()
            )
            assert_table_matches(app, "totals", totals(parse(batch)))
            assert table_rows(app, "totals") == expected_totals(delivered)

            # the last commit record's position: the Kafka end offsets of what was produced
            changelog = Changelog(str(tmp_path / "state"), "totals")
            record = changelog.read_commit(changelog.committed_batch_ids()[-1])
            assert record is not None
            assert record.position[f"kafka:{TOPIC}"] == produced_ends, round_
            # and the position a query's answer carries (merged over the table's replicas)
            answer = app.query(
                StateQueryRequest.in_store("totals").with_query(RangeQuery.with_no_bounds())
            )
            assert answer.position.partition_offsets(f"kafka:{TOPIC}") == produced_ends
    finally:
        app.stop()
