"""A streaming query's metadata logs: ``metadata``, ``offsets/<batch>``, ``commits/<batch>``.

Formats (Spark's ``HDFSMetadataLog`` subclasses; one file per batch id, written atomically)::

    metadata            {"id": "<query id>"}
    offsets/<batch>     "v1" | "v2", newline, a JSON object (batchWatermarkMs,
                        batchTimestampMs, conf: the SQL settings the query keeps across
                        restarts), then one line per source: its end offset JSON or "-"
    commits/<batch>     "v1" ("v2" with checkpointFormatVersion 2), newline, a JSON
                        object (nextBatchWatermarkMs; with
                        checkpointFormatVersion 2 also stateUniqueIds: operator id ->
                        per partition -> the unique ids of the state files it committed)

A batch is *committed* once ``commits/<batch>`` exists: its state files are then complete.
A commit's time is its file's modification time (the file records none). Spark keeps the
last ``spark.sql.streaming.minBatchesToRetain`` (100) batches of each log; older ones go.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkiq.errors import ChangelogError

__all__ = ["CommitInfo", "OffsetInfo", "batch_ids", "read_commit", "read_offsets"]


@dataclass(frozen=True)
class OffsetInfo:
    """``offsets/<batch>``: when the batch started, its watermark, settings and end offsets."""

    batch: int
    watermark_ms: int
    timestamp_ms: int
    conf: tuple[tuple[str, str], ...]
    sources: tuple[str | None, ...]  # each source's end offset JSON; None for "-"

    def setting(self, name: str, default: str = "") -> str:
        return dict(self.conf).get(name, default)


@dataclass(frozen=True)
class CommitInfo:
    """``commits/<batch>``: the next batch's watermark, the state files' unique ids
    (checkpointFormatVersion 2: operator id -> one list of ids per partition) and the time
    the commit file was written (seconds since the epoch)."""

    batch: int
    next_watermark_ms: int
    state_unique_ids: tuple[tuple[int, tuple[tuple[str, ...], ...]], ...]
    time: float


def batch_ids(log: Path) -> list[int]:
    """The batch ids a log directory holds, ascending (temporary and hidden files skipped)."""
    try:
        return sorted(int(p.name) for p in log.iterdir() if p.name.isdigit())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read(path: Path, what: str) -> tuple[str, list[str]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ChangelogError(
            f"{what} {path} does not exist (Spark keeps the last 100 batches of each log)"
        ) from None
    version, _, rest = text.partition("\n")
    return version.strip(), rest.split("\n")


def _json(line: str, path: Path, what: str) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        raise ChangelogError(f"{what} {path} is not valid JSON: {line[:80]!r}") from None


def read_offsets(checkpoint: Path, batch: int) -> OffsetInfo:
    """Parse ``offsets/<batch>``; :class:`~sparkiq.errors.ChangelogError` if it is missing
    or not in a format sparkiq reads."""
    path = checkpoint / "offsets" / str(batch)
    version, lines = _read(path, "offset log file")
    if version not in ("v1", "v2") or not lines or not lines[0].strip():
        raise ChangelogError(
            f"offset log file {path} starts with {version!r}; sparkiq reads versions v1 and v2"
        )
    meta = _json(lines[0], path, "offset log file")
    if not isinstance(meta, dict):
        raise ChangelogError(f"offset log file {path} has no metadata object")
    conf = meta.get("conf") or {}
    sources = tuple(None if s.strip() == "-" else s for s in lines[1:] if s.strip())
    return OffsetInfo(
        batch=batch,
        watermark_ms=int(meta.get("batchWatermarkMs", 0)),
        timestamp_ms=int(meta.get("batchTimestampMs", 0)),
        conf=tuple(sorted((str(k), str(v)) for k, v in conf.items())),
        sources=sources,
    )


def read_commit(checkpoint: Path, batch: int) -> CommitInfo:
    """Parse ``commits/<batch>``; :class:`~sparkiq.errors.ChangelogError` if it is missing
    (the batch is not committed) or unreadable."""
    path = checkpoint / "commits" / str(batch)
    version, lines = _read(path, "commit log file")
    if version not in ("v1", "v2"):  # v2: written with checkpointFormatVersion 2
        raise ChangelogError(
            f"commit log file {path} starts with {version!r}; sparkiq reads v1 and v2"
        )
    meta = _json(lines[0] if lines else "{}", path, "commit log file")
    ids = meta.get("stateUniqueIds") or {}
    unique = tuple(
        sorted(
            (int(op), tuple(tuple(str(i) for i in (p or ())) for p in parts))
            for op, parts in ids.items()
        )
    )
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        mtime = 0.0
    return CommitInfo(batch, int(meta.get("nextBatchWatermarkMs", 0)), unique, mtime)
