"""Commit records: a batch becomes visible when, and only when, its commit record exists.

On-disk format, version 1 (``commits/<batch:020d>.json``): two lines of UTF-8 text,

1. a JSON object (keys sorted) with ``format = "commit"``, ``version``, ``table``,
   ``batch_id``, ``mode`` (``"update"`` applies the segments' changes; ``"complete"``
   replaces every partition with its segment, or empties it when the batch has none),
   ``schema_version``, ``source_offsets`` (Spark's end offsets of the batch, one entry per
   source, as Spark's offset log writes them), ``position`` (the components this batch moves
   a replica to, see :mod:`sparkiq.query.position`), ``segments`` (``{partition: {rows,
   size, sha256}}``, plus ``attempt`` when not 0: the segment's file name, see
   :class:`~sparkiq.changelog.segment.SegmentInfo`; a record without it means attempt 0),
   ``rows`` and ``committed_at`` (Unix seconds);
2. the SHA-256 of line 1, so a torn or altered record is detected.

The driver writes the record after every executor has written its segments; the write is
atomic (see :meth:`Storage.write_atomic`). A record for a batch id is never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkiq.changelog.sealed import position_from_json, position_to_json, seal, unseal
from sparkiq.changelog.segment import SegmentInfo

__all__ = ["COMMIT_VERSION", "CommitRecord"]

COMMIT_VERSION = 1


@dataclass(frozen=True)
class CommitRecord:
    """The facts of one committed batch."""

    table: str
    batch_id: int
    mode: str
    segments: Mapping[int, SegmentInfo]
    source_offsets: tuple[Any, ...] = ()
    position: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    schema_version: int = 1
    committed_at: float = 0.0

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments.values())

    def encode(self) -> bytes:
        return seal(
            {
                "format": "commit",
                "version": COMMIT_VERSION,
                "table": self.table,
                "batch_id": self.batch_id,
                "mode": self.mode,
                "schema_version": self.schema_version,
                "source_offsets": list(self.source_offsets),
                "position": position_to_json(self.position),
                "segments": {str(p): s.to_json() for p, s in sorted(self.segments.items())},
                "rows": self.rows,
                "committed_at": self.committed_at,
            }
        )

    @staticmethod
    def decode(data: bytes, path: str) -> CommitRecord:
        """Parse and verify a commit record; raises CorruptSegmentError naming the file."""
        doc = unseal(data, path, "commit", COMMIT_VERSION)
        segments = {
            int(p): SegmentInfo(
                int(p), int(s["rows"]), int(s["size"]), str(s["sha256"]), int(s.get("attempt", 0))
            )
            for p, s in doc["segments"].items()
        }
        return CommitRecord(
            table=str(doc["table"]),
            batch_id=int(doc["batch_id"]),
            mode=str(doc["mode"]),
            segments=segments,
            source_offsets=tuple(doc["source_offsets"]),
            position=position_from_json(doc["position"]),
            schema_version=int(doc["schema_version"]),
            committed_at=float(doc["committed_at"]),
        )
