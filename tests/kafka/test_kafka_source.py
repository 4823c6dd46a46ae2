"""Spark's Kafka source through sparkiq, against a real broker: after each round of records
produced by a real client, a plain aggregation, a windowed aggregation with a watermark and a
stream-static join each equal Spark's batch answer over the topic and a computation over the
records the broker acknowledged, and every table's position is the topic's end offsets, in
the commit record and in a query's answer (tests/kafka/differential.py); with a classic
session and under Spark Connect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkiq import App
from tests.kafka.client import create_topic, end_offsets, produce
from tests.kafka.differential import ROUNDS, KafkaDifferential

# The broker is one per worker, shared by the files of tests/kafka (test_kafka_lag.py too):
# a worker that runs none of them starts none.
pytestmark = pytest.mark.slow


def test_the_broker_serves_a_real_client(kafka_bootstrap: str) -> None:
    create_topic(kafka_bootstrap, "broker-smoke", 2)
    delivered = produce(kafka_bootstrap, "broker-smoke", [("a", "1"), ("b", "2"), ("c", "3")])
    assert sorted((d.key, d.value) for d in delivered) == [(b"a", b"1"), (b"b", b"2"), (b"c", b"3")]
    ends = end_offsets(kafka_bootstrap, "broker-smoke", 2)
    assert sum(ends.values()) == 3
    assert ends == {p: sum(d.partition == p for d in delivered) for p in range(2)}


def run_differential(
    spark: Any, servers: str, topic: str, state_dir: Path, rounds: int = len(ROUNDS)
) -> list[dict[str, int]]:
    """The differential's first ``rounds`` rounds on an App over ``spark``; each round's
    row counts."""
    differential = KafkaDifferential(spark, servers, topic)
    differential.create_topic()
    app = App(spark, state_dir=str(state_dir), name="kafka-source")
    differential.materialize(app)
    app.start()
    try:
        checked = list(differential.run(app, str(state_dir), seed=26, rounds=rounds))
    finally:
        app.stop()
    assert len(checked) == rounds
    return checked


def test_kafka_pipelines_equal_batch_mode_and_positions_are_offsets(
    kafka_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    checked = run_differential(kafka_spark, kafka_bootstrap, "orders-classic", tmp_path / "state")
    assert ROUNDS[-1][1], "the last round is the late one"
    # the late round added orders (enriched) but no window: Spark dropped them
    assert checked[-1]["enriched"] > checked[-2]["enriched"]
    assert checked[-1]["per_window"] == checked[-2]["per_window"] > 0


def test_kafka_pipelines_under_spark_connect(
    kafka_connect_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The same differential with the App on a Spark Connect session: the Connect server's
    JVM reads the topic with the connector tests/conftest.py puts on its classpath.

    Its on-time rounds only: what sparkiq does under Connect (the sink in the server's
    Python process, positions from each micro-batch's progress) is exercised by every round
    and checked after the second one too; the late round is Spark dropping records behind
    the watermark, the same plan on the same engine, which the classic test checks."""
    on_time = sum(not late for _, late in ROUNDS)
    state = tmp_path / "state"
    spark = kafka_connect_spark
    checked = run_differential(spark, kafka_bootstrap, "orders-connect", state, on_time)
    # the second round's windows are new ones (its event times are 20 minutes later)
    assert checked[-1]["per_window"] > checked[-2]["per_window"] > 0
