"""A partition whose local disk is full: the others go on, it waits and catches up.

Partition 1's RocksDB lives on a tmpfs of its own, filled up while the writer goes on
committing. A store error used to abort the whole table's poll (the partitions after the
failing one stopped too) and was retried, with the partition's versions reloaded and a
traceback logged, on every poll: 30 times a second for as long as the disk stayed full.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node
from sparkiq.changelog import replica as replica_module
from sparkiq.changelog.replica import TableReplica
from sparkiq.changelog.source import SegmentSource
from sparkiq.errors import ChangelogError, StoreError
from sparkiq.stores.base import Store
from sparkiq.stores.rocksdb import RocksDBStore
from tests.changelog.helpers import expected_rows, make_table, write_batch
from tests.small_disk import fill

PARTITIONS = 4
FULL = 1  # the partition whose disk fills up
PAD = "-" * 100


def _rows(replica: TableReplica) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for partition in replica.partitions.values():
        iterator, _ = partition.store.scan(None, None)
        with iterator:
            rows.update({row["k"]: row for _, row in partition.store.decoded(iterator)})
    return rows


def test_a_full_disk_under_one_partition_holds_back_only_that_partition(
    tmp_path: Path, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    changelog = make_table(str(tmp_path / "state"), partitions=PARTITIONS)

    def factory(table: str, partition: int) -> Store:
        under = small_disk if partition == FULL else tmp_path / "local"
        return RocksDBStore(under / table / f"{partition:05d}")

    history: list[dict[str, int | None]] = []

    def commit(batch: int) -> None:
        # Long keys: each batch needs new pages of the full disk, not the rest of one.
        rows: dict[str, int | None] = {f"k{i:03d}{PAD}": batch * 1000 + i for i in range(256)}
        history.append(rows)
        write_batch(changelog, batch, rows)

    commit(0)
    replica = TableReplica(SegmentSource(changelog), range(PARTITIONS), factory)
    replica.poll()
    assert {r.batch_id for r in replica.partitions.values()} == {0}

    filler = fill(small_disk)
    caplog.set_level(logging.ERROR, logger="sparkiq.replica")
    polls = 0
    for batch in range(1, 4):
        commit(batch)
        for _ in range(20):  # a tailer polls far more often than batches come
            replica.poll()
            polls += 1
    status = {s.partition: s for s in replica.status()}
    assert {p: s.batch_id for p, s in status.items() if p != FULL} == {0: 3, 2: 3, 3: 3}
    assert status[FULL].state == "error"
    assert status[FULL].batch_id == 0
    assert "No space left on device" in (status[FULL].error or "")
    failures = [r for r in caplog.records if "No space left" in r.getMessage()]
    assert 1 <= len(failures) <= 2, f"{len(failures)} errors logged in {polls} polls"
    # It was tried again after a pause, not on every poll.
    assert replica.partitions[FULL].retry_at > 0

    filler.unlink()
    deadline = time.monotonic() + 120  # RocksDB resumes on its own once the disk has room
    while replica.partitions[FULL].batch_id < 3:
        assert time.monotonic() < deadline, f"never caught up: {replica.status()[FULL]}"
        time.sleep(replica_module.STORE_RETRY_MAX_SECONDS / 4)
        replica.poll()
    assert {s.state for s in replica.status()} == {"live"}
    assert _rows(replica) == expected_rows(history)
    replica.close()


def test_a_tailing_failure_that_repeats_is_logged_once_a_minute_by_kind(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A flaky changelog store fails on another file at each poll: the messages differ, the
    kind does not, and the node logged a traceback per poll."""
    make_table(str(tmp_path / "state"), partitions=1)
    caplog.set_level(logging.ERROR, logger="sparkiq.node")
    with Node(str(tmp_path / "state"), node_id="n1") as node:
        hosting = node._hosting
        for batch in range(50):
            hosting._log_poll_failure("t", ChangelogError(f"cannot read commit {batch}"))
        hosting._log_poll_failure("t", StoreError("the disk is gone"))
        hosting._log_poll_failure("t", StoreError("the disk is still gone"))
        hosting._log_poll_failure("u", StoreError("another table"))
    logged = [r for r in caplog.records if r.getMessage().startswith("tailing")]
    assert [(r.getMessage().split()[1], str(r.exc_info[1])) for r in logged] == [
        ("t", "cannot read commit 0"),
        ("t", "the disk is gone"),
        ("u", "another table"),
    ]
