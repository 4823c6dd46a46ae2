"""Changelog segments: the changes of one batch to one partition.

On-disk format, version 1 (``segments/<partition:05d>/<batch:020d>.arrow``, or
``<batch:020d>.a<attempt>.arrow`` for a later write attempt of the batch, see
:attr:`SegmentInfo.attempt`):

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

Landing: a segment is written on an executor, its commit record on the driver. Before the
record is written the segment is checked twice (:func:`verify_landed` on the executor reads
it back and compares size and SHA-256; :func:`check_visible` on the driver compares its size
where the driver, and so every reader that shares its view of ``state_dir``, looks), so a
commit record never names a segment that readers cannot find.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from sparkiq.changelog.storage import Storage
from sparkiq.errors import CorruptSegmentError

__all__ = [
    "SEGMENT_VERSION",
    "SegmentInfo",
    "check_visible",
    "decode_segment",
    "decode_segment_arrays",
    "encode_segment",
    "encode_segment_arrays",
    "read_segment",
    "read_segment_arrays",
    "verify_landed",
    "write_segment",
    "write_segment_arrays",
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
    #: Which write of the batch made the segment, part of its file name: 0, the first (the
    #: only one but when the sink writes a batch again in the same run, after its in-place
    #: write was refused: :mod:`sparkiq.spark.sink`). A file of another attempt than the
    #: commit record's is never read, so a late write of an abandoned attempt cannot reach
    #: readers. Left out of the record when 0 (records as sparkiq wrote them before).
    attempt: int = 0

    def to_json(self) -> dict[str, int | str]:
        facts: dict[str, int | str] = {"rows": self.rows, "size": self.size, "sha256": self.sha256}
        if self.attempt:
            facts["attempt"] = self.attempt
        return facts


def encode_segment(
    table: str, partition: int, batch_id: int, changes: dict[bytes, bytes | None]
) -> bytes:
    """Serialize one partition's changes (key -> value, None = delete) deterministically."""
    keys = pa.array(list(changes), pa.binary())
    values = pa.array(list(changes.values()), pa.binary())
    return encode_segment_arrays(table, partition, batch_id, keys, values)[0]


def encode_segment_arrays(
    table: str, partition: int, batch_id: int, keys: pa.Array, values: pa.Array
) -> tuple[bytes, int]:
    """:func:`encode_segment` of the changes given as parallel binary arrays or chunked
    arrays (a null value deletes its key; of several rows with one key the last wins),
    without a Python object per row; returns the segment and its number of rows. The same
    changes give the same bytes whichever function encodes them."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    count = len(keys)
    # Arrow's sort is stable: a key's rows stay in their order, and the last of each run wins
    order = pc.sort_indices(keys)
    keys = keys.take(order)
    if count > 1:
        last = pc.not_equal(keys.slice(0, count - 1), keys.slice(1))
        keep = pa.concat_arrays([last, pa.array([True])])
        if not pc.all(keep).as_py():
            order, keys = order.filter(keep), keys.filter(keep)
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
        [keys.cast(pa.binary()), values.take(order).cast(pa.binary())], schema=schema
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue()), len(keys)


def write_segment(
    storage: Storage,
    path: str,
    table: str,
    partition: int,
    batch_id: int,
    changes: dict[bytes, bytes | None],
) -> SegmentInfo:
    """Write a segment atomically and return the facts its commit record must hold."""
    keys = pa.array(list(changes), pa.binary())
    values = pa.array(list(changes.values()), pa.binary())
    return write_segment_arrays(storage, path, table, partition, batch_id, keys, values)


def write_segment_arrays(
    storage: Storage,
    path: str,
    table: str,
    partition: int,
    batch_id: int,
    keys: pa.Array,
    values: pa.Array,
) -> SegmentInfo:
    """:func:`write_segment` of changes given as arrays (see :func:`encode_segment_arrays`)."""
    data, rows = encode_segment_arrays(table, partition, batch_id, keys, values)
    storage.write_atomic(path, data)
    return SegmentInfo(partition, rows, len(data), hashlib.sha256(data).hexdigest())


def decode_segment(
    data: bytes, path: str, table: str, partition: int, batch_id: int
) -> tuple[list[bytes], list[bytes | None]]:
    """Parse a verified segment into parallel key and value lists."""
    keys, values = decode_segment_arrays(data, path, table, partition, batch_id)
    return keys.to_pylist(), values.to_pylist()


def decode_segment_arrays(
    data: bytes, path: str, table: str, partition: int, batch_id: int
) -> tuple[pa.Array, pa.Array]:
    """Parse a verified segment into its key and value columns, as they are stored (binary
    arrays: no Python object per row)."""
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
    return table_data.column("key").combine_chunks(), table_data.column("value").combine_chunks()


def read_segment(
    storage: Storage, path: str, info: SegmentInfo, table: str, batch_id: int
) -> tuple[list[bytes], list[bytes | None]]:
    """Read, verify (size and SHA-256 from the commit record) and decode a segment.

    Raises :class:`CorruptSegmentError` naming the file when it is missing, truncated or
    altered; nothing from such a file is returned.
    """
    keys, values = read_segment_arrays(storage, path, info, table, batch_id)
    return keys.to_pylist(), values.to_pylist()


def read_segment_arrays(
    storage: Storage, path: str, info: SegmentInfo, table: str, batch_id: int
) -> tuple[pa.Array, pa.Array]:
    """:func:`read_segment` as the segment's key and value binary arrays."""
    data = _verified_bytes(
        storage,
        path,
        info,
        table,
        missing=f"segment {path!r} of committed batch {batch_id} is missing (deleted or not "
        "yet visible on this filesystem); the replica cannot apply the batch",
        says="its commit record says",
    )
    return decode_segment_arrays(data, path, table, info.partition, batch_id)


def verify_landed(
    storage: Storage, path: str, info: SegmentInfo, table: str, batch_id: int
) -> None:
    """Check that the segment just written at ``path`` is there, whole: read it back through
    ``storage`` and compare its size and SHA-256 with ``info`` (what the writer computed).

    The writer (an executor task) calls this before reporting the segment to the driver.
    Raises :class:`CorruptSegmentError` naming the file and the batch when it is missing,
    truncated or different, so the batch fails instead of being committed.
    """
    try:
        _verified_bytes(
            storage, path, info, table, missing=f"segment {path!r} is missing", says="it was"
        )
    except CorruptSegmentError as exc:
        raise CorruptSegmentError(
            f"the segment of partition {info.partition}, batch {batch_id} did not land where "
            f"it was written: {exc.message}; the batch is not committed",
            store=table,
            partition=info.partition,
        ) from None


def check_visible(
    storage: Storage, paths: dict[str, SegmentInfo], table: str, batch_id: int
) -> None:
    """Check, where this process looks, that every segment in ``paths`` exists with the size
    its :class:`SegmentInfo` says (one metadata request per file, no data read).

    The driver calls this before writing a batch's commit record: an executor's own check
    proves a segment landed where the executor looks, this proves it is where readers look
    (a ``state_dir`` on a disk the executors do not share with the driver fails here).
    Raises :class:`CorruptSegmentError` naming the first segment that is not.
    """
    if not paths:
        return
    found = storage.fs.get_file_info(list(paths))
    for (path, info), file in zip(paths.items(), found, strict=True):
        if file.type == pafs.FileType.File and file.size == info.size:
            continue
        state = "missing" if file.type == pafs.FileType.NotFound else f"{file.size} bytes"
        raise CorruptSegmentError(
            f"segment {path!r} of batch {batch_id} was written by an executor ({info.size} "
            f"bytes) but is {state} where the driver looks, so readers would not find it; "
            "the batch is not committed. state_dir must be a filesystem or object store that "
            "the driver, every executor and every reader share (see docs/deploy.md).",
            store=table,
            partition=info.partition,
        )


def _verified_bytes(
    storage: Storage, path: str, info: SegmentInfo, table: str, *, missing: str, says: str
) -> bytes:
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise CorruptSegmentError(missing, store=table, partition=info.partition) from None
    if len(data) != info.size:
        raise CorruptSegmentError(
            f"segment {path!r} has {len(data)} bytes, {says} {info.size}: "
            "the file is truncated or was rewritten",
            store=table,
            partition=info.partition,
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != info.sha256:
        raise CorruptSegmentError(
            f"segment {path!r} fails its checksum (sha256 {digest[:12]}..., {says} "
            f"{info.sha256[:12]}...): the file is corrupted",
            store=table,
            partition=info.partition,
        )
    return data
