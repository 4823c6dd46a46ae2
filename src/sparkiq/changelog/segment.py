"""Changelog segments: the changes of one batch to one partition.

On-disk format, version 1 (``segments/<partition:05d>/<batch:020d>.arrow``):

* an Arrow IPC *file* holding one record batch with two columns:
  ``key: binary not null`` (the order-preserving key encoding of
  :mod:`sparkiq.schema.codec`) and ``value: binary`` (the msgpack row encoding; null means
  the key was deleted);
* rows sorted by ``key`` bytes with no duplicate keys, so the bytes of a segment are a pure
  function of the batch's changes: re-running a batch rewrites an identical file;
* schema metadata ``sparkiq.format = "segment"``, ``sparkiq.version = "1"``, plus the table,
  partition and batch id, which a reader checks against the path it opened.

Integrity: the SHA-256 of the file and its size are recorded in the batch's commit record.
A reader verifies both before decoding and raises :class:`CorruptSegmentError` naming the file,
so a corrupted or truncated segment is never applied.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa

from sparkiq.changelog.storage import Storage
from sparkiq.errors import CorruptSegmentError

__all__ = [
    "SEGMENT_VERSION",
    "SegmentInfo",
    "decode_segment",
    "encode_segment",
    "read_segment",
    "write_segment",
]

SEGMENT_VERSION = 1
_SCHEMA = pa.schema(
    [pa.field("key", pa.binary(), nullable=False), pa.field("value", pa.binary(), nullable=True)]
)


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What a commit record says about one segment."""

    partition: int
    rows: int
    size: int
    sha256: str

    def to_json(self) -> dict[str, int | str]:
        return {"rows": self.rows, "size": self.size, "sha256": self.sha256}


def encode_segment(
    table: str, partition: int, batch_id: int, changes: dict[bytes, bytes | None]
) -> bytes:
    """Serialize one partition's changes (key -> value, None = delete) deterministically."""
    keys = sorted(changes)
    schema = _SCHEMA.with_metadata(
        {
            "sparkiq.format": "segment",
            "sparkiq.version": str(SEGMENT_VERSION),
            "sparkiq.table": table,
            "sparkiq.partition": str(partition),
            "sparkiq.batch": str(batch_id),
        }
    )
    batch = pa.record_batch(
        [pa.array(keys, pa.binary()), pa.array([changes[k] for k in keys], pa.binary())],
        schema=schema,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


def write_segment(
    storage: Storage,
    path: str,
    table: str,
    partition: int,
    batch_id: int,
    changes: dict[bytes, bytes | None],
) -> SegmentInfo:
    """Write a segment atomically and return the facts its commit record must hold."""
    data = encode_segment(table, partition, batch_id, changes)
    storage.write_atomic(path, data)
    return SegmentInfo(partition, len(changes), len(data), hashlib.sha256(data).hexdigest())


def decode_segment(
    data: bytes, path: str, table: str, partition: int, batch_id: int
) -> tuple[list[bytes], list[bytes | None]]:
    """Parse a verified segment into parallel key and value lists."""
    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        meta = reader.schema.metadata or {}
        if meta.get(b"sparkiq.format") != b"segment":
            raise CorruptSegmentError(f"{path!r} is not a sparkiq segment", partition=partition)
        version = int(meta.get(b"sparkiq.version", b"0"))
        if version > SEGMENT_VERSION:
            raise CorruptSegmentError(
                f"{path!r} has segment format version {version}; this sparkiq reads up to "
                f"{SEGMENT_VERSION}: upgrade sparkiq on this node",
                partition=partition,
            )
        expected = (table.encode(), str(partition).encode(), str(batch_id).encode())
        found = (
            meta.get(b"sparkiq.table"),
            meta.get(b"sparkiq.partition"),
            meta.get(b"sparkiq.batch"),
        )
        if found != expected:
            raise CorruptSegmentError(
                f"{path!r} belongs to table/partition/batch {found}, expected {expected}",
                store=table,
                partition=partition,
            )
        table_data = reader.read_all()
    except CorruptSegmentError:
        raise
    except (pa.ArrowInvalid, pa.ArrowException, ValueError) as exc:
        raise CorruptSegmentError(
            f"cannot decode segment {path!r}: {exc}", store=table, partition=partition
        ) from exc
    keys: list[bytes] = table_data.column("key").to_pylist()
    values: list[bytes | None] = table_data.column("value").to_pylist()
    return keys, values


def read_segment(
    storage: Storage, path: str, info: SegmentInfo, table: str, batch_id: int
) -> tuple[list[bytes], list[bytes | None]]:
    """Read, verify (size and SHA-256 from the commit record) and decode a segment.

    Raises :class:`CorruptSegmentError` naming the file when it is missing, truncated or
    altered; nothing from such a file is returned.
    """
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise CorruptSegmentError(
            f"segment {path!r} of committed batch {batch_id} is missing (deleted or not yet "
            "visible on this filesystem); the replica cannot apply the batch",
            store=table,
            partition=info.partition,
        ) from None
    if len(data) != info.size:
        raise CorruptSegmentError(
            f"segment {path!r} has {len(data)} bytes, its commit record says {info.size}: "
            "the file is truncated or was rewritten",
            store=table,
            partition=info.partition,
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != info.sha256:
        raise CorruptSegmentError(
            f"segment {path!r} fails its checksum (sha256 {digest[:12]}..., commit record "
            f"says {info.sha256[:12]}...): the file is corrupted",
            store=table,
            partition=info.partition,
        )
    return decode_segment(data, path, table, info.partition, batch_id)
