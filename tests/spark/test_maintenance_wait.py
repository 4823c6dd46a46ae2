"""``TableMaintenance.wait`` (what ``App.compact`` calls) while the commit watcher starts a
run on its own thread: the run is joined or not seen, never joined before it started.

Found by the suite: ``App.compact`` raised "cannot join thread before it is started" when it
ran between the watcher creating the run's thread and starting it."""

from __future__ import annotations

import threading
import types
from typing import Any

import pytest

from sparkiq.spark import maintenance
from sparkiq.spark.maintenance import TableMaintenance


def test_a_wait_while_a_run_is_being_started_does_not_fail(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    work = TableMaintenance(None, str(tmp_path), "t", snapshot_every=1, retention_seconds=None)
    ran = threading.Event()
    monkeypatch.setattr(work, "run", lambda batch_id=None: ran.set())

    class WaitedForBeforeItStarts(threading.Thread):
        """A thread whose start lets the other side (App.compact) wait first."""

        def start(self) -> None:
            work.wait()
            super().start()

    monkeypatch.setattr(
        maintenance, "threading", types.SimpleNamespace(Thread=WaitedForBeforeItStarts)
    )
    work.on_commit(1)
    work.wait(timeout=60)
    assert ran.is_set()
