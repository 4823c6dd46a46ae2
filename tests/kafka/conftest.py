"""A real Kafka broker for the tests in tests/kafka, and a client to it (confluent-kafka)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq.testing import KafkaBroker, spark_kafka_jars
from tests.kafka.pipeline import KAFKA_POLLING_DELAY


# Package scope, not session: an idle broker still takes about 2% of a core and 280 MB (0.57
# CPU-s in 30 s, measured); it stops with the last test in tests/kafka instead of idling
# beside every test after it. The files of tests/kafka go to one worker together
# (tests/conftest.py), so the run starts one broker.
@pytest.fixture(scope="package")
def kafka_cluster() -> Iterator[KafkaBroker]:
    """A single-node KRaft cluster (sparkiq.testing.KafkaBroker), started by the first test
    that asks for it and stopped after the last test in tests/kafka, which all run on one
    worker. Topics outlive tests: each test makes its own, with a name of its own. A test
    that stops the broker starts it again before it ends."""
    with KafkaBroker() as broker:
        yield broker


@pytest.fixture
def kafka_bootstrap(kafka_cluster: KafkaBroker) -> str:
    """The ``bootstrap_servers`` of the worker's broker (``kafka_cluster``), running."""
    assert kafka_cluster.running, "a test stopped the shared broker and did not start it again"
    return kafka_cluster.bootstrap_servers


_POLLING_DELAY = "spark.sql.streaming.pollingDelay"


@contextlib.contextmanager
def kafka_polling(spark: Any) -> Iterator[Any]:
    """``spark`` with :data:`KAFKA_POLLING_DELAY` for the queries started in the block (a
    query takes its settings when it starts), and its own setting again after."""
    spark_kafka_jars()  # raises ConfigError naming `make jvm-jars` when missing
    previous = spark.conf.get(_POLLING_DELAY)
    spark.conf.set(_POLLING_DELAY, KAFKA_POLLING_DELAY)
    try:
        yield spark
    finally:
        spark.conf.set(_POLLING_DELAY, previous)


@pytest.fixture
def kafka_spark(spark: Any) -> Iterator[Any]:
    """The session's SparkSession, which has Spark's Kafka connector when ``make jvm-jars``
    has fetched it (tests/conftest.py), its streaming queries polling Kafka every
    :data:`KAFKA_POLLING_DELAY` when idle; fails saying how to fetch the connector otherwise."""
    with kafka_polling(spark) as session:
        yield session


@pytest.fixture
def kafka_connect_spark(connect_spark: Any) -> Iterator[Any]:
    """``connect_spark`` (tests/conftest.py) as ``kafka_spark`` is the session's
    SparkSession: the Connect server has the connector, and its idle Kafka queries poll every
    :data:`KAFKA_POLLING_DELAY`."""
    with kafka_polling(connect_spark) as session:
        yield session
