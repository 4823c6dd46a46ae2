"""Replicas: local copies of a table's partitions, kept current by tailing the changelog.

What a replica reads comes through a :class:`~sparkiq.changelog.source.ChangelogSource`: a
sparkiq changelog (segments) or a Spark checkpoint's state files; nothing here knows which.

A :class:`TableReplica` hosts any subset of one table's partitions. :meth:`TableReplica.poll`
reads each new commit record once and applies it to every hosted partition that has not
applied it yet, in batch id order. One batch is applied to one partition atomically: its
changes and the new position go into the store in one write, so a replica killed at any point
restarts from its local files at a batch boundary and resumes with the next batch (no batch is
applied twice, none is skipped).

Restores start from the newest usable snapshot (see :mod:`sparkiq.changelog.snapshot`) when
the replica is empty, or when its next batch is no longer in the changelog (retention deleted
it): the snapshot replaces the partition's contents in one atomic write, then tailing resumes
after the snapshot's batch. A replica never skips a batch it cannot read: when the next batch
is missing or corrupted and no snapshot covers it, the partition stops advancing, records the
error (:attr:`PartitionReplica.error`) and keeps serving its last consistent state with its
true position, so bounded queries see it is behind; it retries on later polls.

A replica may hold a *subset* of the table: a ``transform`` (see :class:`RowTransform`) is
applied to every row on its way in, which is how followers filter and project.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.manifest import TableManifest
from sparkiq.changelog.snapshot import SnapshotInfo
from sparkiq.changelog.source import ChangelogSource, newest_snapshot
from sparkiq.errors import ChangelogError, StoreError
from sparkiq.query.position import Position
from sparkiq.schema.types import TableSchema
from sparkiq.stores.base import Store
from sparkiq.stores.memory import MemoryStore
from sparkiq.stores.partition import PartitionStore
from sparkiq.stores.rocksdb import RocksDBStore

__all__ = [
    "PartitionReplica",
    "ReplicaStatus",
    "RowTransform",
    "StoreFactory",
    "TableReplica",
]

log = logging.getLogger("sparkiq.replica")

#: Builds the byte store of one partition: ``factory(table, partition) -> Store``.
StoreFactory = Callable[[str, int], Store]

#: Maps a changelog row (encoded) to the row to store, or None to store nothing for the key
#: (a row filtered out is a deletion: the key may have matched before). Must be
#: deterministic: replicas and restarts rely on applying it twice giving the same result.
RowTransform = Callable[[bytes], bytes | None]

_BOOTSTRAP_CHECK_SECONDS = 5.0
#: A replica that applied everything it knew of this recently is ``live`` even though a
#: newer batch is already committed. A replica following a busy writer is one batch behind
#: for most of each poll (it has seen the commit and is applying it); on a loaded machine
#: that is most of the time, and a state that flipped to ``restoring`` with it made
#: ``/readyz`` flap and kept a cluster from ever looking ready. ``restoring`` means a
#: backlog: never caught up since it was opened, or not for this long.
KEEPING_UP_SECONDS = 5.0
_PROGRESS_LOG_SECONDS = 2.0
# How many commits' source offsets a table keeps in memory: a producer's bound asks for a
# record a few batches old at most; an older one is met by the oldest kept batch, which
# has read it too (a wider table's offsets cost more: this bounds the memory).
_RECENT_SOURCES = 256
#: A partition whose local store refused a write (a full disk, an I/O error) is tried again
#: after this long, doubling up to :data:`STORE_RETRY_MAX_SECONDS`. Each failed write also
#: reloads the partition's versions from the store; retried on every poll (every few tens of
#: milliseconds) a full disk cost a core and logged a traceback 30 times a second.
STORE_RETRY_FIRST_SECONDS = 0.05
STORE_RETRY_MAX_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """Health and progress of one hosted partition.

    ``state`` is ``"live"`` (caught up, or keeping up: it applied everything it knew of in
    the last :data:`KEEPING_UP_SECONDS`), ``"restoring"`` (applying a backlog or a snapshot)
    or ``"error"`` (stuck on a batch it cannot read; ``error`` says which file and why).
    ``restored_rows``/``restored_bytes`` count what this process applied since it opened the
    replica; ``eta_seconds`` extrapolates the backlog from the recent apply rate.
    """

    table: str
    partition: int
    batch_id: int
    latest_batch_id: int
    lag_batches: int
    lag_seconds: float
    position: Position
    error: str | None
    state: str = "live"
    restored_rows: int = 0
    restored_bytes: int = 0
    eta_seconds: float | None = None

    @property
    def healthy(self) -> bool:
        return self.error is None


class PartitionReplica:
    """One hosted partition: its typed store plus its changelog progress."""

    def __init__(
        self,
        table: str,
        partition: int,
        store: PartitionStore,
        transform: RowTransform | None = None,
    ) -> None:
        self.table = table
        self.partition = partition
        self.store = store
        self.transform = transform
        self.error: str | None = None
        #: Not tried again before this (monotonic), after its store refused a write.
        self.retry_at = 0.0
        self._retry_delay = 0.0
        self.applied_rows = 0
        self.applied_bytes = 0
        self.applied_batches = 0
        self.apply_seconds = 0.0
        self.caught_up_at: float | None = None  # monotonic; when it last reached the head

    @property
    def batch_id(self) -> int:
        return self.store.batch_id

    def back_off(self) -> None:
        """Its store refused a write: wait before trying again, longer each time."""
        self._retry_delay = min(
            STORE_RETRY_MAX_SECONDS, max(STORE_RETRY_FIRST_SECONDS, 2 * self._retry_delay)
        )
        self.retry_at = time.monotonic() + self._retry_delay

    def applied(self) -> None:
        """A batch landed: clear the error and the back-off, saying so after an error."""
        if self.error is not None:
            log.info(
                "%s[%d]: applying again (batch %d) after: %s",
                self.table,
                self.partition,
                self.batch_id,
                self.error,
            )
        self.error = None
        self._retry_delay = 0.0

    def _values(self, values: list[bytes | None]) -> list[bytes | None]:
        transform = self.transform
        if transform is None:
            return values
        return [None if v is None else transform(v) for v in values]

    def apply(self, source: ChangelogSource, record: CommitRecord) -> None:
        """Apply one committed batch (the caller guarantees it is the next one)."""
        started = time.perf_counter()
        columns = source.read_change_columns(record, self.partition)
        if columns is None:
            keys, values = source.read_changes(record, self.partition)
        else:
            keys, values = columns[0].to_pylist(), columns[1].to_pylist()
            if self.transform is not None:  # the versions need the rows as transformed
                columns = None
        position = Position.from_map(
            {**record.position, self.table: {self.partition: record.batch_id}}
        )
        self.store.apply_changes(
            keys,
            self._values(values),
            record.batch_id,
            position,
            replace_all=record.mode == "complete",
            committed_at=record.committed_at,
            columns=columns,
        )
        self._account(len(keys), record.segments.get(self.partition), started)

    def load_snapshot(
        self,
        info: SnapshotInfo,
        keys: list[bytes],
        values: list[bytes],
        committed_at: float = 0.0,
    ) -> None:
        """Replace the partition's contents with a snapshot, atomically (``committed_at``:
        the commit time of the snapshot's batch, 0.0 when unknown)."""
        started = time.perf_counter()
        position = Position.from_map({**info.position, self.table: {self.partition: info.batch_id}})
        self.store.apply_changes(
            keys,
            self._values(list(values)),
            info.batch_id,
            position,
            replace_all=True,
            committed_at=committed_at,
        )
        self.applied_rows += len(keys)
        self.applied_bytes += info.size
        self.apply_seconds += time.perf_counter() - started
        log.info(
            "%s[%d]: restored %d rows (%d bytes) from the snapshot of batch %d",
            self.table,
            self.partition,
            len(keys),
            info.size,
            info.batch_id,
        )

    def _account(self, rows: int, segment: object, started: float) -> None:
        self.applied_rows += rows
        self.applied_bytes += getattr(segment, "size", 0)
        self.applied_batches += 1
        self.apply_seconds += time.perf_counter() - started


class TableReplica:
    """The hosted partitions of one table and the changelog source they follow.

    ``schema`` overrides the stored schema (a follower's projection, matching what
    ``transform`` produces). ``on_progress`` is called every few seconds while a long
    restore or backlog is being applied.
    """

    def __init__(
        self,
        source: ChangelogSource,
        partitions: Iterable[int],
        store_factory: StoreFactory,
        *,
        schema: TableSchema | None = None,
        transform: RowTransform | None = None,
        on_progress: Callable[[], None] | None = None,
    ) -> None:
        self.source = source
        self.on_progress = on_progress
        self.manifest: TableManifest = source.manifest()
        self.table = source.table
        self.schema = schema if schema is not None else self.manifest.schema
        self.transform = transform
        self._store_factory = store_factory
        self.partitions: dict[int, PartitionReplica] = {}
        self.latest_batch_id = -1
        self.latest_committed_at = 0.0
        # The source offsets (``kafka:<topic>`` components) of the newest commits seen,
        # oldest first: what turns a producer's bound into a batch without reading the
        # changelog (sparkiq.serving.source_bounds). Appended by the polling thread only;
        # readers copy it (a deque's append and list() are atomic under the GIL).
        self.recent_sources: deque[tuple[int, Position]] = deque(maxlen=_RECENT_SOURCES)
        self._last_bootstrap_check = -1e9
        self._last_progress_log = time.monotonic()
        # Know the head before anything can ask for status: a node serving before its first
        # poll must not call a replica that applied nothing "live" (and /readyz ready).
        self._learn_head()
        for partition in sorted(partitions):
            self.add_partition(partition)

    def add_partition(self, partition: int) -> PartitionReplica:
        if not 0 <= partition < self.manifest.partitions:
            raise ValueError(
                f"table {self.table!r} has partitions 0..{self.manifest.partitions - 1}, "
                f"not {partition}"
            )
        store = PartitionStore(
            self.table,
            partition,
            self.schema,
            self._store_factory(self.table, partition),
            self.manifest.history,
            commit_time=self.commit_time,
        )
        replica = PartitionReplica(self.table, partition, store, self.transform)
        self.partitions[partition] = replica
        self._last_bootstrap_check = -1e9  # restore it from a snapshot if one helps
        return replica

    def history(self) -> dict[str, Any]:
        """How far back the table can be read here: its history setting and the oldest and
        newest batch every hosted partition still holds (None: none)."""
        held = [r.store.versions for r in self.partitions.values()]
        kept = [v for v in held if v is not None and v.newest >= 0]
        setting = self.manifest.history
        return {
            "batches": setting.batches,
            "seconds": setting.seconds,
            "oldest_batch": max((v.oldest for v in kept), default=None),
            "newest_batch": min((v.newest for v in kept), default=None),
        }

    def commit_time(self, batch_id: int) -> float:
        """When ``batch_id`` was committed (Unix seconds; 0.0 when its commit record is gone
        or unreadable): what a partition's versions record for a batch they are loaded at."""
        try:
            record = self.source.read_commit(batch_id)
        except ChangelogError:
            return 0.0
        return 0.0 if record is None else record.committed_at

    def poll(self) -> int:
        """Apply every newly committed batch to every hosted partition; return how many
        (partition, batch) applications were made (a snapshot load counts as one)."""
        if not self.partitions:
            return 0
        applied = 0
        now = time.monotonic()
        if now - self._last_bootstrap_check > _BOOTSTRAP_CHECK_SECONDS:
            self._last_bootstrap_check = now
            self._learn_head()
            applied += self._bootstrap()
        # A partition stuck on a batch that is gone must not hold the others back.
        replicas = [
            r
            for r in self.partitions.values()
            if r.retry_at <= now and (r.error is None or self.source.has_commit(r.batch_id + 1))
        ]
        if not replicas:
            return applied
        start = min(r.batch_id for r in replicas)
        stuck: list[PartitionReplica] = []
        try:
            for record in self.source.commits_after(start):
                self._saw(record)
                for replica in replicas:
                    if replica.batch_id >= record.batch_id or replica in stuck:
                        continue
                    if replica.batch_id < record.batch_id - 1:
                        stuck.append(replica)  # its next batch is gone: see _bootstrap
                        continue
                    try:
                        replica.apply(self.source, record)
                        replica.applied()
                        applied += 1
                    except ChangelogError as exc:
                        self._fail(replica, record.batch_id, exc.message)
                        stuck.append(replica)
                    except StoreError as exc:  # this partition's disk: the others go on
                        self._fail(replica, record.batch_id, exc.message)
                        replica.back_off()
                        stuck.append(replica)
                if len(stuck) == len(replicas):
                    break
                self._log_progress()
        except ChangelogError as exc:  # a corrupted commit record blocks every partition
            for replica in replicas:
                replica.error = exc.message
            log.error("%s: %s", self.table, exc.message)
        if stuck:  # a snapshot may cover what is missing: check now rather than in 5 s
            self._last_bootstrap_check = -1e9
        now = time.monotonic()
        for replica in replicas:
            if replica.error is None and replica.batch_id >= self.latest_batch_id:
                replica.caught_up_at = now
        return applied

    def _learn_head(self) -> None:
        """Before the first batch is applied, read the newest commit, so that status shows a
        first restore as ``restoring`` with its real lag (and an ETA), not as ``live``."""
        if self.latest_batch_id >= 0:
            return
        committed = self.source.committed_batch_ids()
        record = self.source.read_commit(committed[-1]) if committed else None
        if record is not None:
            self._saw(record)

    def _saw(self, record: CommitRecord) -> None:
        if record.batch_id > self.latest_batch_id:
            self.latest_batch_id = record.batch_id
            self.latest_committed_at = record.committed_at
            self.recent_sources.append((record.batch_id, Position.from_map(record.position)))

    def _fail(self, replica: PartitionReplica, batch_id: int, message: str) -> None:
        if replica.error != message:
            log.error(
                "%s[%d]: cannot apply batch %d: %s",
                self.table,
                replica.partition,
                batch_id,
                message,
            )
        replica.error = message

    def _bootstrap(self) -> int:
        """Restore from snapshots the partitions that are empty or whose next batch is gone."""
        loaded = 0
        now = time.monotonic()
        for replica in self.partitions.values():
            next_id = replica.batch_id + 1
            at_head = 0 <= self.latest_batch_id <= replica.batch_id
            if replica.retry_at > now or (
                replica.batch_id >= 0
                and replica.error is None
                and (at_head or self.source.has_commit(next_id))
            ):
                continue
            snapshots = self.source.snapshots(replica.partition)
            if not snapshots or snapshots[-1].batch_id < next_id:
                if self.source.has_commit(next_id):
                    continue  # nothing newer to restore from: tail from the next batch
                later = [b for b in self.source.committed_batch_ids() if b > next_id]
                if later:
                    self._fail(
                        replica,
                        next_id,
                        f"batch {next_id} is no longer in the changelog (retention deleted it, "
                        f"the oldest kept is {later[0]}) and no snapshot covers it: the "
                        f"partition cannot be restored; {self.source.restore_hint}",
                    )
                continue
            if replica.batch_id >= 0:
                log.warning(
                    "%s[%d]: batch %d cannot be read from the changelog (%s); the replica "
                    "fell behind retention and restores from the newest snapshot",
                    self.table,
                    replica.partition,
                    next_id,
                    replica.error or "deleted",
                )
            found = newest_snapshot(self.source, replica.partition)
            if found is None or found[0].batch_id < next_id:
                continue
            info, keys, values = found
            try:
                replica.load_snapshot(info, keys, values, self.commit_time(info.batch_id))
            except StoreError as exc:
                self._fail(replica, info.batch_id, exc.message)
                replica.back_off()
                continue
            replica.applied()
            loaded += 1
        return loaded

    def _log_progress(self) -> None:
        now = time.monotonic()
        if now - self._last_progress_log < _PROGRESS_LOG_SECONDS:
            return
        self._last_progress_log = now
        if self.on_progress is not None:
            self.on_progress()
        for status in self.status():
            if status.state == "restoring":
                log.info(
                    "%s[%d]: restoring, batch %d of %d, %d rows and %d bytes applied, ETA %s",
                    status.table,
                    status.partition,
                    status.batch_id,
                    status.latest_batch_id,
                    status.restored_rows,
                    status.restored_bytes,
                    "unknown" if status.eta_seconds is None else f"{status.eta_seconds:.0f} s",
                )

    def _keeping_up(self, replica: PartitionReplica) -> bool:
        if replica.batch_id >= self.latest_batch_id:
            return True
        caught_up_at = replica.caught_up_at
        return caught_up_at is not None and time.monotonic() - caught_up_at < KEEPING_UP_SECONDS

    def row_counts(self) -> dict[int, int | None]:
        """Per hosted partition, the rows it holds: exact from its versions when it keeps
        them, else RocksDB's estimate (exact after inserts, drifting with overwrites and
        deletes until compaction); None while its store cannot be read (closed, or reopening
        after a failed write). Kept out of :meth:`status`, which heartbeats call twice a
        second."""
        counts: dict[int, int | None] = {}
        for partition, replica in sorted(self.partitions.items()):
            versions = replica.store.versions
            try:
                counts[partition] = (
                    versions.current_rows()
                    if versions is not None
                    else replica.store.store.approximate_count()
                )
            except StoreError:
                counts[partition] = None
        return counts

    def status(self) -> list[ReplicaStatus]:
        now = time.time()
        out = []
        for partition, replica in sorted(self.partitions.items()):
            lag = max(0, self.latest_batch_id - replica.batch_id)
            eta = None
            if lag and replica.applied_batches:
                eta = lag * replica.apply_seconds / replica.applied_batches
            state = (
                "error" if replica.error else ("live" if self._keeping_up(replica) else "restoring")
            )
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
                    state=state,
                    restored_rows=replica.applied_rows,
                    restored_bytes=replica.applied_bytes,
                    eta_seconds=eta,
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
