"""Following commits on the driver: what the App knows about its tables' batches.

The ``foreachBatch`` sink may run in another process (Spark Connect), so the App never
learns of a commit from the sink object. It reads the changelog instead:

- :class:`CommitWatcher`, a driver thread, probes each started table's next commit record
  every poll interval and reports each new one (the App wakes its local node and schedules
  snapshots);
- :func:`newest_commit`, called by ``App.process_all_available`` once Spark reports the
  input processed, finds the newest commit record and checks it against the query's last
  progress: a batch Spark reports done with input must be committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkiq.changelog import Changelog
from sparkiq.errors import SparkiqError

__all__ = ["CommitWatcher", "finished_batch", "newest_commit", "wait_between_batches"]

log = logging.getLogger("sparkiq.app")

#: ``(table name, newest batch already reported, handle)`` of every started table.
Watched = Callable[[], list[tuple[str, int, Any]]]


class CommitWatcher:
    """A driver thread reporting every new commit record of the watched tables, in order,
    to ``on_commit(handle, batch_id)``; it runs every ``interval`` seconds."""

    def __init__(
        self,
        name: str,
        state_dir: str,
        watched: Watched,
        on_commit: Callable[[Any, int], None],
        interval: float,
    ) -> None:
        self._state_dir = state_dir
        self._watched = watched
        self._on_commit = on_commit
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"sparkiq-commits-{name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            for table, seen, handle in self._watched():
                try:  # one existence check per table and round, as the node's tailer does
                    changelog = Changelog(self._state_dir, table)
                    while changelog.has_commit(seen + 1):
                        seen += 1
                        self._on_commit(handle, seen)
                except Exception:  # a storage hiccup: look again next round
                    log.warning("watching commits of %s", table, exc_info=True)


def newest_commit(changelog: Changelog, known: int, query: Any = None) -> int:
    """The newest committed batch id of ``changelog`` (-1: none), probing forward from
    ``known`` when that batch is still there, else listing the commits. With ``query``,
    raises when its last progress reports a batch with input that is not committed."""
    if known < 0 or not changelog.has_commit(known):
        committed = changelog.committed_batch_ids()
        known = committed[-1] if committed else -1
    while changelog.has_commit(known + 1):
        known += 1
    progress = None if query is None else query.lastProgress
    if progress is not None:
        done, rows = _progress_field(progress, "batchId"), _progress_field(progress, "numInputRows")
        if rows and done is not None and int(done) > known:
            raise SparkiqError(
                f"Spark reports batch {done} of {changelog.table!r} done but the changelog's "
                f"newest commit is batch {known}",
                store=changelog.table,
            )
    return known


def _progress_field(progress: Any, name: str) -> Any:
    """A field of ``query.lastProgress``: a dict, or a progress object, by Spark version."""
    if isinstance(progress, dict):
        return progress.get(name)
    return getattr(progress, name, None)


def finished_batch(query: Any) -> Any:
    """The id of the newest batch ``query`` has finished (None before its first), read when
    a stop is asked for: :func:`wait_between_batches` then waits for the batch after it."""
    try:
        return _progress_field(query.lastProgress or {}, "batchId")
    except Exception:  # already stopped or the session is gone: the stop's wait ends at once
        log.debug("reading the last progress of a query", exc_info=True)
        return None


def wait_between_batches(query: Any, timeout: float, finished: Any) -> None:
    """Wait (at most ``timeout`` s) until ``query`` is not in the middle of a trigger, or
    until the batch after ``finished`` (:func:`finished_batch` when the stop was asked for),
    the one running then, has ended. A query whose batches take longer than its trigger
    interval starts each as the one before ends: a pause between two is rarely seen, and
    waiting for one ran to ``timeout`` before the stop interrupted a batch anyway (10 s for
    each Ctrl-C of ``sparkiq demo`` on a busy machine)."""
    deadline = time.monotonic() + timeout
    while (
        _progress_field(query.lastProgress or {}, "batchId") == finished
        and query.isActive
        and query.status.get("isTriggerActive")
        and time.monotonic() < deadline
    ):
        # Each look is three calls into Spark's driver. Looked at often: the next batch
        # starts as this one ends, and once its foreachBatch runs, it can commit before the
        # stop takes hold.
        time.sleep(0.02)
