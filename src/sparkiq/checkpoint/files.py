"""Reading one checkpoint file whole, verified by the checksum files written beside it.

Two kinds of checksum file may sit next to a file ``F`` of a Spark checkpoint:

- ``.F.crc`` -- Hadoop's ``ChecksumFileSystem`` (the local file system Spark uses for
  ``file:`` checkpoints): the bytes ``crc\\0``, a big-endian int32 chunk size, then one
  big-endian CRC-32 per chunk of ``F``.
- ``F.crc`` -- Spark 4.1+'s ``ChecksumCheckpointFileManager``
  (``spark.sql.streaming.checkpoint.fileChecksum.enabled``): a JSON object whose
  ``algorithm`` is ``CRC32C``, ``value`` the CRC-32C of all of ``F`` as a signed int32 and
  ``mainFileSize`` its length.

:func:`read_verified` checks whichever exist (a file without them is read as it is, as Spark
does) and raises :class:`ChecksumMismatch` when one does not match: the file is then never
decoded. A checksum file that appears without its main file, or is itself unreadable, is a
mismatch too: Spark writes the two together.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import crc32c

from sparkiq.errors import ChangelogError

__all__ = ["ChecksumMismatch", "read_verified"]

_HADOOP_MAGIC = b"crc\x00"
_BE_INT = struct.Struct(">i")


class ChecksumMismatch(ChangelogError, ValueError):
    """A file's bytes do not match a checksum file written beside it."""


def read_verified(path: Path) -> bytes:
    """All of ``path``'s bytes, after checking its checksum files (see the module docstring).

    Raises ``FileNotFoundError`` when ``path`` is gone (Spark's maintenance deletes old state
    files: callers say which file and what to do) and :class:`ChecksumMismatch`.
    """
    data = path.read_bytes()
    hadoop = path.with_name(f".{path.name}.crc")
    if hadoop.exists():
        _check_hadoop(data, _read_optional(hadoop))
    spark = path.with_name(f"{path.name}.crc")
    if spark.exists():
        _check_spark(data, _read_optional(spark))
    return data


def _read_optional(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # deleted with its main file between exists() and here
        return None


def _check_hadoop(data: bytes, sums: bytes | None) -> None:
    if sums is None:
        return
    if len(sums) < 8 or not sums.startswith(_HADOOP_MAGIC):
        raise ChecksumMismatch("its Hadoop .crc file has no 'crc\\0' header")
    (chunk,) = _BE_INT.unpack_from(sums, 4)
    if chunk <= 0:
        raise ChecksumMismatch(f"its Hadoop .crc file has chunk size {chunk}")
    chunks = (len(data) + chunk - 1) // chunk
    if len(sums) != 8 + 4 * chunks:
        raise ChecksumMismatch(
            f"its Hadoop .crc file covers {(len(sums) - 8) // 4} chunks of {chunk} bytes, "
            f"the file has {chunks}"
        )
    for i in range(chunks):
        (want,) = _BE_INT.unpack_from(sums, 8 + 4 * i)
        got = zlib.crc32(data[i * chunk : (i + 1) * chunk])
        if got != want & 0xFFFFFFFF:
            raise ChecksumMismatch(f"bytes {i * chunk}..{(i + 1) * chunk} fail their CRC-32")


def _check_spark(data: bytes, doc: bytes | None) -> None:
    if doc is None:
        return
    try:
        info = json.loads(doc)
        algorithm, value, size = info["algorithm"], int(info["value"]), int(info["mainFileSize"])
    except (ValueError, KeyError, TypeError):
        raise ChecksumMismatch("its Spark checksum file (.crc) is not readable JSON") from None
    if str(algorithm).upper() != "CRC32C":
        raise ChecksumMismatch(f"its Spark checksum file uses {algorithm!r}; sparkiq reads CRC32C")
    if size != len(data):
        raise ChecksumMismatch(f"it has {len(data)} bytes, its checksum file says {size}")
    if crc32c.crc32c(data) != value & 0xFFFFFFFF:
        raise ChecksumMismatch("it fails the CRC-32C recorded in its checksum file")
