"""A real Kafka broker for the tests in tests/kafka, and a client to it (confluent-kafka)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq.testing import kafka_broker, spark_kafka_jars


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """The ``bootstrap_servers`` of a single-node KRaft cluster (sparkiq.testing.kafka_broker),
    started by the first test of a worker that asks for it and stopped when the worker's
    session ends: one broker JVM per worker at most. Topics outlive tests: each test makes
    its own, with a name of its own."""
    with kafka_broker() as bootstrap_servers:
        yield bootstrap_servers


@pytest.fixture
def kafka_spark(spark: Any) -> Any:
    """The session's SparkSession, which has Spark's Kafka connector when ``make jvm-jars``
    has fetched it (tests/conftest.py); fails saying how to fetch it otherwise."""
    spark_kafka_jars()  # raises ConfigError naming `make jvm-jars` when missing
    return spark
