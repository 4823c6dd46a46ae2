"""Changelog maintenance by the writer: periodic snapshots as a Spark job, then retention.

The writer is the only process that writes a table's changelog, so it also maintains it.
Every ``snapshot_every`` committed batches (the App's commit watcher reads them from the
changelog on the driver), a background thread on the driver submits one Spark job with a task
per partition; each task builds its partition's snapshot from the
previous snapshot and the segments since (:func:`sparkiq.changelog.snapshot.write_snapshot`)
on an executor, in parallel, without stopping the streaming query or its readers. When every
partition's snapshot is written, the driver applies retention.

Why a Spark job: the work is per partition and embarrassingly parallel, the executors already
have the changelog's filesystem configured and sparkiq installed, and it needs no serving
node (nodes never write the changelog). ``sparkiq compact`` does the same from a shell.

The job is a DataFrame job (``spark.range`` with one row per partition, ``mapInArrow``), not
an RDD job: it runs the same with a classic and a Spark Connect session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from sparkiq.changelog import Changelog
from sparkiq.changelog.retention import RetentionReport, apply_retention
from sparkiq.changelog.snapshot import write_snapshot

__all__ = ["TableMaintenance", "compact_table"]

log = logging.getLogger("sparkiq.maintenance")


def _snapshot_partition(state_dir: str, table: str, batch_id: int, partition: int) -> int:
    info = write_snapshot(Changelog(state_dir, table), partition, batch_id)
    return info.rows


def _snapshot_writer(
    state_dir: str, table: str, batch_id: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function each task runs (on an executor): snapshot the partitions it is given
    (the ``id`` column) and yield how many rows each snapshot holds."""

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            partitions = batch.column("id").to_pylist()
            rows = [_snapshot_partition(state_dir, table, batch_id, p) for p in partitions]
            yield pa.record_batch({"rows": pa.array(rows, pa.int64())})

    return write


def compact_table(
    state_dir: str,
    table: str,
    batch_id: int | None = None,
    *,
    retention_seconds: float | None = None,
    spark: Any = None,
) -> tuple[int, int, RetentionReport | None]:
    """Snapshot every partition of ``table`` at ``batch_id`` (default: the newest commit),
    then apply retention when ``retention_seconds`` is given.

    With ``spark``, the partitions are snapshotted by one Spark job; otherwise one after the
    other in this process. Returns ``(batch_id, rows, retention report)``.
    """
    changelog = Changelog(state_dir, table)
    if batch_id is None:
        committed = changelog.committed_batch_ids()
        if not committed:
            return -1, 0, None
        batch_id = committed[-1]
    count = changelog.manifest().partitions
    if spark is not None:
        # One row, so one task, per partition: snapshots are written in parallel, each by
        # the executor that runs its task.
        job = spark.range(0, count, 1, count).mapInArrow(
            _snapshot_writer(state_dir, table, batch_id), "rows long"
        )
        rows = sum(int(r["rows"]) for r in job.collect())
    else:
        rows = sum(_snapshot_partition(state_dir, table, batch_id, p) for p in range(count))
    report = None
    if retention_seconds is not None:
        report = apply_retention(changelog, retention_seconds)
    return batch_id, rows, report


class TableMaintenance:
    """Schedules snapshots and retention for one table from its commits (as the App's
    commit watcher sees them in the changelog).

    At most one maintenance run per table is in flight; a commit that falls due while one
    runs is skipped (the next due commit catches up). Failures are logged and retried at the
    next due commit: they never affect the streaming query.
    """

    def __init__(
        self,
        spark: Any,
        state_dir: str,
        table: str,
        snapshot_every: int | None,
        retention_seconds: float | None,
    ) -> None:
        self.spark = spark
        self.state_dir = state_dir
        self.table = table
        self.snapshot_every = snapshot_every
        self.retention_seconds = retention_seconds
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.last_snapshot_batch = -1

    def on_commit(self, batch_id: int) -> None:
        """Batch ``batch_id`` was committed: start a maintenance run if one is due."""
        every = self.snapshot_every
        if not every or batch_id == 0 or batch_id % every:
            return
        if self._thread is not None and self._thread.is_alive():
            log.info("%s: maintenance still running; skipping batch %d", self.table, batch_id)
            return
        thread = threading.Thread(
            target=self.run,
            args=(batch_id,),
            name=f"sparkiq-maintenance-{self.table}",
            daemon=True,
        )
        thread.start()
        # Published once started: wait() (App.compact, on another thread) joins it at once,
        # and joining a thread not started yet raises.
        self._thread = thread

    def run(self, batch_id: int | None = None) -> None:
        try:
            done, rows, report = compact_table(
                self.state_dir,
                self.table,
                batch_id,
                retention_seconds=self.retention_seconds,
                spark=self.spark,
            )
            self.last_snapshot_batch = done
            self.last_error = None
            log.info("%s: snapshot at batch %d (%d rows); %s", self.table, done, rows, report)
        except Exception as exc:  # logged and retried at the next due commit
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("%s: maintenance at batch %s failed", self.table, batch_id)

    def wait(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
