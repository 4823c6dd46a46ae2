"""Change feeds: the committed changes of one table, batch after batch, from a batch id on.

A :class:`ChangeFeed` reads what replicas read (commit records, then the segments they list,
verified) but keeps no table: it hands out each committed batch's changes as
:class:`BatchChanges`, in batch id order, each batch's changes in one deterministic order
(partitions ascending, keys in byte order within a partition). Because segments are a pure
function of their batch, reading a batch twice gives the same changes in the same order, so
"the first ``n`` changes of batch ``b``" names the same changes on every node and after every
restart (push subscriptions resume on that).

``complete``-mode tables rewrite each partition whole in every batch; their feed diffs each
partition against the previous batch and hands out only what changed (upserts of new or
changed rows, deletions of rows that disappeared), in the same order rule. It keeps the
table's current rows in memory to do so.

:func:`read_state` gives the whole table as of one committed batch (the newest snapshot at or
before it, plus the segments after the snapshot), partition by partition: with a feed from
that batch on, a reader gets an exact cut followed by every change after it.

Every function reads through a :class:`~sparkiq.changelog.source.ChangelogSource` (a
:class:`~sparkiq.changelog.Changelog` given instead is read as its
:class:`~sparkiq.changelog.source.SegmentSource`), so push queries follow attached Spark
checkpoints as they follow sparkiq changelogs.

When a batch a reader needs is gone (retention deleted its commit record or segments),
:class:`RetentionGapError` names the batch, the oldest batch still in the changelog and what
to do; nothing after the gap is handed out, so a reader never silently skips changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.log import Changelog
from sparkiq.changelog.source import ChangelogSource, SegmentSource, newest_snapshot
from sparkiq.errors import ChangelogError

__all__ = [
    "BatchChanges",
    "ChangeFeed",
    "RetentionGapError",
    "read_partition_state",
    "read_state",
    "require_after",
]

_GAP_CHECK_SECONDS = 5.0


class RetentionGapError(ChangelogError):
    """A batch a reader needs is no longer in the changelog: retention deleted it.

    ``batch_id`` is the first missing batch, ``oldest_batch_id`` the oldest batch whose
    commit record is still there (None when there is none).
    """

    def __init__(
        self, message: str, *, store: str, batch_id: int, oldest_batch_id: int | None
    ) -> None:
        super().__init__(message, store=store)
        self.batch_id = batch_id
        self.oldest_batch_id = oldest_batch_id


@dataclass(frozen=True, slots=True)
class BatchChanges:
    """The changes one committed batch made, in the feed's order.

    ``partitions[i]``, ``keys[i]`` (encoded key) and ``values[i]`` (encoded row, None for a
    deletion) describe change ``i``. ``position`` holds the batch's source components (see
    :class:`~sparkiq.changelog.CommitRecord`).
    """

    table: str
    batch_id: int
    partition_count: int
    position: Mapping[str, Mapping[int, int]]
    committed_at: float
    partitions: list[int]
    keys: list[bytes]
    values: list[bytes | None]

    def __len__(self) -> int:
        return len(self.keys)


def _gap(changelog: ChangelogSource, batch_id: int, what: str) -> RetentionGapError:
    committed = changelog.committed_batch_ids()
    oldest = committed[0] if committed else None
    return RetentionGapError(
        f"batch {batch_id} of table {changelog.table!r} is no longer in the changelog ({what}; "
        f"retention deleted it); the oldest batch still there is {oldest}. Start again from "
        "the table's current contents (a snapshot), or keep the changelog longer "
        "(retention period) so readers can catch up.",
        store=changelog.table,
        batch_id=batch_id,
        oldest_batch_id=oldest,
    )


def as_source(changelog: ChangelogSource | Changelog) -> ChangelogSource:
    """A :class:`Changelog` as its :class:`SegmentSource`; any other source as it is."""
    return SegmentSource(changelog) if isinstance(changelog, Changelog) else changelog


def _segment(
    source: ChangelogSource, record: CommitRecord, partition: int
) -> tuple[list[bytes], list[bytes | None]]:
    try:
        return source.read_changes(record, partition)
    except ChangelogError:
        if partition in record.segments and not source.has_changes(record, partition):
            raise _gap(source, record.batch_id, f"segment of partition {partition}") from None
        raise


def require_after(changelog: ChangelogSource | Changelog, after: int) -> None:
    """Raise :class:`RetentionGapError` unless every batch after ``after`` that is committed
    can still be read (checks the first one: retention deletes the oldest batches first)."""
    source = as_source(changelog)
    record = source.read_commit(after + 1)
    if record is None:
        committed = source.committed_batch_ids()
        if committed and committed[-1] > after + 1:
            raise _gap(source, after + 1, "commit record")
        return
    for partition in record.segments:
        if not source.has_changes(record, partition):
            raise _gap(source, record.batch_id, f"segment of partition {partition}")


def read_state(
    changelog: ChangelogSource | Changelog, batch_id: int
) -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """Every partition's rows (encoded key -> encoded row) as of committed batch ``batch_id``
    (``-1``: before any batch, so empty), partition by partition, ascending.

    Built from the newest usable snapshot at or before ``batch_id`` plus the segments of
    the batches after it; raises :class:`RetentionGapError` when a batch it needs is gone.
    """
    source = as_source(changelog)
    records: dict[int, CommitRecord] = {}
    for partition in range(source.manifest().partitions):
        yield partition, read_partition_state(source, partition, batch_id, records)


def read_partition_state(
    changelog: ChangelogSource | Changelog,
    partition: int,
    batch_id: int,
    records: dict[int, CommitRecord] | None = None,
) -> dict[bytes, bytes]:
    """One partition's rows as of committed batch ``batch_id``, as :func:`read_state` gives
    them; ``records`` caches commit records across calls (several partitions share them)."""
    source = as_source(changelog)
    manifest = source.manifest()
    cache: dict[int, CommitRecord] = {} if records is None else records

    def commit(b: int) -> CommitRecord:
        if b not in cache:
            record = source.read_commit(b)
            if record is None:
                raise _gap(source, b, "commit record")
            cache[b] = record
        return cache[b]

    state: dict[bytes, bytes] = {}
    start = 0
    if batch_id >= 0 and manifest.output_mode == "complete":
        start = batch_id  # each batch replaces the partition: only the last one counts
    elif batch_id >= 0:
        base = newest_snapshot(source, partition, at_most=batch_id)
        if base is not None:
            info, keys, values = base
            state = dict(zip(keys, values, strict=True))
            start = info.batch_id + 1
    for b in range(start, batch_id + 1):
        record = commit(b)
        if record.mode == "complete":
            state = {}
        keys, vals = _segment(source, record, partition)
        for key, value in zip(keys, vals, strict=True):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


class ChangeFeed:
    """The changes of the batches committed after batch ``after``, in batch id order.

    :meth:`poll` returns what was committed since the last call (never a batch twice, never
    out of order). Not thread-safe: one reader thread per feed. Holds no open files.
    """

    def __init__(self, changelog: ChangelogSource | Changelog, after: int) -> None:
        self.changelog = as_source(changelog)
        self.after = after
        self.manifest = changelog.manifest()
        self._state: dict[int, dict[bytes, bytes]] | None = None  # complete mode only
        self._last_gap_check = time.monotonic()

    def poll(self, max_batches: int = 64, *, until: int | None = None) -> list[BatchChanges]:
        """Up to ``max_batches`` newly committed batches (none past batch ``until``).

        Raises :class:`RetentionGapError` when the next batch is gone while later ones exist
        (checked every few seconds while nothing new arrives), and
        :class:`~sparkiq.errors.ChangelogError` when a file is corrupted (the feed does not
        advance past it: calling again retries).
        """
        out: list[BatchChanges] = []
        if until is not None and self.after >= until:
            return out
        for record in self.changelog.commits_after(self.after):
            out.append(self._changes(record))
            self.after = record.batch_id
            if len(out) >= max_batches or (until is not None and self.after >= until):
                break
        now = time.monotonic()
        if not out and now - self._last_gap_check > _GAP_CHECK_SECONDS:
            self._last_gap_check = now
            require_after(self.changelog, self.after)
        return out

    def _changes(self, record: CommitRecord) -> BatchChanges:
        partitions: list[int] = []
        keys: list[bytes] = []
        values: list[bytes | None] = []
        if record.mode != "complete":
            for partition in sorted(record.segments):
                ks, vs = _segment(self.changelog, record, partition)
                partitions.extend([partition] * len(ks))
                keys.extend(ks)
                values.extend(vs)
        else:
            if self._state is None:
                self._state = dict(read_state(self.changelog, self.after))
            for partition in range(self.manifest.partitions):
                ks, vs = _segment(self.changelog, record, partition)
                new: dict[bytes, bytes] = {k: v for k, v in zip(ks, vs, strict=True) if v}
                old = self._state.get(partition, {})
                for key in sorted(old.keys() | new.keys()):
                    value = new.get(key)
                    if value is None or old.get(key) != value:
                        partitions.append(partition)
                        keys.append(key)
                        values.append(value)
                self._state[partition] = new
        return BatchChanges(
            table=self.changelog.table,
            batch_id=record.batch_id,
            partition_count=self.manifest.partitions,
            position=record.position,
            committed_at=record.committed_at,
            partitions=partitions,
            keys=keys,
            values=values,
        )
