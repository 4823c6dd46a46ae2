"""A Spark pipeline published to a topic while it runs: a table defined in SQL (``WITH
(KAFKA_TOPIC = ...)``) over a Kafka stream of upserts and deletes, its publisher a thread
of the App's driver process. After each round the topic's compacted content, read
``read_committed`` by confluent-kafka, equals the table's rows on the App's own node
(turned into JSON here, by the documented rules written out independently), tombstones
included; and Spark's own Kafka reader (the Java client) sees the same committed records."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App
from sparkiq.changelog import open_storage
from sparkiq.changelog.writer_status import read_writer_status
from sparkiq.testing import table_rows, wait_until
from tests.kafka.client import create_topic, produce
from tests.kafka.pipeline import stream
from tests.kafka.published import compacted, default_partition, read_topic, schema_record

pytestmark = pytest.mark.slow

ROUNDS = [
    [(f"u{i}", 100 * i + 5, False) for i in range(10)],
    [(f"u{i}", 7 + i, False) for i in range(5)] + [(f"u{i}", 0, True) for i in range(5, 8)],
    [("u5", 1234, False), ("u0", 0, True), ("u9", -250, False)],
]

CREATE = """
CREATE TABLE accounts WITH (KEY = 'user', PARTITIONS = 3, TOMBSTONE = 'gone',
                            KAFKA_TOPIC = '{topic}')
AS SELECT o.user AS user, o.amount AS amount, o.gone AS gone, ts AS at,
          CAST(o.amount / 100 AS DECIMAL(10,2)) AS price, to_date(ts) AS day,
          array(o.user, CAST(NULL AS STRING)) AS tags, map('n', o.amount) AS counts,
          named_struct('who', o.user, 'seen', ts) AS place, CAST(o.user AS BINARY) AS blob
   FROM (SELECT from_json(CAST(value AS STRING), 'user string, amount long, gone boolean') AS o,
                timestamp AS ts
           FROM events)
"""


def as_json(value: Any) -> Any:
    """A value as the node returns it (PySpark's types) in the JSON docs/kafka.md states."""
    if isinstance(value, dt.datetime):  # naive local time, as PySpark returns timestamps
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {str(k): as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    return value


def run_pipeline(
    spark: Any, servers: str, state_dir: Path, name: str, rounds: list[Any]
) -> list[Any]:
    """The pipeline over a topic of its own, published to ``<name>-accounts``, checked after
    each of ``rounds``; the records of the published topic at the end."""
    source, published = f"{name}-events", f"{name}-accounts"
    create_topic(servers, source, 2)
    app = App(
        spark, state_dir=str(state_dir), name=name, kafka_config={"bootstrap.servers": servers}
    )
    app.register_stream("events", stream(spark, servers, source))
    app.start()
    try:
        app.sql(CREATE.format(topic=published))
        table = app.tables["accounts"]
        for round_ in rounds:
            records = [
                (user, json.dumps({"user": user, "amount": amount, "gone": gone}))
                for user, amount, gone in round_
            ]
            produce(servers, source, records)
            app.process_all_available(timeout=300)
            batch = table.committed_batch_id
            assert table.publisher.wait_for(batch, timeout=120), table.publisher.status()
            status = table.publisher.status()
            assert (status.published_batch, status.batches_behind) == (batch, 0), status

            rows = table_rows(app, "accounts")
            expected = {
                json.dumps(user).encode(): {c: as_json(v) for c, v in row.items()}
                for user, row in rows.items()
            }
            topic = read_topic(servers, published)
            assert compacted(topic) == expected
        assert all(r.partition == default_partition(r.key, 3) for r in topic)
        assert schema_record(servers, published)["table"] == "accounts"

        # its lag is in the writer's status record (sparkiq status, /metrics)
        def recorded() -> dict[str, Any]:
            record = read_writer_status(open_storage(app.state_dir), "accounts")
            return {} if record is None or not record.publishing else record.publishing[0]

        wait_until(lambda: recorded().get("published_batch") == batch, 60, "no publisher status")
        assert recorded()["batches_behind"] == 0 and recorded()["topic"] == published
    finally:
        app.stop()
    assert table.publisher is None  # stopped with its query
    assert recorded()["state"] == "stopped"
    return topic


def test_a_published_pipeline_equals_its_table_after_every_round(
    kafka_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = run_pipeline(kafka_spark, kafka_bootstrap, tmp_path / "state", "publish", ROUNDS)
    gone = {r.key for r in topic if r.value is None}
    assert gone == {b'"u5"', b'"u6"', b'"u7"', b'"u0"'}
    published = "publish-accounts"

    # Spark's Kafka reader (the Java client), read_committed, sees the same records
    seen = (
        kafka_spark.read.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", published)
        .option("includeHeaders", "true")
        .load()
        .selectExpr(
            "partition",
            "offset",
            "CAST(filter(headers, h -> h.key = 'sparkiq.batch')[0].value AS STRING) AS batch",
        )
        .collect()
    )
    assert sorted((r["partition"], r["offset"], int(r["batch"])) for r in seen) == sorted(
        (r.partition, r.offset, r.batch) for r in topic
    )


def test_a_published_pipeline_under_spark_connect(
    kafka_connect_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The App on a Spark Connect session: the sink runs in the Connect server's Python, the
    publisher on a thread of this (the client's) process, following the changelog. Its
    first two rounds (the second has deletes)."""
    state = tmp_path / "state"
    run_pipeline(kafka_connect_spark, kafka_bootstrap, state, "publish-connect", ROUNDS[:2])
