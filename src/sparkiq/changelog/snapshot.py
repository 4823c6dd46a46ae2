"""Snapshots: the whole state of one partition as of one batch, so restores skip history.

On-disk format, version 1, under ``tables/<table>/snapshots/<partition:05d>/``:

* ``<batch:020d>.arrow`` — an Arrow IPC file with the segment layout (``key``, ``value``
  binary, sorted by key, unique keys) holding every live row of the partition after batch
  ``batch``; ``value`` is never null. Schema metadata ``sparkiq.format = "snapshot"``.
* ``<batch:020d>.json`` — the descriptor, written *after* the data file: a JSON line
  (``format = "snapshot"``, ``version``, ``table``, ``partition``, ``batch_id``, ``rows``,
  ``size``, ``sha256`` of the data file, ``position`` (the batch's source components) and
  ``created_at``), then the SHA-256 of that line.

A snapshot is usable only when its descriptor verifies and the data file matches the size
and SHA-256 the descriptor names, so a half-written or truncated snapshot is never used: a
reader falls back to the previous snapshot, or to the full changelog.

A snapshot of batch ``b`` is built from the newest usable snapshot before ``b`` plus the
segments of the batches after it, so creating one never needs a replica and can run
anywhere that can read and write ``state_dir`` (the writer runs it as a Spark job, one task
per partition; ``sparkiq compact`` runs it from a shell).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sparkiq.changelog.log import Changelog
from sparkiq.changelog.sealed import position_from_json, position_to_json, seal, unseal
from sparkiq.errors import ChangelogError, CorruptSegmentError

__all__ = [
    "SNAPSHOT_VERSION",
    "SnapshotInfo",
    "latest_snapshot",
    "list_snapshots",
    "read_snapshot",
    "write_snapshot",
]

log = logging.getLogger("sparkiq.snapshot")

SNAPSHOT_VERSION = 1
_DESCRIPTOR = re.compile(r"^(\d{20})\.json$")
_SCHEMA = pa.schema(
    [pa.field("key", pa.binary(), nullable=False), pa.field("value", pa.binary(), nullable=False)]
)


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot descriptor says."""

    table: str
    partition: int
    batch_id: int
    rows: int
    size: int
    sha256: str
    position: dict[str, dict[int, int]] = field(default_factory=dict)
    created_at: float = 0.0

    def encode(self) -> bytes:
        return seal(
            {
                "format": "snapshot",
                "version": SNAPSHOT_VERSION,
                "table": self.table,
                "partition": self.partition,
                "batch_id": self.batch_id,
                "rows": self.rows,
                "size": self.size,
                "sha256": self.sha256,
                "position": position_to_json(self.position),
                "created_at": self.created_at,
            }
        )

    @staticmethod
    def decode(data: bytes, path: str) -> SnapshotInfo:
        """Parse and verify a descriptor; raises CorruptSegmentError naming the file."""
        doc = unseal(data, path, "snapshot", SNAPSHOT_VERSION)
        try:
            return SnapshotInfo(
                table=str(doc["table"]),
                partition=int(doc["partition"]),
                batch_id=int(doc["batch_id"]),
                rows=int(doc["rows"]),
                size=int(doc["size"]),
                sha256=str(doc["sha256"]),
                position=position_from_json(doc["position"]),
                created_at=float(doc["created_at"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptSegmentError(f"snapshot descriptor {path!r} is unusable: {exc}") from None


def _dir(changelog: Changelog, partition: int) -> str:
    return f"{changelog.root}/snapshots/{partition:05d}"


def data_path(changelog: Changelog, partition: int, batch_id: int) -> str:
    return f"{_dir(changelog, partition)}/{batch_id:020d}.arrow"


def descriptor_path(changelog: Changelog, partition: int, batch_id: int) -> str:
    return f"{_dir(changelog, partition)}/{batch_id:020d}.json"


def list_snapshots(changelog: Changelog, partition: int) -> list[SnapshotInfo]:
    """Snapshots of a partition whose descriptor verifies, oldest first. The data files are
    verified only when read (:func:`read_snapshot`)."""
    found = []
    for name in changelog.storage.list_names(_dir(changelog, partition)):
        match = _DESCRIPTOR.match(name)
        if not match:
            continue
        path = descriptor_path(changelog, partition, int(match[1]))
        try:
            found.append(SnapshotInfo.decode(changelog.storage.read_bytes(path), path))
        except FileNotFoundError:
            continue  # deleted by retention while listing
        except CorruptSegmentError as exc:
            log.error("%s[%d]: %s", changelog.table, partition, exc.message)
    return sorted(found, key=lambda s: s.batch_id)


def read_snapshot(changelog: Changelog, info: SnapshotInfo) -> tuple[list[bytes], list[bytes]]:
    """The verified rows of a snapshot; raises CorruptSegmentError naming the file."""
    path = data_path(changelog, info.partition, info.batch_id)
    try:
        data = changelog.storage.read_bytes(path)
    except FileNotFoundError:
        raise CorruptSegmentError(
            f"snapshot {path!r} is missing", store=changelog.table, partition=info.partition
        ) from None
    if len(data) != info.size or hashlib.sha256(data).hexdigest() != info.sha256:
        raise CorruptSegmentError(
            f"snapshot {path!r} is truncated or corrupted ({len(data)} bytes, its descriptor "
            f"says {info.size}; checksum {'differs' if len(data) == info.size else 'unchecked'})",
            store=changelog.table,
            partition=info.partition,
        )
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptSegmentError(
            f"cannot decode snapshot {path!r}: {exc}", store=changelog.table
        ) from exc
    return table.column("key").to_pylist(), table.column("value").to_pylist()


def latest_snapshot(
    changelog: Changelog, partition: int, *, at_most: int | None = None
) -> tuple[SnapshotInfo, list[bytes], list[bytes]] | None:
    """The newest snapshot (at or before batch ``at_most``) that reads back intact, with its
    rows; older ones are tried when a newer one is corrupted. None when there is none."""
    for info in reversed(list_snapshots(changelog, partition)):
        if at_most is not None and info.batch_id > at_most:
            continue
        try:
            keys, values = read_snapshot(changelog, info)
        except CorruptSegmentError as exc:
            log.error("%s[%d]: skipping snapshot: %s", changelog.table, partition, exc.message)
            continue
        return info, keys, values
    return None


def write_snapshot(changelog: Changelog, partition: int, batch_id: int) -> SnapshotInfo:
    """Build and write the snapshot of ``partition`` as of committed batch ``batch_id``.

    Idempotent: rebuilding an existing snapshot rewrites identical data. Raises
    ChangelogError when a batch it needs is missing from the changelog.
    """
    record = changelog.read_commit(batch_id)
    if record is None:
        raise ChangelogError(
            f"cannot snapshot {changelog.table}[{partition}] at batch {batch_id}: not committed",
            store=changelog.table,
            partition=partition,
        )
    state: dict[bytes, bytes] = {}
    base = latest_snapshot(changelog, partition, at_most=batch_id)
    start = 0
    if base is not None:
        info, keys, values = base
        if info.batch_id == batch_id:
            return info
        state = dict(zip(keys, values, strict=True))
        start = info.batch_id + 1
    for next_id in range(start, batch_id + 1):
        commit = record if next_id == batch_id else changelog.read_commit(next_id)
        if commit is None:
            raise ChangelogError(
                f"cannot snapshot {changelog.table}[{partition}] at batch {batch_id}: batch "
                f"{next_id} is missing and no older snapshot covers it",
                store=changelog.table,
                partition=partition,
            )
        if commit.mode == "complete":
            state = {}
        changed_keys, changed_values = changelog.read_segment(commit, partition)
        for key, value in zip(changed_keys, changed_values, strict=True):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    ordered = sorted(state)
    batch = pa.record_batch(
        [pa.array(ordered, pa.binary()), pa.array([state[k] for k in ordered], pa.binary())],
        schema=_SCHEMA.with_metadata(
            {
                "sparkiq.format": "snapshot",
                "sparkiq.version": str(SNAPSHOT_VERSION),
                "sparkiq.table": changelog.table,
                "sparkiq.partition": str(partition),
                "sparkiq.batch": str(batch_id),
            }
        ),
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)
    data = bytes(sink.getvalue())
    changelog.storage.write_atomic(data_path(changelog, partition, batch_id), data)
    info = SnapshotInfo(
        table=changelog.table,
        partition=partition,
        batch_id=batch_id,
        rows=len(ordered),
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        position={c: dict(o) for c, o in record.position.items()},
        created_at=time.time(),
    )
    changelog.storage.write_atomic(descriptor_path(changelog, partition, batch_id), info.encode())
    return info


def snapshot_summary(changelog: Changelog, partitions: int) -> dict[int, Any]:
    """Newest usable-looking snapshot batch per partition (descriptor verified), or None."""
    out: dict[int, Any] = {}
    for partition in range(partitions):
        snapshots = list_snapshots(changelog, partition)
        out[partition] = snapshots[-1].batch_id if snapshots else None
    return out
