"""Helpers to test a pipeline built with sparkiq, and what serves its tables.

With Spark (a JVM):

- :func:`spark_session`: a small local SparkSession tuned for tests (two cores, few shuffle
  partitions, no UI, UTC), or a Spark Connect session when given ``remote=``;
  :func:`connect_server`: a local Spark Connect server in its own JVM.
- :class:`JsonSource`: a folder of JSON files as a streaming source, fed batch by batch;
  :meth:`JsonSource.feed` returns once the App has applied the batch.
- :func:`kafka_broker`: a real single-node Apache Kafka cluster (KRaft) on 127.0.0.1
  (:class:`KafkaBroker`: one a test can stop and restart), and :func:`spark_kafka_jars`:
  Spark's Kafka connector for ``spark.jars`` (from the jars ``make jvm-jars`` copies into a
  checkout's ``.jvm/``).

Without Spark (no JVM, no pyspark import):

- :func:`write_table`: a table's changelog written from Python rows, batch by batch, as the
  table's Spark query would write it (:class:`TableWriter` writes later batches);
  :func:`temporary_state_dir`: a state directory removed afterwards.
- :func:`start_cluster`: N nodes in this process serving a state directory
  (:class:`LocalCluster`, whose :meth:`~LocalCluster.client` is a Client over 127.0.0.1);
  :func:`wait_until`: wait for a condition with a deadline.
- :func:`table_rows`, :func:`diff_table`, :func:`assert_table_matches`: a table's live state
  against expected rows (for a pipeline: Spark's batch answer over the same input);
  :func:`assert_sql_rows`: a SQL answer against expected rows, in any order.

Everything here works with classic PySpark and Spark Connect sessions (no ``sparkContext``,
RDDs or py4j). Importing this package starts no JVM and no thread and imports no pyspark:
Spark starts when :func:`spark_session` is called. Each concept is a module of its own
(``sessions``, ``json_source``, ``kafka``, ``changelog``, ``cluster``, ``compare``), imported
when one of its names is first read (see :mod:`sparkiq.exports`): import the names from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkiq.exports import lazy_exports

_HOMES: dict[str, tuple[str, ...]] = {
    "sparkiq.testing.changelog": ("TableWriter", "temporary_state_dir", "write_table"),
    "sparkiq.testing.cluster": ("TEST_TIMINGS", "LocalCluster", "start_cluster", "wait_until"),
    "sparkiq.testing.compare": (
        "TableDiff",
        "assert_sql_rows",
        "assert_table_matches",
        "diff_table",
        "table_rows",
    ),
    "sparkiq.testing.json_source": ("JsonSource",),
    "sparkiq.testing.kafka": (
        "KAFKA_JVM_OPTIONS",
        "KafkaBroker",
        "kafka_broker",
        "kafka_jars_dir",
        "spark_kafka_jars",
    ),
    "sparkiq.testing.sessions": ("LOCAL_SPARK_CONF", "connect_server", "spark_session"),
}

__all__ = [
    "JsonSource",
    "KAFKA_JVM_OPTIONS",
    "KafkaBroker",
    "LOCAL_SPARK_CONF",
    "LocalCluster",
    "TEST_TIMINGS",
    "TableDiff",
    "TableWriter",
    "assert_sql_rows",
    "assert_table_matches",
    "connect_server",
    "diff_table",
    "kafka_broker",
    "kafka_jars_dir",
    "spark_kafka_jars",
    "spark_session",
    "start_cluster",
    "table_rows",
    "temporary_state_dir",
    "wait_until",
    "write_table",
]

if TYPE_CHECKING:
    # What type checkers see; tests/test_package.py keeps it, _HOMES and __all__ equal.
    from sparkiq.testing.changelog import TableWriter, temporary_state_dir, write_table
    from sparkiq.testing.cluster import TEST_TIMINGS, LocalCluster, start_cluster, wait_until
    from sparkiq.testing.compare import (
        TableDiff,
        assert_sql_rows,
        assert_table_matches,
        diff_table,
        table_rows,
    )
    from sparkiq.testing.json_source import JsonSource
    from sparkiq.testing.kafka import (
        KAFKA_JVM_OPTIONS,
        KafkaBroker,
        kafka_broker,
        kafka_jars_dir,
        spark_kafka_jars,
    )
    from sparkiq.testing.sessions import LOCAL_SPARK_CONF, connect_server, spark_session
else:
    __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
