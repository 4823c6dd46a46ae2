"""Replicas: local copies of a table's partitions, kept current by tailing the changelog.

A :class:`TableReplica` hosts any subset of one table's partitions. :meth:`TableReplica.poll`
reads each new commit record once and applies it to every hosted partition that has not
applied it yet, in batch id order. One batch is applied to one partition atomically: its
changes and the new position go into the store in one write, so a replica killed at any point
restarts from its local files at a batch boundary and resumes with the next batch (no batch is
applied twice, none is skipped).

A partition whose next segment is missing or corrupted stops advancing and records the error
(:attr:`PartitionReplica.error`): it keeps serving the last consistent state with its true
position, so bounded queries see it is behind, and it retries on later polls.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.log import Changelog
from sparkiq.changelog.manifest import TableManifest
from sparkiq.errors import ChangelogError
from sparkiq.query.position import Position
from sparkiq.stores.base import Store
from sparkiq.stores.memory import MemoryStore
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.rocksdb import RocksDBStore

__all__ = ["PartitionReplica", "ReplicaStatus", "TableReplica", "StoreFactory"]

log = logging.getLogger("sparkiq.replica")

#: Builds the byte store of one partition: ``factory(table, partition) -> Store``.
StoreFactory = Callable[[str, int], Store]

_GAP_SCAN_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """Health and progress of one hosted partition."""

    table: str
    partition: int
    batch_id: int
    latest_batch_id: int
    lag_batches: int
    lag_seconds: float
    position: Position
    error: str | None

    @property
    def healthy(self) -> bool:
        return self.error is None


class PartitionReplica:
    """One hosted partition: its typed store plus its changelog progress."""

    def __init__(self, table: str, partition: int, store: PartitionStore) -> None:
        self.table = table
        self.partition = partition
        self.store = store
        self.error: str | None = None

    @property
    def batch_id(self) -> int:
        return self.store.batch_id

    def apply(self, changelog: Changelog, record: CommitRecord) -> None:
        """Apply one committed batch (the caller guarantees it is the next one)."""
        keys, values = changelog.read_segment(record, self.partition)
        position = Position.from_map(
            {**record.position, self.table: {self.partition: record.batch_id}}
        )
        self.store.apply(
            zip(keys, values, strict=True),
            record.batch_id,
            position,
            replace_all=record.mode == "complete",
        )


class TableReplica:
    """The hosted partitions of one table and the changelog they follow."""

    def __init__(
        self,
        changelog: Changelog,
        partitions: Iterable[int],
        store_factory: StoreFactory,
    ) -> None:
        self.changelog = changelog
        self.manifest: TableManifest = changelog.manifest()
        self.table = changelog.table
        self._store_factory = store_factory
        self.partitions: dict[int, PartitionReplica] = {}
        self.latest_batch_id = -1
        self.latest_committed_at = 0.0
        self._last_gap_scan = 0.0
        for partition in sorted(partitions):
            self.add_partition(partition)

    def add_partition(self, partition: int) -> PartitionReplica:
        if not 0 <= partition < self.manifest.partitions:
            raise ValueError(
                f"table {self.table!r} has partitions 0..{self.manifest.partitions - 1}, "
                f"not {partition}"
            )
        store = PartitionStore(
            self.table, partition, self.manifest.schema, self._store_factory(self.table, partition)
        )
        replica = self.partitions[partition] = PartitionReplica(self.table, partition, store)
        return replica

    def poll(self) -> int:
        """Apply every newly committed batch to every hosted partition; return how many
        (partition, batch) applications were made."""
        if not self.partitions:
            return 0
        healthy = [r for r in self.partitions.values()]
        start = min(r.batch_id for r in healthy)
        now = time.monotonic()
        scan_gaps = now - self._last_gap_scan > _GAP_SCAN_SECONDS
        if scan_gaps:
            self._last_gap_scan = now
        applied = 0
        try:
            for record in self.changelog.commits_after(start, scan_gaps=scan_gaps):
                if record.batch_id > self.latest_batch_id:
                    self.latest_batch_id = record.batch_id
                    self.latest_committed_at = record.committed_at
                blocked = 0
                for replica in healthy:
                    if replica.batch_id >= record.batch_id:
                        continue
                    if replica.error is not None and replica.batch_id < record.batch_id - 1:
                        blocked += 1
                        continue
                    try:
                        replica.apply(self.changelog, record)
                        replica.error = None
                        applied += 1
                    except ChangelogError as exc:
                        if replica.error != exc.message:
                            log.error(
                                "%s[%d]: cannot apply batch %d: %s",
                                self.table,
                                replica.partition,
                                record.batch_id,
                                exc.message,
                            )
                        replica.error = exc.message
                        blocked += 1
                if blocked == len(healthy):
                    break
        except ChangelogError as exc:  # a corrupted commit record blocks every partition
            for replica in healthy:
                replica.error = exc.message
            log.error("%s: %s", self.table, exc.message)
        return applied

    def status(self) -> list[ReplicaStatus]:
        now = time.time()
        out = []
        for partition, replica in sorted(self.partitions.items()):
            lag = max(0, self.latest_batch_id - replica.batch_id)
            out.append(
                ReplicaStatus(
                    table=self.table,
                    partition=partition,
                    batch_id=replica.batch_id,
                    latest_batch_id=self.latest_batch_id,
                    lag_batches=lag,
                    lag_seconds=max(0.0, now - self.latest_committed_at) if lag else 0.0,
                    position=replica.store.position,
                    error=replica.error,
                )
            )
        return out

    def close(self) -> None:
        for replica in self.partitions.values():
            replica.store.close()
        self.partitions.clear()


def rocksdb_factory(local_dir: str, manifest: TableManifest) -> StoreFactory:
    """Stores under ``local_dir/<table>/<partition:05d>``, rebuilt when the table changed.

    ``local_dir/<table>/replica.json`` records the manifest incarnation the local files were
    built from; when it differs (the table's changelog was deleted and created again) the
    local files are discarded and the partitions restore from the changelog.
    """
    table_dir = os.path.join(local_dir, manifest.name)
    marker = os.path.join(table_dir, "replica.json")
    try:
        with open(marker) as handle:
            built_from = json.load(handle).get("incarnation")
    except (FileNotFoundError, ValueError):
        built_from = None
    if built_from != manifest.incarnation:
        if os.path.isdir(table_dir):
            log.warning(
                "discarding local replica of %r built from another changelog", manifest.name
            )
            shutil.rmtree(table_dir)
        os.makedirs(table_dir, exist_ok=True)
        with open(marker, "w") as handle:
            json.dump({"incarnation": manifest.incarnation}, handle)

    def factory(table: str, partition: int) -> Store:
        return RocksDBStore(os.path.join(table_dir, f"{partition:05d}"))

    return factory


def memory_factory(table: str, partition: int) -> Store:
    return MemoryStore()
