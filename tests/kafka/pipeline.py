"""The pipeline the Kafka tests run, and its ground truths: records of orders (JSON values)
read with ``readStream.format("kafka")``, parsed, and counted and summed per user."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from typing import Any

from sparkiq.changelog.log import Changelog
from tests.kafka.client import Delivered

SCHEMA = "user string, amount long"

#: How long an idle Kafka query of these tests waits before it asks the broker for new records
#: again. The sessions' 100 ms (sparkiq.testing.LOCAL_SPARK_CONF) suits file sources, but each
#: Kafka look is a ListOffsets round trip: three idle Kafka queries took 0.2 of a core (4.0
#: CPU-s in 20 s, Spark's JVM and the broker about half each; 0.7 with none). A test waits
#: for its queries by ``process_all_available``, which a longer delay slows by at most the
#: delay: a query that finds records runs its batches back to back, and only then sleeps.
KAFKA_POLLING_DELAY = "1s"


def parse(frame: Any) -> Any:
    """Kafka records (JSON values) as orders."""
    from pyspark.sql import functions as F

    value = F.from_json(F.col("value").cast("string"), SCHEMA)
    return frame.select(value.alias("o")).select("o.*")


def totals(orders: Any) -> Any:
    """The pipeline under test: per user, how many orders and their total."""
    from pyspark.sql import functions as F

    return orders.groupBy("user").agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))


def expected_totals(delivered: Iterable[Delivered]) -> dict[str, dict[str, Any]]:
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
    """``count`` random orders of 25 users, as ``(key, JSON value)`` records."""
    for _ in range(count):
        user = f"u-{rng.randrange(25):02d}"
        yield user, json.dumps({"user": user, "amount": rng.randrange(1, 1000)})


def stream(spark: Any, bootstrap_servers: str, topic: str, **options: str) -> Any:
    """The topic as a stream from its earliest records, with Spark's Kafka ``options``."""
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def batch(spark: Any, bootstrap_servers: str, topic: str) -> Any:
    """Every record the topic holds now, read by Spark in batch mode (the ground truth)."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )


def ends_of(delivered: Iterable[Delivered], partitions: int) -> dict[int, int]:
    """Each partition's end offset after the acknowledged records (0: none there)."""
    ends = dict.fromkeys(range(partitions), 0)
    for record in delivered:
        ends[record.partition] = max(ends[record.partition], record.offset + 1)
    return ends


def committed_positions(state_dir: str, table: str, topic: str) -> dict[int, dict[int, int]]:
    """The ``kafka:<topic>`` component of every commit record of ``table``, by batch id."""
    changelog = Changelog(state_dir, table)
    positions: dict[int, dict[int, int]] = {}
    for batch_id in changelog.committed_batch_ids():
        record = changelog.read_commit(batch_id)
        assert record is not None, batch_id
        positions[batch_id] = dict(record.position[f"kafka:{topic}"])
    return positions
