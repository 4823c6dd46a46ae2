"""What every state store provider's reader offers: the store's description, the files of one
store partition as Spark's row bytes, and their decoding into Python rows.

Versions and batches
--------------------
Spark numbers state by *version*: version ``N`` holds the state after batch ``N - 1`` (the
first batch, 0, writes version 1). Readers speak versions, because file names do
(``N.delta``, ``N.snapshot``, ``N.changelog``, ``N.zip``); :func:`version_of_batch` and
:func:`batch_of_version` are the one place that converts.

Providers
---------
A provider module (``hdfs``; ``rocksdb_stores``) offers ``open_state_files(store, partition) ->
StateFiles`` for a :class:`StateStoreInfo` that :class:`~sparkiq.checkpoint.layout.Checkpoint`
discovered; :meth:`~sparkiq.checkpoint.layout.Checkpoint.files` picks the module by
``StateStoreInfo.provider``.

Errors: a missing file is :class:`~sparkiq.errors.ChangelogError`, a file that fails its
checksum, framing or decoding :class:`~sparkiq.errors.CorruptSegmentError` -- each naming the
operator, partition, file and what to do; never a wrong row.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sparkiq.checkpoint.unsaferow import UnsafeRowDecoder, UnsafeRowError
from sparkiq.errors import ChangelogError, CorruptSegmentError
from sparkiq.schema.types import DataType

__all__ = [
    "DEFAULT_STORE",
    "FileStamp",
    "RowDecoder",
    "StateFiles",
    "StateStoreInfo",
    "batch_of_version",
    "file_stamp",
    "replay",
    "version_of_batch",
]

#: Spark's name of an operator's only store, and of the default column family.
DEFAULT_STORE = "default"


def version_of_batch(batch: int) -> int:
    """The state version that holds the state after batch ``batch`` (Spark: batch + 1)."""
    return batch + 1


def batch_of_version(version: int) -> int:
    """The batch whose commit produced state version ``version`` (version - 1)."""
    return version - 1


@dataclass(frozen=True)
class StateStoreInfo:
    """One state store of one stateful operator of a checkpoint.

    ``store_name`` is Spark's store name (``"default"``; a stream-stream join's
    ``"left-keyToNumValues"``...) or, for a column family of a multi-family store
    (transformWithState), the column family (state variable) name; ``state_store`` is then
    the Spark store whose files hold it and ``column_family`` that family.
    ``key_schema``/``value_schema`` are Spark's schemas of the stored UnsafeRows.
    ``codec`` is the short name of the compression codec of its files; ``conf`` the batch's
    SQL settings from the offset log (as ``(name, value)`` pairs, for readers that need one);
    ``schema_json`` the store's entry of a v3 state schema file, if it has one.
    """

    operator_id: int
    operator_name: str
    store_name: str
    partitions: int
    provider: str
    key_schema: DataType
    value_schema: DataType
    checkpoint: Path
    state_store: str = DEFAULT_STORE
    column_family: str = DEFAULT_STORE
    codec: str = "lz4"
    num_cols_prefix_key: int = 0
    checkpoint_format_version: int = 1
    conf: tuple[tuple[str, str], ...] = ()
    schema_json: str = ""

    def directory(self, partition: int) -> Path:
        """The directory of the store's files for ``partition`` (Spark's
        ``<checkpoint>/state/<operator>/<partition>[/<store>]``)."""
        base = self.checkpoint / "state" / str(self.operator_id) / str(partition)
        return base if self.state_store == DEFAULT_STORE else base / self.state_store

    def setting(self, name: str, default: str = "") -> str:
        """One SQL setting of the query, as its offset log records it."""
        return dict(self.conf).get(name, default)

    def describe(self, partition: int | None = None) -> str:
        """How errors name the store: operator, store and partition."""
        where = f"operator {self.operator_id}"
        if self.operator_name:
            where += f" ({self.operator_name})"
        where += f", store {self.store_name!r}"
        return where if partition is None else f"{where}, partition {partition}"


class StateFiles(Protocol):
    """The files of one store partition, read as Spark's row bytes.

    Contract: versions are listed in ascending order; ``changes(v)`` yields the puts and
    removals that turn version ``v - 1`` into ``v`` in the order Spark wrote them (a later
    record for a key wins); ``snapshot(v)`` yields every key of version ``v`` once. Both read
    a file whole before yielding anything, so a file that is cut short or corrupted raises
    (:class:`~sparkiq.errors.CorruptSegmentError`) before any of its rows is seen; a file
    deleted meanwhile raises :class:`~sparkiq.errors.ChangelogError`.
    """

    def versions(self) -> list[int]:
        """State versions with a change file (delta / changelog)."""
        ...

    def snapshot_versions(self) -> list[int]:
        """State versions with a snapshot."""
        ...

    def changes(self, version: int) -> Iterator[tuple[bytes, bytes | None]]:
        """``(key, value)`` of each change of ``version``; value None = key removed."""
        ...

    def snapshot(self, version: int) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of every row of ``version``."""
        ...

    def stamp(self, version: int) -> FileStamp | None:
        """The identity of ``version``'s change file as it is now, or None when it has none
        or its changes are not one file's alone (then nothing may be read ahead)."""
        ...


#: ``(inode, size, mtime in ns)`` of a file: Spark writes state files to a temporary name and
#: renames them, so a file written again (a retried batch) gets another stamp.
FileStamp = tuple[int, int, int]


def file_stamp(path: Path) -> FileStamp | None:
    """The :data:`FileStamp` of ``path``, or None when it does not exist."""
    try:
        found = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return found.st_ino, found.st_size, found.st_mtime_ns


class RowDecoder:
    """Turns a store's key and value bytes into Python tuples by its schemas (compiled once).

    Raises :class:`~sparkiq.errors.CorruptSegmentError` naming the store when bytes do not
    fit the schema, and :class:`~sparkiq.errors.ChangelogError` at construction for a type
    sparkiq cannot decode.
    """

    def __init__(self, store: StateStoreInfo) -> None:
        self.store = store
        try:
            self._key = UnsafeRowDecoder(store.key_schema)
            self._value = UnsafeRowDecoder(store.value_schema)
        except UnsafeRowError as exc:
            raise ChangelogError(f"{store.describe()}: {exc}", store=store.store_name) from None

    def key(self, data: bytes) -> tuple[Any, ...]:
        return self._decode(self._key, data, "key")

    def value(self, data: bytes) -> tuple[Any, ...]:
        return self._decode(self._value, data, "value")

    def _decode(self, decoder: UnsafeRowDecoder, data: bytes, part: str) -> tuple[Any, ...]:
        try:
            return decoder.decode(data)
        except UnsafeRowError as exc:
            raise CorruptSegmentError(
                f"{self.store.describe()}: a state {part} does not fit the {part} schema: {exc}",
                store=self.store.store_name,
            ) from None

    def row(self, key: bytes, value: bytes) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        return self.key(key), self.value(value)


def replay(files: StateFiles, version: int) -> dict[bytes, bytes]:
    """The state of ``version`` as ``{key bytes: value bytes}``: the newest snapshot at or
    before it, then every change file after that up to ``version`` (Spark's own recovery).

    Raises :class:`~sparkiq.errors.ChangelogError` when a change file in between is missing.
    """
    if version <= 0:
        return {}
    base = max((v for v in files.snapshot_versions() if v <= version), default=0)
    state: dict[bytes, bytes] = dict(files.snapshot(base)) if base else {}
    have = set(files.versions())
    for v in range(base + 1, version + 1):
        if v not in have:
            raise ChangelogError(
                f"state version {v} has no change file and no snapshot at or after it up to "
                f"version {version}: Spark's maintenance may have deleted it; restore from a "
                "newer snapshot",
                position=v,
            )
        for key, value in files.changes(v):
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state
