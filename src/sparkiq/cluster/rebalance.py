"""Rebalancing: make a node's hosted partitions follow the cluster's assignment.

The :class:`~sparkiq.cluster.coordinator.Coordinator` calls :meth:`Rebalancer.rebalance` with
each new assignment. A newly assigned partition is opened (the tailer restores it); one no
longer assigned here is released only once the coordinator says every new owner has caught up
(:meth:`~sparkiq.cluster.coordinator.Coordinator.handed_off`). A released partition leaves
routing at once but is *retired*, not closed: reads already holding its store finish during
``release_grace`` seconds, then it is closed and its local files deleted. A partition assigned
back during its grace period is revived as it is, without a restore.

Every change happens under :meth:`~sparkiq.serving.hosting.Hosting.changing_partitions`, so
polls never see a partition half-added or half-released; the retired list is only touched
there too (or from :meth:`Rebalancer.forget`, called by the hosting under the same locks).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkiq.changelog.replica import PartitionReplica
from sparkiq.cluster.assignment import Assignment
from sparkiq.serving.hosting import Hosting

__all__ = ["Rebalancer", "RetiredPartition"]

log = logging.getLogger("sparkiq.node")


@dataclass(frozen=True, slots=True)
class RetiredPartition:
    """A released partition kept open until ``due`` (monotonic seconds) so that reads in
    flight finish; ``path`` is its local directory, deleted when it is closed."""

    due: float
    table: str
    replica: PartitionReplica
    path: str | None


class Rebalancer:
    """Opens and releases ``hosting``'s partitions as assignments change (see the module
    docstring). ``handed_off(table, partition, batch_id)`` says whether a partition held
    at ``batch_id`` may be released."""

    def __init__(
        self,
        hosting: Hosting,
        *,
        node_id: str,
        handed_off: Callable[[str, int, int], bool],
        release_grace: float,
    ) -> None:
        self._hosting = hosting
        self._node_id = node_id
        self._handed_off = handed_off
        self._release_grace = release_grace
        self._retired: list[RetiredPartition] = []

    def rebalance(self, assignment: Assignment) -> None:
        """Open newly assigned partitions; release those handed off."""
        added = False
        with self._hosting.changing_partitions() as tables:
            for name, replica in tables.items():
                count = replica.manifest.partitions
                want = assignment.hosted_by(self._node_id, name, count)
                stores = self._hosting.route(name).stores
                for partition in sorted(want - set(replica.partitions)):
                    log.info("%s: now hosting %s[%d]", self._node_id, name, partition)
                    revived = self._revive(name, partition)
                    if revived is not None:  # released a moment ago: take it back as it is
                        replica.partitions[partition] = revived
                    else:
                        revived = replica.add_partition(partition)
                    stores[partition] = revived.store
                    added = True
                for partition in sorted(set(replica.partitions) - want):
                    held = replica.partitions[partition]
                    if self._handed_off(name, partition, held.batch_id):
                        log.info("%s: released %s[%d]", self._node_id, name, partition)
                        stores[partition] = None
                        del replica.partitions[partition]
                        self._retired.append(
                            RetiredPartition(
                                time.monotonic() + self._release_grace,
                                name,
                                held,
                                self._local_path(name, partition),
                            )
                        )
            self._close_due()
        if added:
            self._hosting.wake()

    def forget(self, table: str) -> None:
        """Close the retired partitions of a dropped table (their files go with the table)."""
        for entry in [r for r in self._retired if r.table == table]:
            entry.replica.store.close()
            self._retired.remove(entry)

    def close(self) -> None:
        """Close every retired partition now, keeping its files (the node is stopping)."""
        with self._hosting.changing_partitions():
            for entry in self._retired:
                entry.replica.store.close()
            self._retired = []

    def _local_path(self, table: str, partition: int) -> str | None:
        hosting = self._hosting
        if hosting.store_kind != "rocksdb" or hosting.local_dir is None:
            return None
        return os.path.join(hosting.local_dir, table, f"{partition:05d}")

    def _revive(self, table: str, partition: int) -> PartitionReplica | None:
        for entry in self._retired:
            if entry.table == table and entry.replica.partition == partition:
                self._retired.remove(entry)
                return entry.replica
        return None

    def _close_due(self) -> None:
        now = time.monotonic()
        keep = []
        for entry in self._retired:
            if now >= entry.due:
                entry.replica.store.close()
                if entry.path is not None:
                    shutil.rmtree(entry.path, ignore_errors=True)
            else:
                keep.append(entry)
        self._retired = keep
