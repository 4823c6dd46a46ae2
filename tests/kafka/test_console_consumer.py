"""Seed 003's follower story with a non-Python reader: Kafka's own `kafka-console-consumer`
(the broker distribution's `kafka-tools`, a JVM client) reads a table sparkiq published, with
`read_committed`, and its last record per key is the table (tombstones print as null)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from sparkiq.testing import KafkaBroker, write_table
from sparkiq.testing.kafka import kafka_jars_dir
from tests.kafka.published import default_partition
from tests.kafka.test_publish import publish_once, topic_name

ROWS = [
    {"user": name, "orders": i, "spent": 10 * i}
    for i, name in enumerate(["ana", "bo", "ümit", "chen", "dee", "eli"])
]


def console_consumer(
    servers: str, topic: str, count: int
) -> list[tuple[int, dict[str, str], str, str]]:
    """``(partition, headers, key, value)`` of the first ``count`` committed records, as the
    tool prints them (``value`` is ``null`` for a tombstone)."""
    command = [
        "java",
        "-cp",
        str(kafka_jars_dir() / "kafka-broker" / "*"),
        "org.apache.kafka.tools.consumer.ConsoleConsumer",
        "--bootstrap-server",
        servers,
        "--topic",
        topic,
        "--from-beginning",
        "--isolation-level",
        "read_committed",
        "--max-messages",
        str(count),
        "--timeout-ms",
        "60000",  # a guard: it stops after count records, or when none came for this long
        *("--formatter-property", "print.key=true"),
        *("--formatter-property", "print.headers=true"),
        *("--formatter-property", "print.partition=true"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert "Processed a total of" in done.stderr, done.stderr[-3000:]
    records = []
    for line in done.stdout.splitlines():
        if not line.startswith("Partition:"):  # the tool's notices
            continue
        partition, headers, key, value = line.split("\t")
        pairs = dict(h.split(":", 1) for h in headers.split(","))
        records.append((int(partition.removeprefix("Partition:")), pairs, key, value))
    return records


def test_kafka_console_consumer_reads_the_published_table(
    kafka_cluster: KafkaBroker, tmp_path: Path
) -> None:
    state = str(tmp_path)
    writer = write_table(state, "totals", ROWS, key="user", partitions=3)
    writer.write([{"user": "bo", "orders": 7, "spent": 99}], deletes=["dee"])
    topic = topic_name("console")
    assert publish_once(state, "totals", topic, kafka_cluster.bootstrap_servers) == 2

    # every row, then an update and a tombstone (the publisher's tests count them exactly)
    records = console_consumer(kafka_cluster.bootstrap_servers, topic, len(ROWS) + 2)
    assert len(records) == len(ROWS) + 2
    last: dict[str, Any] = {}
    for partition, headers, key, value in records:
        assert headers["sparkiq.table"] == "totals" and headers["sparkiq.batch"] in ("0", "1")
        assert partition == default_partition(key.encode(), 3), (key, partition)
        last[json.loads(key)] = None if value == "null" else json.loads(value)
    table = {row["user"]: row for row in ROWS if row["user"] != "dee"}
    table["bo"] = {"user": "bo", "orders": 7, "spent": 99}
    assert {k: v for k, v in last.items() if v is not None} == table
    assert last["dee"] is None
