"""A real Kafka broker for the tests in tests/kafka, and a client to it (confluent-kafka)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq.testing import KafkaBroker, spark_kafka_jars


# Package scope, not session: an idle broker still takes about 2% of a core and 280 MB (0.57
# CPU-s in 30 s, measured), and a worker runs the slow Kafka file early; it stops with the
# worker's last test in tests/kafka instead of idling beside every test after it.
@pytest.fixture(scope="package")
def kafka_cluster() -> Iterator[KafkaBroker]:
    """A single-node KRaft cluster (sparkiq.testing.KafkaBroker), started by the first test
    of a worker that asks for it and stopped after the worker's tests in tests/kafka: one
    broker JVM per worker at most. Topics outlive tests: each test makes its own, with a name
    of its own. A test that stops the broker starts it again before it ends."""
    with KafkaBroker() as broker:
        yield broker


@pytest.fixture
def kafka_bootstrap(kafka_cluster: KafkaBroker) -> str:
    """The ``bootstrap_servers`` of the worker's broker (``kafka_cluster``), running."""
    assert kafka_cluster.running, "a test stopped the shared broker and did not start it again"
    return kafka_cluster.bootstrap_servers


@pytest.fixture
def kafka_spark(spark: Any) -> Any:
    """The session's SparkSession, which has Spark's Kafka connector when ``make jvm-jars``
    has fetched it (tests/conftest.py); fails saying how to fetch it otherwise."""
    spark_kafka_jars()  # raises ConfigError naming `make jvm-jars` when missing
    return spark
