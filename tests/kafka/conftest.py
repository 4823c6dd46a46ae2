"""A real Kafka broker for the tests in tests/kafka, and a client to it (confluent-kafka)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq.testing import KafkaBroker, spark_kafka_jars


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


@pytest.fixture
def kafka_spark(spark: Any) -> Any:
    """The session's SparkSession, which has Spark's Kafka connector when ``make jvm-jars``
    has fetched it (tests/conftest.py); fails saying how to fetch it otherwise."""
    spark_kafka_jars()  # raises ConfigError naming `make jvm-jars` when missing
    return spark
