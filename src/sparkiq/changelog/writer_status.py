"""The writer's status record: what a table's Spark query is doing, as its driver last said.

Commit records say what a table committed; they cannot say that its query failed or that its
driver died, because then nothing is written at all and the table just stops moving. So the
driver (``App``, :mod:`sparkiq.spark.writer_report`) also writes a small status record per
table, and nodes read it to show the writer's side next to the replicas' (``sparkiq
status``, ``GET /stats``, the console, ``/metrics``).

On-disk format, version 1 (``tables/<table>/writer.json``), a sealed record
(:mod:`sparkiq.changelog.sealed`: one sorted JSON line, then its SHA-256):
``format = "writer"``, ``version``, ``table``, ``query_name``, ``state`` (``"running"``,
``"stopped"`` or ``"failed"``), ``reason`` (why it failed, a few lines, or null),
``failed_at``, ``batch_id`` (the newest committed batch the driver saw; -1: none),
``committed_at`` (that batch's commit time), ``progress_batch_id``,
``input_rows_per_second``, ``processed_rows_per_second``, ``batch_duration_ms`` (from the
query's last progress, or null before its first), ``heartbeat_seconds`` (how often a running
writer rewrites the record), ``written_at`` and ``publishing`` (the table's publishers to
Kafka run by this driver, one object each: ``topic``, ``state``, ``published_batch``,
``head_batch``, ``batches_behind``, ``rows_behind``, ``error``; see
:class:`~sparkiq.publish.publisher.PublisherStatus`; absent in records written before it,
read as none). Times are Unix seconds (the driver's clock).

The record is rewritten whole, atomically (:meth:`Storage.write_atomic`), every
``heartbeat_seconds`` while the query runs and at once when it fails or stops. A record
saying ``running`` whose ``written_at`` is far older than its heartbeat means the driver
stopped writing without saying so (killed, hung, cut off from storage): readers call it
silent (:mod:`sparkiq.serving.writer_view`). A table whose writer predates the record has
none: readers say the writer is unknown.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sparkiq.changelog.sealed import seal, unseal
from sparkiq.changelog.storage import Storage
from sparkiq.errors import ConfigError

__all__ = [
    "WRITER_STATES",
    "WRITER_STATUS_NAME",
    "WRITER_STATUS_VERSION",
    "WriterStatus",
    "read_writer_status",
    "write_writer_status",
]

WRITER_STATUS_VERSION = 1
#: The record's file name in the table's changelog directory.
WRITER_STATUS_NAME = "writer.json"
WRITER_STATES = ("running", "stopped", "failed")


@dataclass(frozen=True)
class WriterStatus:
    """One table's writer, as its driver last wrote (see the module docstring for fields)."""

    table: str
    state: str
    written_at: float
    query_name: str = ""
    reason: str | None = None
    failed_at: float | None = None
    batch_id: int = -1
    committed_at: float | None = None
    progress_batch_id: int | None = None
    input_rows_per_second: float | None = None
    processed_rows_per_second: float | None = None
    batch_duration_ms: float | None = None
    heartbeat_seconds: float = 2.0
    publishing: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.state not in WRITER_STATES:
            raise ConfigError(
                f"writer state must be one of {list(WRITER_STATES)}, got {self.state!r}",
                store=self.table,
            )

    def encode(self) -> bytes:
        return seal({"format": "writer", "version": WRITER_STATUS_VERSION, **asdict(self)})

    @staticmethod
    def decode(data: bytes, path: str) -> WriterStatus:
        """Parse and verify a record; raises CorruptSegmentError naming the file."""
        doc: dict[str, Any] = unseal(data, path, "writer", WRITER_STATUS_VERSION)

        def number(name: str) -> float | None:
            value = doc.get(name)
            return None if value is None else float(value)

        progress = doc.get("progress_batch_id")
        return WriterStatus(
            table=str(doc["table"]),
            state=str(doc["state"]),
            written_at=float(doc["written_at"]),
            query_name=str(doc.get("query_name", "")),
            reason=None if doc.get("reason") is None else str(doc["reason"]),
            failed_at=number("failed_at"),
            batch_id=int(doc.get("batch_id", -1)),
            committed_at=number("committed_at"),
            progress_batch_id=None if progress is None else int(progress),
            input_rows_per_second=number("input_rows_per_second"),
            processed_rows_per_second=number("processed_rows_per_second"),
            batch_duration_ms=number("batch_duration_ms"),
            heartbeat_seconds=float(doc.get("heartbeat_seconds", 2.0)),
            publishing=tuple(dict(p) for p in doc.get("publishing") or ()),
        )


def _path(storage: Storage, table: str) -> str:
    return storage.path("tables", table, WRITER_STATUS_NAME)


def write_writer_status(storage: Storage, status: WriterStatus) -> None:
    """Replace the record of ``status.table`` in ``storage`` (a ``state_dir``), atomically."""
    storage.write_atomic(_path(storage, status.table), status.encode())


def read_writer_status(storage: Storage, table: str) -> WriterStatus | None:
    """The record of ``table``, or None when its writer never wrote one."""
    path = _path(storage, table)
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        return None
    return WriterStatus.decode(data, path)
