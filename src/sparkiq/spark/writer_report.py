"""The driver's side of the writer status record (:mod:`sparkiq.changelog.writer_status`).

:class:`WriterReporter` is a driver thread of the App. Every ``check_interval`` seconds it
asks each started table's Spark query whether it is still active; it rewrites the table's
record every ``heartbeat`` seconds while the query runs, and at once when it finds the query
failed (with the reason :func:`~sparkiq.spark.failures.failure_reason` keeps) or stopped.
The App also writes the final record itself when it stops a query
(:func:`final_status`), so a stopped App never leaves a ``running`` record behind.

Cost: per table and check, ``query.isActive`` (a flag on the driver; one RPC under Spark
Connect); per heartbeat, ``query.lastProgress`` and one small atomic write. None of it runs
inside a micro-batch, so a batch never waits for it; a failing write is logged and tried
again at the next heartbeat. Only ``isActive``, ``exception()`` and ``lastProgress`` are
used, which classic PySpark and Spark Connect both offer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkiq.changelog import Changelog, open_storage
from sparkiq.changelog.writer_status import WriterStatus, write_writer_status
from sparkiq.spark.failures import failure_reason

__all__ = ["HEARTBEAT_SECONDS", "WriterReporter", "final_status", "query_status"]

log = logging.getLogger("sparkiq.app")

#: How often a running writer rewrites its record (readers call it silent well after that).
HEARTBEAT_SECONDS = 2.0

#: ``(table name, its Spark query, newest batch the driver saw committed)`` per started table.
Reported = Callable[[], list[tuple[str, Any, int]]]
#: A table's publishers to Kafka, as the writer status record holds them (none: ``()``).
Publishing = Callable[[str], tuple[dict[str, Any], ...]]


def _no_publishing(table: str) -> tuple[dict[str, Any], ...]:
    return ()


def _field(progress: Any, name: str) -> Any:
    """A field of ``query.lastProgress``: a dict, or a progress object, by Spark version."""
    if isinstance(progress, dict):
        return progress.get(name)
    return getattr(progress, name, None)


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _progress(query: Any) -> dict[str, Any]:
    """The figures of ``query``'s last progress (empty before its first batch)."""
    try:
        progress = query.lastProgress
    except Exception:  # the session is going away: no figures this time
        log.debug("reading the last progress", exc_info=True)
        return {}
    if progress is None:
        return {}
    durations = _field(progress, "durationMs") or {}
    batch_id = _field(progress, "batchId")
    return {
        "progress_batch_id": None if batch_id is None else int(batch_id),
        "input_rows_per_second": _number(_field(progress, "inputRowsPerSecond")),
        "processed_rows_per_second": _number(_field(progress, "processedRowsPerSecond")),
        "batch_duration_ms": _number(durations.get("triggerExecution")),
    }


class _Commits:
    """When the newest batch the driver saw was committed (read once per new batch)."""

    def __init__(self, state_dir: str) -> None:
        self._state_dir = state_dir
        self._seen: dict[str, tuple[int, float | None]] = {}

    def committed_at(self, table: str, batch_id: int) -> float | None:
        known = self._seen.get(table)
        if known is not None and known[0] == batch_id:
            return known[1]
        record = Changelog(self._state_dir, table).read_commit(batch_id) if batch_id >= 0 else None
        at = record.committed_at if record is not None else None
        self._seen[table] = (batch_id, at)
        return at


def query_status(
    table: str,
    query: Any,
    batch_id: int,
    committed_at: float | None,
    *,
    heartbeat: float,
    failed_at: float | None = None,
    stopped: bool = False,
    publishing: tuple[dict[str, Any], ...] = (),
) -> WriterStatus:
    """The record of ``table`` whose Spark query is ``query`` now: failed when the query
    ended with an exception, else stopped when it is not active (or ``stopped``)."""
    from pyspark.errors import StreamingQueryException

    now = time.time()
    error: BaseException | None = None
    try:
        active = bool(query.isActive) and not stopped
    except Exception:  # the session is gone: whatever ran is not running
        active = False
    if not active:
        try:
            error = query.exception()
        except StreamingQueryException as exc:  # how some versions hand it over
            error = exc
        except Exception:  # the session is gone: no reason to be had
            log.debug("asking %s's query for its exception", table, exc_info=True)
    state = "failed" if error is not None else "running" if active else "stopped"
    return WriterStatus(
        table=table,
        state=state,
        written_at=now,
        query_name=str(getattr(query, "name", "") or ""),
        reason=failure_reason(error) if error is not None else None,
        failed_at=(failed_at or now) if error is not None else None,
        batch_id=batch_id,
        committed_at=committed_at,
        heartbeat_seconds=heartbeat,
        publishing=publishing,
        **_progress(query),
    )


def final_status(
    state_dir: str,
    table: str,
    query: Any,
    batch_id: int,
    heartbeat: float = HEARTBEAT_SECONDS,
    publishing: tuple[dict[str, Any], ...] = (),
) -> None:
    """Write ``table``'s record once its query was stopped: stopped, or failed when it had
    failed before. A write that fails is logged, never raised (stopping goes on)."""
    try:
        record = Changelog(state_dir, table).read_commit(batch_id) if batch_id >= 0 else None
        status = query_status(
            table,
            query,
            batch_id,
            record.committed_at if record is not None else None,
            heartbeat=heartbeat,
            stopped=True,
            publishing=publishing,
        )
        write_writer_status(open_storage(state_dir), status)
    except Exception:
        log.warning("writing the writer status of %s", table, exc_info=True)


class WriterReporter:
    """A driver thread writing each started table's writer status record (module docstring).

    ``reported()`` lists the tables to report on each round. The thread holds ``lock`` while
    it writes, and writes only about a query ``reported()`` still lists, so the App, holding
    ``lock`` while it forgets a query, has the last word about it (and keeps the thread from
    writing into a table directory being deleted)."""

    def __init__(
        self,
        name: str,
        state_dir: str,
        reported: Reported,
        *,
        heartbeat: float = HEARTBEAT_SECONDS,
        check_interval: float = 0.5,
        publishing: Publishing = _no_publishing,
    ) -> None:
        self._state_dir = state_dir
        self._reported = reported
        self._publishing = publishing
        self.heartbeat = heartbeat
        self._check = min(check_interval, heartbeat)
        self.lock = threading.Lock()
        self._commits = _Commits(state_dir)
        self._last: dict[str, tuple[str, float]] = {}  # table: (state written, when)
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"sparkiq-writer-{name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (after the write under way, if any). Idempotent."""
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while True:
            for table, query, batch_id in self._reported():
                if self._stopped.is_set():
                    return
                try:
                    self._report(table, query, batch_id)
                except Exception:  # a storage hiccup: try again at the next heartbeat
                    log.warning("writing the writer status of %s", table, exc_info=True)
            if self._stopped.wait(self._check):
                return

    def _report(self, table: str, query: Any, batch_id: int) -> None:
        state, written = self._last.get(table, ("", 0.0))
        now = time.monotonic()
        try:
            active = bool(query.isActive)
        except Exception:
            active = False
        if active and state == "running" and now - written < self.heartbeat:
            return  # still running, and the last heartbeat is recent
        if not active and state in ("failed", "stopped"):
            return  # said once: an ended query does not change
        status = query_status(
            table,
            query,
            batch_id,
            self._commits.committed_at(table, batch_id),
            heartbeat=self.heartbeat,
            publishing=self._publishing(table),
        )
        with self.lock:  # a query the App stopped meanwhile gets its last word from the App
            if self._stopped.is_set() or all(q is not query for _, q, _ in self._reported()):
                return
            write_writer_status(open_storage(self._state_dir), status)
        self._last[table] = (status.state, now)
