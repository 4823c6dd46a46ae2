"""Spark's RocksDB state store provider, read from a query's checkpoint without Spark.

One :class:`RocksDBStateFiles` reads one store (or one transformWithState column family) of
one partition directory ``state/<operator>/<partition>/`` and hands out Spark's UnsafeRow
bytes with the provider's own framing removed, so the same row decoder serves both providers.
State version N holds the state after batch N-1.

Files (as Spark 4.x writes them; nothing here writes them):

``N.changelog`` / ``N_<uniqueId>.changelog`` (changelog checkpointing on)
    A compressed stream (lz4-java ``LZ4Block`` framing by default) of Java ``DataOutput``
    records, big-endian. v1: ``int keyLen, key, int valueLen (-1 = delete), value`` ... ended by
    ``int -1``. v2: ``writeUTF("v2")`` then ``byte type`` (0x01 put, 0x10 delete, 0x11 merge,
    0x00 end) + ``int keyLen, key, int valueLen, value`` (delete: ``int -1``). v3/v4 are v1/v2
    with ``writeUTF("v3"|"v4")`` and a ``writeUTF(lineage JSON)`` first
    (``checkpointFormatVersion=2``). A file without its end marker is truncated.
``N.zip`` / ``N_<uniqueId>.zip`` (a snapshot)
    The RocksDB directory minus its SST files (``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*``,
    ``*.log``) plus ``metadata``: ``v1\\n{json}`` whose ``sstFiles`` map each local SST name to
    the file kept in ``SSTs/`` (shared between snapshots; ``logFiles`` likewise in ``archive/``),
    and, with column families, ``columnFamilyMapping`` (name -> virtual column family id).
``N_<uniqueId>`` names (``checkpointFormatVersion=2``)
    Each attempt at a batch writes files of its own id, so a retried batch leaves two files
    for one version; ``commits/<N - 1>`` records the id of the attempt that was committed
    (``stateUniqueIds``) and only that attempt's files are read.
``.<file>.crc``
    Hadoop's local-filesystem checksum (``crc\\0``, int bytesPerChecksum, one CRC-32 per chunk,
    big-endian), verified whenever present.

Keys and values: with column families (transformWithState) every key starts with the
virtual column family's 2-byte id (:func:`~sparkiq.checkpoint.framing.family_prefix`, from
``columnFamilyMapping``), since Spark keeps every state variable in RocksDB's default column
family; this module keeps the keys of its own column family and removes that prefix. What
remains is a framed row, UnsafeRow or Avro, which :mod:`sparkiq.checkpoint.framing` turns into
UnsafeRow bytes (:meth:`RocksDBStateFiles.unframe_key` and its siblings); :meth:`records` and
:meth:`raw_snapshot` hand it out still framed, for list and map state.

Not supported (a clear :class:`~sparkiq.errors.ChangelogError`, never a wrong row): row
checksums (``spark.sql.streaming.stateStore.rowChecksum.enabled``), and what the framing
refuses. (Changelogs are read in every codec :mod:`sparkiq.checkpoint.compression` reads.)

With changelog checkpointing off Spark uploads a snapshot at every commit: the store is then
served at snapshot granularity -- :meth:`versions` are the snapshot versions and
:meth:`changes` is the difference between two consecutive snapshots.

A key or value that does not parse is corruption of the file it came from: the error names
the file whose raw rows were handed out last (:meth:`RocksDBStateFiles.corrupt`). Opening a
store from its description (what ``Checkpoint.files`` calls) is
:mod:`sparkiq.checkpoint.rocksdb_stores`'.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict

from sparkiq.checkpoint.compression import CompressionError, decompress
from sparkiq.checkpoint.files import ChecksumMismatch, read_verified
from sparkiq.checkpoint.framing import RocksDBEncoding, RowFraming, family_prefix
from sparkiq.checkpoint.provider import FileStamp, file_stamp
from sparkiq.checkpoint.tws import DELETE, MERGE, PUT, RawRecord
from sparkiq.errors import ChangelogError, CorruptSegmentError

__all__ = [
    "DELETE",
    "MERGE",
    "PUT",
    "RocksDBEncoding",
    "RocksDBStateFiles",
    "StateFileGoneError",
    "UnsupportedStateFormatError",
]

_END = 0x00  # v2/v4 end record; PUT, DELETE, MERGE are the record kinds

#: ``int32`` big-endian, as Java's DataOutputStream writes it.
_BE_INT = struct.Struct(">i")
_FILE = re.compile(r"^(\d+)(?:_([0-9A-Za-z-]+))?\.(changelog|zip)$")


class StateFileGoneError(ChangelogError):
    """A state file vanished while it was read: Spark's maintenance deletes old snapshots,
    changelogs and unreferenced SST files. Nothing was returned from the broken read; retry
    from a newer snapshot (:meth:`RocksDBStateFiles.snapshot_versions`)."""

    retryable = True


class UnsupportedStateFormatError(ChangelogError):
    """The store uses an encoding or format this reader does not decode (the message names
    what is supported)."""


class RocksDBStateFiles:
    """``StateFiles`` of one RocksDB-provider store in one partition directory.

    Thread-compatible, not thread-safe: each reader uses its own instance. Every method
    re-lists the directory, so files Spark writes later are seen. A snapshot is rebuilt in a
    private temporary directory (under ``local_dir``), read whole, and the directory removed
    before its first row is returned. ``store`` names the store in errors.

    ``committed_ids(version)`` gives the unique ids the commit log records for ``version``'s
    files in this partition (checkpointFormatVersion 2: ``commits/<version - 1>``'s
    ``stateUniqueIds``), None while that batch is not committed; with it, the files of the
    committed attempt of a retried batch are read and the others ignored.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        encoding: RocksDBEncoding,
        *,
        name: str = "",
        partition: int | None = None,
        store: str | None = None,
        codec: str = "lz4",
        local_dir: str | None = None,
        committed_ids: Callable[[int], frozenset[str] | None] | None = None,
    ) -> None:
        self._dir = Path(directory)
        self._committed_ids = committed_ids
        self._store = store
        self._codec = codec
        self._enc = encoding
        self._name = name or str(self._dir)
        self._partition = partition
        self._local_dir = local_dir
        # the file(s) the raw rows handed out last came from: the framing's errors name it
        self._reading: str | None = None
        self._framing = RowFraming(
            encoding,
            error=self._error,
            corrupt=self.corrupt,
            unsupported=lambda message: self._unsupported(message, self._reading),
        )
        self._cf_prefix: bytes | None = None

    # -- StateFiles --------------------------------------------------------------------

    def versions(self) -> list[int]:
        """State versions with a changelog file; with changelog checkpointing off (no
        changelog at all), the snapshot versions: the store is served at snapshot
        granularity."""
        changelogs = sorted(self._files("changelog"))
        return changelogs if changelogs else self.snapshot_versions()

    def snapshot_versions(self) -> list[int]:
        """Versions with a snapshot (``N.zip``) in the directory, ascending."""
        return sorted(self._files("zip"))

    def changes(self, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        """The changes of ``version`` (batch ``version - 1``), key and value as UnsafeRow
        bytes (value None = removed), in the changelog's order; the whole file is read and
        checked before the first change is yielded. List state is read through
        :class:`~sparkiq.checkpoint.tws.ListStateFiles` (an append needs the list's length)."""
        self._single_value()
        key, value = self._framing.unframe_key, self._framing.unframe_value
        changes = [
            (key(rec.key), None if rec.value is None else value(rec.value))
            for rec in self.records(version)
        ]
        yield from changes

    def snapshot(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        """Every (key, value) of the snapshot ``version``, in RocksDB key order; the whole
        snapshot is read before the first row is yielded."""
        self._single_value()
        key, value = self._framing.unframe_key, self._framing.unframe_value
        rows = [(key(k), value(v)) for k, v in self.raw_snapshot(version)]
        yield from rows

    def stamp(self, version: int) -> FileStamp | None:
        """The changelog's stamp; None without one (snapshot differences read two files)."""
        if self._enc.multi_value:
            return None  # list state is read through ListStateFiles, which keeps lengths
        path = self._files("changelog").get(version)
        return None if path is None else file_stamp(path)

    def _single_value(self) -> None:
        if self._enc.multi_value:
            raise self._error(
                "list state has append records; read it through "
                "sparkiq.checkpoint.tws.ListStateFiles"
            )

    # -- raw access for tws ----------------------------------------------------------

    def records(self, version: int) -> list[RawRecord]:
        """The raw records of ``version`` of this store (column family prefix removed,
        encoder framing kept): the changelog's, or with changelog checkpointing off the
        difference between snapshots ``version - 1`` and ``version``."""
        files = self._files("changelog")
        if version in files:
            records = self._changelog(files[version])
            self._reading = str(files[version])
            return records
        if files:
            raise self._gone(f"no changelog for state version {version}")
        records = self._snapshot_diff(version)
        zips = self._files("zip")
        self._reading = " and ".join(str(zips[v]) for v in (version - 1, version) if v in zips)
        return records

    def raw_snapshot(self, version: int) -> list[tuple[bytes, bytes]]:
        """The snapshot's (key, value) pairs of this store, in key order, with only the
        column family prefix removed."""
        zips = self._files("zip")
        if version not in zips:
            raise self._gone(f"no snapshot for state version {version}")
        rows = self._read_snapshot(zips[version], version)
        self._reading = str(zips[version])
        return rows

    def unframe_key(self, key: bytes) -> bytes:
        """A raw key (as :meth:`records` gives it) as one UnsafeRow of the key schema."""
        return self._framing.unframe_key(key)

    def unframe_value(self, value: bytes) -> bytes:
        """A raw single value as its UnsafeRow bytes."""
        return self._framing.unframe_value(value)

    def unframe_values(self, value: bytes) -> list[bytes]:
        """A raw multi-value (list state) value as the UnsafeRow bytes of its elements."""
        return self._framing.unframe_values(value)

    def corrupt(self, message: str) -> CorruptSegmentError:
        """The error for a raw key or value that does not parse: corruption of the file(s)
        :meth:`records` or :meth:`raw_snapshot` read last, named in the message."""
        return self._corrupt(message, self._reading)

    # -- files -----------------------------------------------------------------------

    def _files(self, suffix: str) -> dict[int, Path]:
        """The file of each state version with one: with checkpointFormatVersion 2 names,
        the committed attempt's (see :meth:`_committed_file`)."""
        attempts: dict[int, list[tuple[str | None, Path]]] = {}
        try:
            names = os.listdir(self._dir)
        except FileNotFoundError:
            return {}
        for name in names:
            match = _FILE.match(name)
            if match is None or match[3] != suffix:
                continue
            attempts.setdefault(int(match[1]), []).append((match[2], self._dir / name))
        found: dict[int, Path] = {}
        for version, candidates in attempts.items():
            if len(candidates) == 1 and candidates[0][0] is None:
                found[version] = candidates[0][1]  # checkpointFormatVersion 1
                continue
            path = self._committed_file(version, candidates, suffix)
            if path is not None:
                found[version] = path
        return found

    def _committed_file(
        self, version: int, candidates: list[tuple[str | None, Path]], suffix: str
    ) -> Path | None:
        """Of the ``N_<uniqueId>`` files of one version (one per attempt of its batch: a
        retried batch writes another), the one whose id the batch's commit records; while
        the batch is not committed, its only attempt, or None when there are several (the
        commit will say which). None too when the committed attempt's file is not here: that
        version then reads as missing, like a file Spark's maintenance deleted."""
        ids = None if self._committed_ids is None else self._committed_ids(version)
        if ids is None:
            if len(candidates) == 1:
                return candidates[0][1]
            if self._committed_ids is None:
                names = ", ".join(sorted(p.name for _, p in candidates))
                raise self._unsupported(
                    f"several {suffix} files for state version {version} ({names}) and no "
                    "commit log to say which attempt was committed"
                )
            return None
        matches = [path for unique_id, path in candidates if unique_id in ids]
        return matches[0] if len(matches) == 1 else None

    def _read_verified(self, path: Path) -> bytes:
        try:
            return read_verified(path)
        except FileNotFoundError:
            raise self._gone(f"{path.name} was deleted while it was read") from None
        except ChecksumMismatch as exc:
            raise self._corrupt(str(exc), path) from None

    # -- changelog -------------------------------------------------------------------

    def _changelog(self, path: Path) -> list[RawRecord]:
        try:
            data = decompress(self._codec, self._read_verified(path))
        except CompressionError as exc:
            raise self._corrupt(f"{self._codec}: {exc}", path) from None
        prefix = self._column_family_prefix() if self._enc.column_family else None
        out: list[RawRecord] = []
        for rec in _parse_changelog(data, lambda m: self._corrupt(m, path)):
            if prefix is not None:
                if rec.key[:2] != prefix:
                    continue
                rec = RawRecord(rec.kind, rec.key[2:], rec.value)
            if rec.kind == MERGE and not self._enc.multi_value:
                raise self._corrupt("merge record in a single-value store", path)
            out.append(rec)
        return out

    # -- snapshots -------------------------------------------------------------------

    def _column_family_prefix(self) -> bytes:
        if self._cf_prefix is None:
            name = self._enc.column_family
            for version in sorted(self._files("zip"), reverse=True):
                try:
                    mapping = self._zip_metadata(version).get("columnFamilyMapping") or {}
                except StateFileGoneError:
                    continue
                if name in mapping:
                    self._cf_prefix = family_prefix(int(mapping[name]))
                    break
            else:
                raise self._error(
                    f"column family {name!r} is in no snapshot's columnFamilyMapping yet; "
                    "retry once Spark has uploaded a snapshot"
                )
        return self._cf_prefix

    def _zip_metadata(self, version: int) -> dict[str, Any]:
        path = self._files("zip").get(version)
        if path is None:
            raise self._gone(f"no snapshot for state version {version}")
        try:
            with zipfile.ZipFile(path) as archive:
                raw = archive.read("metadata")
        except FileNotFoundError:
            raise self._gone(f"{path.name} was deleted while it was read") from None
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            raise self._corrupt(f"unreadable snapshot: {exc}", path) from None
        return _parse_metadata(raw, lambda m: self._corrupt(m, path))

    def _read_snapshot(self, path: Path, version: int) -> list[tuple[bytes, bytes]]:
        workdir = tempfile.mkdtemp(prefix=f"sparkiq-rocksdb-{version}-", dir=self._local_dir)
        try:
            self._restore(path, Path(workdir))
            prefix = self._column_family_prefix() if self._enc.column_family else b""
            rows: list[tuple[bytes, bytes]] = []
            try:
                db = Rdict(workdir, Options(raw_mode=True), access_type=AccessType.read_only())
            except Exception as exc:  # rocksdict raises plain exceptions
                raise self._corrupt(f"RocksDB cannot open the snapshot: {exc}", path) from None
            try:
                it = db.iter()
                it.seek(prefix)
                while it.valid():
                    key = it.key()
                    if not key.startswith(prefix):
                        break
                    rows.append((key[len(prefix) :], it.value()))
                    it.next()
                it.status()
                del it
            except Exception as exc:
                raise self._corrupt(f"RocksDB read failed: {exc}", path) from None
            finally:
                db.close()
            return rows
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _restore(self, path: Path, into: Path) -> None:
        data = self._read_verified(path)
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                for info in archive.infolist():
                    name = Path(info.filename).name
                    if not name or name != info.filename:
                        raise self._corrupt(f"unexpected entry {info.filename!r}", path)
                    (into / name).write_bytes(archive.read(info))
        except zipfile.BadZipFile as exc:
            raise self._corrupt(f"unreadable snapshot: {exc}", path) from None
        meta = _parse_metadata((into / "metadata").read_bytes(), lambda m: self._corrupt(m, path))
        for kind, folder in (("sstFiles", "SSTs"), ("logFiles", "archive")):
            for item in meta.get(kind) or ():
                local, kept = item.get("localFileName"), item.get("dfsSstFileName")
                kept = kept or item.get("dfsLogFileName")
                if not local or not kept or "/" in local or "/" in kept:
                    raise self._corrupt(f"bad {kind} entry {item!r} in metadata", path)
                source = self._dir / folder / kept
                blob = self._read_verified(source)
                size = item.get("sizeBytes")
                if size is not None and int(size) != len(blob):
                    raise self._corrupt(
                        f"{folder}/{kept} has {len(blob)} bytes, metadata says {size}", source
                    )
                (into / local).write_bytes(blob)

    def _snapshot_diff(self, version: int) -> list[RawRecord]:
        """Changelog checkpointing off: the records that turn snapshot ``version - 1`` into
        snapshot ``version`` (both are sorted by key, so one merge pass)."""
        zips = self._files("zip")
        if version not in zips or (version > 1 and version - 1 not in zips):
            raise self._gone(
                f"state version {version} needs snapshots {version - 1} and {version} "
                "(changelog checkpointing is off)"
            )
        before = self.raw_snapshot(version - 1) if version > 1 else []
        after = self.raw_snapshot(version)
        out: list[RawRecord] = []
        i = j = 0
        while i < len(before) or j < len(after):
            if j == len(after) or (i < len(before) and before[i][0] < after[j][0]):
                out.append(RawRecord(DELETE, before[i][0], None))
                i += 1
            elif i == len(before) or after[j][0] < before[i][0]:
                out.append(RawRecord(PUT, after[j][0], after[j][1]))
                j += 1
            else:
                if before[i][1] != after[j][1]:
                    out.append(RawRecord(PUT, after[j][0], after[j][1]))
                i, j = i + 1, j + 1
        return out

    # -- errors ----------------------------------------------------------------------

    def _where(self, path: Path | str | None) -> str:
        where = f"{self._name}" + (
            f" partition {self._partition}" if self._partition is not None else ""
        )
        return f"{where} ({path})" if path is not None else where

    def _error(self, message: str) -> ChangelogError:
        return ChangelogError(
            f"{self._where(None)}: {message}", store=self._store, partition=self._partition
        )

    def _corrupt(self, message: str, path: Path | str | None = None) -> CorruptSegmentError:
        return CorruptSegmentError(
            f"{self._where(path)}: {message}; the partition cannot be served from this file",
            store=self._store,
            partition=self._partition,
        )

    def _gone(self, message: str) -> StateFileGoneError:
        return StateFileGoneError(
            f"{self._where(None)}: {message} (Spark's maintenance removes old files); "
            "restore from a newer snapshot and retry",
            store=self._store,
            partition=self._partition,
        )

    def _unsupported(
        self, message: str, path: Path | str | None = None
    ) -> UnsupportedStateFormatError:
        return UnsupportedStateFormatError(
            f"{self._where(path)}: unsupported {message}",
            store=self._store,
            partition=self._partition,
        )


# -- formats ------------------------------------------------------------------------


def _parse_changelog(data: bytes, corrupt: Any) -> Iterator[RawRecord]:
    version, pos = _changelog_version(data)
    if version in (3, 4):
        if pos + 2 > len(data):
            raise corrupt("truncated lineage")
        (size,) = struct.unpack_from(">H", data, pos)
        pos += 2 + size
    typed = version in (2, 4)
    end = len(data)

    def take_int() -> int:
        nonlocal pos
        if pos + 4 > end:
            raise corrupt("truncated record (no end marker)")
        n: int = _BE_INT.unpack_from(data, pos)[0]
        pos += 4
        return n

    def take(n: int) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > end:
            raise corrupt(f"record of {n} bytes overruns the file")
        pos += n
        return data[pos - n : pos]

    while True:
        kind = PUT
        if typed:
            if pos >= end:
                raise corrupt("truncated (no end record)")
            kind = data[pos]
            pos += 1
            if kind == _END:
                break
            if kind not in (PUT, DELETE, MERGE):
                raise corrupt(f"unknown record type 0x{kind:02x}")
        size = take_int()
        if size == -1 and not typed:
            break
        key = take(size)
        size = take_int()
        if size < 0:
            if size != -1 or kind == MERGE:
                raise corrupt(f"bad value length {size}")
            yield RawRecord(DELETE, key, None)
        else:
            if kind == DELETE:
                raise corrupt("delete record with a value")
            yield RawRecord(kind, key, take(size))
    if pos != end:
        raise corrupt(f"{end - pos} bytes after the end record")


def _changelog_version(data: bytes) -> tuple[int, int]:
    """Format version and where records start: v2+ files begin with ``writeUTF("vN")``; a
    v1 file begins with a key length, which never reads as such a string."""
    if len(data) >= 4:
        (size,) = struct.unpack_from(">H", data, 0)
        text = data[2 : 2 + size]
        if 2 <= size <= 3 and text[:1] == b"v" and text[1:].isdigit():
            version = int(text[1:])
            if version not in (2, 3, 4):
                raise UnsupportedStateFormatError(
                    f"changelog format v{version}: supported are v1-v4"
                )
            return version, 2 + size
    return 1, 0


def _parse_metadata(raw: bytes, corrupt: Any) -> dict[str, Any]:
    text = raw.decode("utf-8", "replace")
    head, _, body = text.partition("\n")
    if head.strip() != "v1":
        raise corrupt(f"snapshot metadata version {head.strip()!r}: supported is v1")
    try:
        doc = json.loads(body)
    except ValueError:
        raise corrupt("snapshot metadata is not JSON") from None
    if not isinstance(doc, dict):
        raise corrupt("snapshot metadata is not a JSON object")
    return doc
