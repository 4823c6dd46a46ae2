"""One materialized table and its Spark streaming query: checking its checkpoint, starting
the query with the table's sink, and stopping it at the end of a batch.

:class:`~sparkiq.spark.app.App` holds a :class:`Table` per materialized table and decides
when each query starts and stops (``start``, ``CREATE TABLE``, ``stop``, ``DROP TABLE``); what
one start or stop does is here.

A stop waits for the batch that was running when the stop was asked for, not for a pause
between batches: a query whose batches take longer than its trigger starts each as the one
before ends, and is rarely seen between two. Which batch that is is read at the call
(:func:`~sparkiq.spark.commits.finished_batch`), before anything else the stop does. The
batch that starts as that one ends may still commit: ``foreachBatch`` runs a batch's whole
job, and one already running can finish before Spark's stop takes hold (seen beside two CPU
hogs: the stop took 0.9 s, and that batch committed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog import Changelog, TableManifest, open_storage
from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.spark.commits import newest_commit, wait_between_batches
from sparkiq.spark.failures import failure_reason, worker_hint
from sparkiq.spark.maintenance import TableMaintenance
from sparkiq.spark.publishing import PublishSpec
from sparkiq.spark.sink import TableSink, pyarrow_uri, write_task_count
from sparkiq.spark.writer_report import WriterReporter, final_status

__all__ = ["Table", "check_checkpoint", "start_query", "stop_query"]

log = logging.getLogger("sparkiq.app")


@dataclass
class Table:
    """A materialized table: its layout, and once started, its Spark query."""

    name: str
    manifest: TableManifest
    dataframe: Any
    trigger: dict[str, Any] | None = None
    query: Any = None  # pyspark.sql.streaming.StreamingQuery once started
    sink: TableSink | None = None
    maintenance: TableMaintenance | None = None
    sql: str | None = None  # the CREATE TABLE statement that defined it; None: materialize()
    #: The newest batch the driver has seen committed in the changelog (-1: none yet).
    committed_batch_id: int = -1
    publish: PublishSpec | None = None  # kafka_topic=: where the table is published
    publisher: Any = None  # its TablePublisher while the query runs (.status(): its lag)

    @property
    def partitions(self) -> int:
        return self.manifest.partitions

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.manifest.key_columns


def check_checkpoint(changelog: Changelog, checkpoint: str) -> None:
    """Refuse to start a table whose changelog has commits while its Spark ``checkpoint``
    has no offsets: Spark would start over at batch 0 beside what is committed."""
    committed = changelog.committed_batch_ids()
    storage = open_storage(pyarrow_uri(checkpoint))
    offsets = storage.path("offsets")
    if committed and not storage.list_names(offsets):
        raise ConfigError(
            f"table {changelog.table!r} has {len(committed)} committed batches but its Spark "
            f"checkpoint at {offsets!r} is gone, so Spark would start over at batch 0. "
            "Restore the checkpoint, or delete the table's directory to rebuild it.",
            store=changelog.table,
        )


def start_query(
    spark: Any,
    table: Table,
    *,
    state_dir: str,
    checkpoint: str,
    query_name: str,
    snapshot_every: int | None,
    retention: float | None,
) -> None:
    """Start ``table``'s streaming query, writing through its sink with its Spark
    ``checkpoint``, with its maintenance and, when it is published, its Kafka publisher."""
    table.maintenance = TableMaintenance(spark, state_dir, table.name, snapshot_every, retention)
    committed = Changelog(state_dir, table.name).committed_batch_ids()
    table.committed_batch_id = committed[-1] if committed else -1
    sink = TableSink(
        state_dir, table.manifest, checkpoint, write_task_count(spark, table.manifest.partitions)
    )
    writer = (
        table.dataframe.writeStream.queryName(query_name)
        .outputMode(table.manifest.output_mode)
        .option("checkpointLocation", checkpoint)
        .foreachBatch(sink)
    )
    if table.trigger:
        writer = writer.trigger(**table.trigger)
    table.sink = sink
    # checked before the query starts; runs on a driver thread, following the changelog
    publisher = None if table.publish is None else table.publish.publisher(state_dir, table.name)
    try:
        table.query = writer.start()
    except Exception as exc:  # Connect starts foreachBatch's worker here
        hint = worker_hint(exc)
        if hint is None:
            raise
        raise SparkiqError(
            f"the Spark query of {table.name!r} did not start: {failure_reason(exc)}\n{hint}",
            store=table.name,
        ) from exc
    if publisher is not None:
        table.publisher = publisher.start()


def stop_query(
    table: Table,
    timeout: float,
    *,
    finished: Any,
    state_dir: str,
    reporter: WriterReporter | None,
) -> None:
    """Stop ``table``'s query once the batch after ``finished`` (:func:`finished_batch` of
    the query when the stop was asked for) has ended, or after ``timeout`` s; then its
    maintenance and publisher, and write its final writer status. Never raises for a query
    already stopped or a session gone. ``reporter``: the App's status reporter while it still
    runs (``DROP TABLE``), whose lock keeps it from writing about the table meanwhile."""
    if table.query is None:
        return
    try:
        wait_between_batches(table.query, timeout, finished)
        table.query.stop()
        if table.maintenance is not None:
            table.maintenance.wait(timeout)
    except Exception:  # already stopped or the session is gone
        log.debug("stopping %s", table.name, exc_info=True)
    query = table.query
    if reporter is not None:  # it writes about started tables only: no longer this one
        with reporter.lock:
            table.query = None
    table.query = None
    # stopped, or failed when it had failed before (readers keep seeing the reason)
    try:
        changelog = Changelog(state_dir, table.name)
        table.committed_batch_id = newest_commit(changelog, table.committed_batch_id)
    except Exception:  # the record then names the newest batch the watcher saw
        log.debug("reading the commits of %s", table.name, exc_info=True)
    publisher, table.publisher = table.publisher, None
    if publisher is not None:  # what the query committed goes out before it stops
        publisher.wait_for(table.committed_batch_id, timeout)
        publisher.stop()
    publishing = () if publisher is None else (publisher.status().to_record(),)
    final_status(state_dir, table.name, query, table.committed_batch_id, publishing=publishing)
