"""The HDFS-backed state store provider's files (Spark's default provider).

One directory per store partition (see
:meth:`~sparkiq.checkpoint.provider.StateStoreInfo.directory`) holding ``N.delta`` (the
changes of version ``N``) and, every few versions, ``N.snapshot`` (all of version ``N``),
written by ``HDFSBackedStateStoreProvider``. Both are compressed streams
(:mod:`~sparkiq.checkpoint.compression`) of records, integers big-endian::

    int32 key size, key bytes, int32 value size, value bytes     a put (snapshot: every row)
    int32 key size, key bytes, int32 -1                           a removal (deltas only)
    int32 -1                                                      end of file

Keys and values are UnsafeRows; a value's length is floored to a multiple of 8, as Spark
does (Spark before 2.3 appended 4 bytes). With row checksums
(``spark.sql.streaming.stateStore.rowChecksum.enabled``, Spark 4.1+) a put's value bytes
start with a little-endian int32 CRC-32C of key and value row bytes, and a removal's key
bytes with the CRC-32C of the key row: sparkiq verifies and strips them. A file is verified
(checksum files, codec framing, this record framing up to its end marker, row checksums)
before any record is yielded.

``checkpointFormatVersion`` 2 does not exist for this provider (Spark refuses it too).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path

import crc32c

from sparkiq.checkpoint.compression import CompressionError, decompress
from sparkiq.checkpoint.files import ChecksumMismatch, read_verified
from sparkiq.checkpoint.provider import FileStamp, StateStoreInfo, file_stamp
from sparkiq.errors import ChangelogError, CorruptSegmentError

__all__ = ["HdfsStateFiles", "open_state_files"]

_NAME = re.compile(r"^(\d+)\.(delta|snapshot)$")
_BE_INT = struct.Struct(">i")
_LE_INT = struct.Struct("<i")
_ROW_CHECKSUM = "spark.sql.streaming.stateStore.rowChecksum.enabled"


def open_state_files(store: StateStoreInfo, partition: int) -> HdfsStateFiles:
    """The files of ``store``'s ``partition``."""
    return HdfsStateFiles(store, partition)


class HdfsStateFiles:
    """:class:`~sparkiq.checkpoint.provider.StateFiles` of one HDFS-provider store partition.

    Lists the directory on every call (Spark adds and deletes files while it runs); holds no
    open files between calls.
    """

    def __init__(self, store: StateStoreInfo, partition: int) -> None:
        self.row_checksums = store.setting(_ROW_CHECKSUM).lower() == "true"
        self.store = store
        self.partition = partition
        self.directory = store.directory(partition)

    def _listed(self, kind: str) -> list[int]:
        try:
            names = [p.name for p in self.directory.iterdir()]
        except FileNotFoundError:
            return []
        found = (_NAME.match(name) for name in names)
        return sorted(int(m[1]) for m in found if m is not None and m[2] == kind)

    def versions(self) -> list[int]:
        return self._listed("delta")

    def snapshot_versions(self) -> list[int]:
        return self._listed("snapshot")

    def changes(self, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        yield from self._records(self.directory / f"{version}.delta", version, removals=True)

    def snapshot(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._records(
            self.directory / f"{version}.snapshot", version, removals=False
        ):
            assert value is not None  # removals=False refuses them
            yield key, value

    def stamp(self, version: int) -> FileStamp | None:
        return file_stamp(self.directory / f"{version}.delta")

    def _records(
        self, path: Path, version: int, *, removals: bool
    ) -> list[tuple[bytes, bytes | None]]:
        where = f"{self.store.describe(self.partition)}, file {path}"
        try:
            data = decompress(self.store.codec, read_verified(path))
            return _parse(data, removals=removals, checksums=self.row_checksums)
        except FileNotFoundError:
            raise ChangelogError(
                f"{where} is gone (Spark's maintenance deletes old state files): restore "
                "from a newer snapshot",
                store=self.store.store_name,
                partition=self.partition,
                position=version,
            ) from None
        except (ChecksumMismatch, CompressionError, _FramingError) as exc:
            raise CorruptSegmentError(
                f"{where} is corrupted or truncated ({exc}); it is not applied. Codec: "
                f"{self.store.codec} (spark.sql.streaming.stateStore.compression.codec)",
                store=self.store.store_name,
                partition=self.partition,
                position=version,
            ) from None


class _FramingError(ChangelogError, ValueError):
    pass


def _parse(data: bytes, *, removals: bool, checksums: bool) -> list[tuple[bytes, bytes | None]]:
    records: list[tuple[bytes, bytes | None]] = []
    pos, end = 0, len(data)
    unpack = _BE_INT.unpack_from
    while True:
        if end - pos < 4:
            raise _FramingError("the records end without the end marker")
        (key_size,) = unpack(data, pos)
        pos += 4
        if key_size == -1:
            break
        if key_size < 0 or end - pos < key_size + 4:
            raise _FramingError(f"a record at byte {pos - 4} has key size {key_size}")
        key = data[pos : pos + key_size]
        pos += key_size
        (value_size,) = unpack(data, pos)
        pos += 4
        if value_size == -1 and removals:
            records.append((_unsealed(key, b"") if checksums else key, None))
            continue
        if value_size < 0 or end - pos < value_size:
            raise _FramingError(f"a record at byte {pos - 4} has value size {value_size}")
        value = data[pos : pos + value_size]
        pos += value_size
        if checksums:
            value = _unsealed(value, key)
        records.append((key, value[: (len(value) // 8) * 8]))
    if pos != end:
        raise _FramingError(f"{end - pos} bytes follow the end marker")
    return records


def _unsealed(sealed: bytes, key: bytes) -> bytes:
    """A row without its leading row checksum, verified: CRC-32C over ``key`` (empty for a
    removal, whose sealed row is the key itself) and the row."""
    if len(sealed) < 4:
        raise _FramingError("a row is shorter than its row checksum")
    row = sealed[4:]
    want = _LE_INT.unpack_from(sealed)[0] & 0xFFFFFFFF
    if crc32c.crc32c(row, crc32c.crc32c(key)) != want:
        raise _FramingError("a row fails its row checksum (CRC-32C)")
    return row
