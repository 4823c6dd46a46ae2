"""Retention: delete what no restore needs, so a changelog's size follows its table, not its
history.

Rules, per table, given a retention period ``R`` (seconds):

* a **segment** of partition ``p`` and batch ``b`` is deleted when a usable snapshot of ``p``
  at batch ``>= b`` exists and batch ``b`` was committed more than ``R`` ago;
* a **commit record** of batch ``b`` is deleted when every partition has a usable snapshot at
  batch ``>= b`` and it was committed more than ``R`` ago;
* **snapshots** older than the newest ``keep_snapshots`` of their partition are deleted when
  they were created more than ``R`` ago;
* the table's newest commit record is always kept, so readers know where the table is.

Readers that fell behind (their next batch was deleted) notice, log it, and restore from the
newest snapshot instead of serving partial data (see :mod:`sparkiq.changelog.replica`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sparkiq.changelog.log import Changelog
from sparkiq.changelog.snapshot import data_path, descriptor_path, list_snapshots

__all__ = ["RetentionReport", "apply_retention"]

log = logging.getLogger("sparkiq.retention")


@dataclass(frozen=True)
class RetentionReport:
    """What one retention pass deleted."""

    segments: int
    commits: int
    snapshots: int

    def __str__(self) -> str:
        return (
            f"retention deleted {self.segments} segments, {self.commits} commit records "
            f"and {self.snapshots} snapshots"
        )


def apply_retention(
    changelog: Changelog,
    retention_seconds: float,
    *,
    keep_snapshots: int = 2,
    now: float | None = None,
) -> RetentionReport:
    """Delete the files of ``changelog`` that the rules above allow; return the counts."""
    if retention_seconds < 0:
        raise ValueError(f"retention must be >= 0 seconds, got {retention_seconds!r}")
    if keep_snapshots < 1:
        raise ValueError(f"keep_snapshots must be >= 1, got {keep_snapshots!r}")
    now = time.time() if now is None else now
    horizon = now - retention_seconds
    manifest = changelog.manifest()
    committed = changelog.committed_batch_ids()
    if not committed:
        return RetentionReport(0, 0, 0)
    newest = committed[-1]
    covered: dict[int, int] = {}
    deleted_snapshots = 0
    for partition in range(manifest.partitions):
        snapshots = list_snapshots(changelog, partition)
        covered[partition] = snapshots[-1].batch_id if snapshots else -1
        for old in snapshots[:-keep_snapshots]:
            if old.created_at < horizon:
                changelog.storage.delete(descriptor_path(changelog, partition, old.batch_id))
                changelog.storage.delete(data_path(changelog, partition, old.batch_id))
                deleted_snapshots += 1
    all_covered = min(covered.values())
    deleted_segments = deleted_commits = 0
    for batch_id in committed:
        if batch_id > max(covered.values()) or batch_id == newest:
            break
        record = changelog.read_commit(batch_id)
        if record is None or record.committed_at >= horizon:
            continue
        for partition, info in record.segments.items():
            if batch_id <= covered.get(partition, -1):
                # the listed file, and the first attempt's left by a rewritten batch
                for attempt in sorted({0, info.attempt}):
                    path = changelog.segment_path(partition, batch_id, attempt)
                    if changelog.storage.exists(path):
                        changelog.storage.delete(path)
                        deleted_segments += attempt == info.attempt
        if batch_id <= all_covered:
            changelog.storage.delete(changelog.commit_path(batch_id))
            deleted_commits += 1
    report = RetentionReport(deleted_segments, deleted_commits, deleted_snapshots)
    if deleted_segments or deleted_commits or deleted_snapshots:
        log.info("%s: %s", changelog.table, report)
    return report
