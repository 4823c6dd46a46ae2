"""Changelog sources: where a replica's committed changes come from.

A replica (:class:`~sparkiq.changelog.replica.TableReplica`) needs, of one table: its
manifest (schema, key columns, partition count, history, incarnation), which batches are
committed and their commit records (commit time, source position), one partition's changes
in a committed batch as encoded sparkiq keys and rows (:mod:`sparkiq.schema.keycodec`,
:mod:`sparkiq.schema.rowcodec`), and whole-partition snapshots to restore from.
:class:`ChangelogSource` is that contract. Two implementations:

* :class:`SegmentSource`: a sparkiq changelog (:class:`~sparkiq.changelog.Changelog`), written
  by a table sink, with sparkiq's own snapshots;
* ``sparkiq.checkpoint.source.CheckpointSource``: one state store of a Spark streaming query's
  checkpoint, whose changes are Spark's own state files (zero-change mode).

A :class:`SourceCatalog` names the sources a node can host: :class:`StateDirCatalog` (every
table of a ``state_dir``) and ``sparkiq.checkpoint.source.CheckpointCatalog`` (every state
store of one checkpoint). Hosting asks its catalogs for tables and never needs to know
which kind a table is.

Contract for every implementation:

* a batch is *committed* when :meth:`ChangelogSource.has_commit` says so, and stays committed;
  batch ids of one table are consecutive and start at 0, but old ones may disappear
  (retention, Spark's maintenance);
* :meth:`ChangelogSource.read_changes` of a committed batch is deterministic: every call, on
  every node, gives the same changes (replicas and restarts rely on it);
* every read error is a :class:`~sparkiq.errors.ChangelogError` naming the file and the
  problem (:class:`~sparkiq.errors.CorruptSegmentError` for a truncated or corrupted one),
  never a wrong row;
* a source never writes anything where it reads from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

import pyarrow as pa

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.log import Changelog, list_tables
from sparkiq.changelog.manifest import TableManifest
from sparkiq.changelog.snapshot import SnapshotInfo, list_snapshots, read_snapshot
from sparkiq.errors import CorruptSegmentError, SparkiqError

__all__ = [
    "ChangelogSource",
    "SegmentSource",
    "SourceCatalog",
    "StateDirCatalog",
    "newest_snapshot",
]

log = logging.getLogger("sparkiq.snapshot")


@runtime_checkable
class ChangelogSource(Protocol):
    """The committed changes of one table, as a replica reads them (see the module docstring).

    ``table`` is the sparkiq table name; ``restore_hint`` says what an operator can do when a
    batch a replica needs is gone and no snapshot covers it.
    """

    @property
    def table(self) -> str: ...

    @property
    def restore_hint(self) -> str: ...

    def manifest(self) -> TableManifest:
        """The table's layout; the same object for the source's lifetime."""
        ...

    def committed_batch_ids(self) -> list[int]:
        """Every committed batch id still readable, ascending."""
        ...

    def has_commit(self, batch_id: int) -> bool: ...

    def read_commit(self, batch_id: int) -> CommitRecord | None:
        """The commit record of ``batch_id``; None when it is not committed (or gone)."""
        ...

    def commits_after(self, batch_id: int) -> Iterator[CommitRecord]:
        """Committed batches after ``batch_id``, in order, up to the first one missing."""
        ...

    def read_changes(
        self, record: CommitRecord, partition: int
    ) -> tuple[list[bytes], list[bytes | None]]:
        """The changes of ``partition`` in a committed batch: encoded keys and encoded rows
        (None: the key was deleted). Empty when the batch did not touch the partition."""
        ...

    def read_change_columns(
        self, record: CommitRecord, partition: int
    ) -> tuple[pa.Array, pa.Array] | None:
        """:meth:`read_changes` as the binary arrays the source holds them in (keys, rows
        with nulls for deletions; no Python object per row), for a replica that keeps
        versions as Arrow; None when the source does not hold them so (then
        :meth:`read_changes`)."""
        ...

    def has_changes(self, record: CommitRecord, partition: int) -> bool:
        """Whether the file holding ``partition``'s changes in a committed batch is still
        there (False: retention or Spark's maintenance deleted it)."""
        ...

    def snapshots(self, partition: int) -> list[SnapshotInfo]:
        """The partition's snapshots that look usable, oldest first (``batch_id``: the
        snapshot holds the state after that batch). Data is verified when read."""
        ...

    def read_snapshot(self, info: SnapshotInfo) -> tuple[list[bytes], list[bytes]]:
        """Every live row of a snapshot (encoded keys, encoded rows); raises
        :class:`~sparkiq.errors.CorruptSegmentError` when it is truncated, corrupted or gone."""
        ...


def newest_snapshot(
    source: ChangelogSource, partition: int, *, at_most: int | None = None
) -> tuple[SnapshotInfo, list[bytes], list[bytes]] | None:
    """The newest snapshot of ``partition`` (at or before batch ``at_most``) that reads back
    intact, with its rows; older ones are tried when a newer one is unreadable."""
    for info in reversed(source.snapshots(partition)):
        if at_most is not None and info.batch_id > at_most:
            continue
        try:
            keys, values = source.read_snapshot(info)
        except CorruptSegmentError as exc:  # an older snapshot may do
            log.error("%s[%d]: skipping snapshot: %s", source.table, partition, exc.message)
            continue
        return info, keys, values
    return None


class SegmentSource:
    """A sparkiq changelog as a :class:`ChangelogSource` (segments and sparkiq snapshots)."""

    restore_hint = "create a snapshot (sparkiq compact) or rebuild the table"

    def __init__(self, changelog: Changelog) -> None:
        self.changelog = changelog

    @property
    def table(self) -> str:
        return self.changelog.table

    def manifest(self) -> TableManifest:
        return self.changelog.manifest()

    def committed_batch_ids(self) -> list[int]:
        return self.changelog.committed_batch_ids()

    def has_commit(self, batch_id: int) -> bool:
        return self.changelog.has_commit(batch_id)

    def read_commit(self, batch_id: int) -> CommitRecord | None:
        return self.changelog.read_commit(batch_id)

    def commits_after(self, batch_id: int) -> Iterator[CommitRecord]:
        return self.changelog.commits_after(batch_id)

    def read_changes(
        self, record: CommitRecord, partition: int
    ) -> tuple[list[bytes], list[bytes | None]]:
        return self.changelog.read_segment(record, partition)

    def read_change_columns(
        self, record: CommitRecord, partition: int
    ) -> tuple[pa.Array, pa.Array]:
        return self.changelog.read_segment_arrays(record, partition)

    def has_changes(self, record: CommitRecord, partition: int) -> bool:
        changelog = self.changelog
        if partition not in record.segments:
            return False
        return changelog.storage.exists(changelog.committed_segment_path(record, partition))

    def snapshots(self, partition: int) -> list[SnapshotInfo]:
        return list_snapshots(self.changelog, partition)

    def read_snapshot(self, info: SnapshotInfo) -> tuple[list[bytes], list[bytes]]:
        return read_snapshot(self.changelog, info)

    def __repr__(self) -> str:
        return f"SegmentSource({self.changelog.state_dir!r}, {self.table!r})"


class SourceCatalog(Protocol):
    """The tables one place offers, by name. ``open(name)`` may be called again for a table
    whose incarnation changed; ``incarnation(name)`` is None once the table is gone."""

    def names(self) -> list[str]:
        """The table names present now, sorted."""
        ...

    def open(self, name: str) -> ChangelogSource: ...

    def incarnation(self, name: str) -> str | None:
        """The table's current incarnation (a new one means: drop local state, restore)."""
        ...


class StateDirCatalog:
    """Every sparkiq table under ``state_dir`` (read-only changelogs unless told otherwise)."""

    def __init__(self, state_dir: str, *, read_only: bool = True) -> None:
        self.state_dir = state_dir
        self.read_only = read_only

    def names(self) -> list[str]:
        return list_tables(self.state_dir)

    def open(self, name: str) -> SegmentSource:
        return SegmentSource(Changelog(self.state_dir, name, read_only=self.read_only))

    def incarnation(self, name: str) -> str | None:
        try:
            return Changelog(self.state_dir, name, read_only=True).manifest().incarnation
        except SparkiqError:
            return None
