"""A replica's state: ``restoring`` means a backlog, not the batch it is applying right now.

A replica following a busy writer has seen the newest commit and is applying it for most of
each poll; on a loaded machine that is most of the time. Its state used to be ``restoring``
whenever it was one batch behind, so ``/readyz`` flapped and a cluster under load never
looked ready at once (a fault test's settle failed with every partition "restoring, lag 1").
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sparkiq.changelog import replica as replica_module
from sparkiq.changelog.replica import TableReplica, memory_factory
from sparkiq.changelog.source import SegmentSource
from tests.changelog.helpers import make_table, write_batch


class _Gate:
    """A row transform that holds the poll inside a batch until released."""

    def __init__(self) -> None:
        self.closed = False
        self.inside = threading.Event()
        self.opened = threading.Event()

    def __call__(self, value: bytes) -> bytes:
        if self.closed:
            self.inside.set()
            assert self.opened.wait(60), "the test never opened the gate"
        return value


def _states(replica: TableReplica) -> list[tuple[str, int]]:
    return [(s.state, s.lag_batches) for s in replica.status()]


def test_a_replica_applying_the_newest_batch_is_live_and_one_behind_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    changelog = make_table(str(tmp_path), partitions=1)
    for batch in range(3):
        write_batch(changelog, batch, {f"k{batch}": batch})
    gate = _Gate()
    replica = TableReplica(SegmentSource(changelog), [0], memory_factory, transform=gate)
    assert _states(replica) == [("restoring", 3)]  # a first restore: never caught up yet
    replica.poll()
    assert _states(replica) == [("live", 0)]

    write_batch(changelog, 3, {"k3": 3})
    gate.closed = True
    poller = threading.Thread(target=replica.poll)
    poller.start()
    try:
        assert gate.inside.wait(60), "the poll never reached batch 3"
        assert _states(replica) == [("live", 1)]  # seen, being applied: keeping up
        monkeypatch.setattr(replica_module, "KEEPING_UP_SECONDS", 0.2)
        time.sleep(0.3)
        assert _states(replica) == [("restoring", 1)]  # not caught up for that long: a backlog
    finally:
        gate.opened.set()
        poller.join(60)
    assert _states(replica) == [("live", 0)]
    replica.close()
