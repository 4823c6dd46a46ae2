"""The writer's side of each table, as nodes and ``sparkiq status`` show it.

Each table's driver writes a status record into the changelog
(:mod:`sparkiq.changelog.writer_status`). :func:`writer_view` turns a record (or its
absence) into what users see, at a given time:

- ``running``: the query runs and its driver wrote within :func:`silent_after` seconds;
- ``failed``: the query failed; ``reason`` says why (Spark's, in a few lines);
- ``stopped``: the App stopped the query;
- ``silent``: the record says running, but the driver has not rewritten it for longer than
  :func:`silent_after` (killed, hung, cut off from the storage): ``heartbeat_age_seconds``
  says for how long;
- ``unknown``: there is no record (a writer older than the record, a table being created,
  or a table served from a Spark checkpoint).

:class:`WriterRecords` is a node's cache of the records: reads go to a background thread at
most once per ``refresh`` seconds, so ``GET /stats`` and ``/metrics`` never wait on the
storage (an object store GET per table) but for the very first read (up to 1 s).
:func:`writer_lines` is the text ``sparkiq status`` prints.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sparkiq.changelog import open_storage
from sparkiq.changelog.writer_status import WriterStatus, read_writer_status

__all__ = ["WriterRecords", "WriterView", "silent_after", "writer_lines", "writer_view"]

log = logging.getLogger("sparkiq.node")

#: A running writer not heard from for this many heartbeats (and at least
#: :data:`MIN_SILENT_SECONDS`) is silent: a busy driver may be late, not by this much.
SILENT_HEARTBEATS = 10
MIN_SILENT_SECONDS = 30.0


def silent_after(status: WriterStatus) -> float:
    """Seconds without a heartbeat after which ``status``'s running writer is silent."""
    return max(MIN_SILENT_SECONDS, SILENT_HEARTBEATS * status.heartbeat_seconds)


@dataclass(frozen=True)
class WriterView:
    """One table's writer as shown at ``now`` (see the module docstring for ``state``)."""

    table: str
    state: str
    reason: str | None = None
    failed_at: float | None = None
    query_name: str | None = None
    batch_id: int | None = None
    committed_at: float | None = None
    last_commit_age_seconds: float | None = None
    progress_batch_id: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: float | None = None
    heartbeat_at: float | None = None
    heartbeat_age_seconds: float | None = None
    error: str | None = None  # the record could not be read (torn, another format)
    #: the table's publishers to Kafka run by the writer (PublisherStatus.to_record each)
    publishing: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def writer_view(table: str, status: WriterStatus | None, now: float) -> WriterView:
    """What to show of ``table``'s writer at ``now`` given its record (None: none)."""
    if status is None:
        return WriterView(table, "unknown")
    age = max(0.0, now - status.written_at)
    state = status.state
    if state == "running" and age > silent_after(status):
        state = "silent"
    return WriterView(
        table=table,
        state=state,
        reason=status.reason,
        failed_at=status.failed_at,
        query_name=status.query_name or None,
        batch_id=status.batch_id,
        committed_at=status.committed_at,
        last_commit_age_seconds=(
            None if status.committed_at is None else max(0.0, now - status.committed_at)
        ),
        progress_batch_id=status.progress_batch_id,
        input_rows_per_second=status.input_rows_per_second,
        processed_rows_per_second=status.processed_rows_per_second,
        batch_duration_ms=status.batch_duration_ms,
        heartbeat_at=status.written_at,
        heartbeat_age_seconds=age,
        publishing=status.publishing,
    )


def read_view(state_dir: str, table: str, now: float) -> WriterView:
    """``table``'s writer read now from ``state_dir``; a record that cannot be read is
    shown as unknown, with the error (never raised: it is status, not data)."""
    try:
        return writer_view(table, read_writer_status(open_storage(state_dir), table), now)
    except Exception as exc:
        return WriterView(table, "unknown", error=f"cannot read the writer status: {exc}")


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.0f} min"


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def publishing_lines(view: WriterView) -> list[str]:
    """``sparkiq status``'s lines about the table's publishers to Kafka (one each)."""
    lines = []
    for p in view.publishing:
        text = (
            f"  publishing to Kafka topic {p.get('topic')!r}: {p.get('state')}, batch "
            f"{p.get('published_batch')} of {p.get('head_batch')}, {p.get('batches_behind')} "
            f"batches / {p.get('rows_behind')} rows behind"
        )
        lines.append(text + (f"; {p['error']}" if p.get("error") else ""))
    return lines


def writer_lines(view: WriterView) -> list[str]:
    """``sparkiq status``'s lines about one table's writer (indented under the table), and
    its publishers to Kafka."""
    return _writer_lines(view) + publishing_lines(view)


def _writer_lines(view: WriterView) -> list[str]:
    if view.state == "unknown":
        why = view.error or "no writer status record (a writer older than this sparkiq?)"
        return [f"  writer unknown: {why}"]
    commit = "no batch committed"
    if view.batch_id is not None and view.batch_id >= 0:
        commit = f"last commit batch {view.batch_id}"
        if view.last_commit_age_seconds is not None:
            commit += f" {_seconds(view.last_commit_age_seconds)} ago"
    if view.state == "failed":
        at = "" if view.failed_at is None else f" at {_clock(view.failed_at)}"
        lines = [f"  writer FAILED{at}; {commit}; the table stays there. Spark's reason:"]
        return lines + [f"    {line}" for line in (view.reason or "(none given)").splitlines()]
    if view.state == "silent":
        age = _seconds(view.heartbeat_age_seconds or 0.0)
        return [
            f"  writer SILENT: no heartbeat for {age} (its record says running: the driver "
            f"was killed, hangs or cannot write the state_dir); {commit}"
        ]
    if view.state == "stopped":
        return [f"  writer stopped; {commit}"]
    figures = []
    if view.input_rows_per_second is not None:
        figures.append(f"{view.input_rows_per_second:.1f} input rows/s")
    if view.batch_duration_ms is not None:
        figures.append(f"batch {view.batch_duration_ms:.0f} ms")
    progress = ", ".join(figures) if figures else "no batch run yet"
    return [f"  writer running: {progress}; {commit}"]


class WriterRecords:
    """A node's cache of its tables' writer records, refreshed in the background.

    :meth:`views` answers from the cache at once (after the first read, which it waits for
    up to ``first_wait`` seconds) and starts a refresh when the cache is older than
    ``refresh`` seconds; one refresh runs at a time."""

    def __init__(self, state_dir: str, *, refresh: float = 1.0, first_wait: float = 1.0) -> None:
        self._state_dir = state_dir
        self._refresh = refresh
        self._first_wait = first_wait
        self._lock = threading.Lock()
        self._records: dict[str, WriterStatus | None] = {}
        self._errors: dict[str, str] = {}
        self._read_at = 0.0
        self._tables: tuple[str, ...] = ()
        self._refreshing: threading.Thread | None = None

    def views(self, tables: Iterable[str]) -> list[WriterView]:
        """The writer of each of ``tables``, in order, as of the last refresh."""
        wanted = tuple(tables)
        with self._lock:
            thread = self._refreshing
            stale = time.monotonic() - self._read_at > self._refresh or wanted != self._tables
            if stale and thread is None:
                self._tables = wanted
                thread = threading.Thread(
                    target=self._read, name="sparkiq-writer-records", daemon=True
                )
                self._refreshing = thread
                thread.start()
            first = self._read_at == 0.0
        if first and thread is not None:
            thread.join(self._first_wait)
        now = time.time()
        with self._lock:
            out = []
            for table in wanted:
                if table in self._errors:
                    out.append(WriterView(table, "unknown", error=self._errors[table]))
                else:
                    out.append(writer_view(table, self._records.get(table), now))
            return out

    def _read(self) -> None:
        records: dict[str, WriterStatus | None] = {}
        errors: dict[str, str] = {}
        storage = None
        try:
            storage = open_storage(self._state_dir)
            for table in self._tables:
                try:
                    records[table] = read_writer_status(storage, table)
                except Exception as exc:
                    errors[table] = f"cannot read the writer status: {exc}"
        except Exception:
            log.warning("reading writer status records", exc_info=True)
        finally:
            with self._lock:
                if storage is not None:
                    self._records, self._errors = records, errors
                self._read_at = time.monotonic()
                self._refreshing = None
