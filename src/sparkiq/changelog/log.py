"""One table's changelog: layout of its files, and the reads and writes on them.

Directory layout under ``state_dir``::

    tables/<table>/table.json                          manifest (see manifest.py)
    tables/<table>/commits/<batch:020d>.json           one commit record per batch
    tables/<table>/segments/<partition:05d>/<batch:020d>.arrow   changes of one partition
    tables/<table>/segments/<partition:05d>/<batch:020d>.a<n>.arrow   the same, write attempt n
    checkpoints/<table>/                               the writer's Spark checkpoint (default)
    replicas/<node>/<table>/<partition:05d>/           a node's local RocksDB (local dirs only)

Invariants: there is exactly one writer per table; segments are written before the commit
record that lists them; a batch id's commit record is written at most once; readers apply
only batches whose commit record exists, in batch id order, using only the segments the
record lists (segments of an attempt that never committed are ignored).

Readers open the changelog with ``read_only=True`` (followers always do): every write through
such a :class:`Changelog` - its own write methods, and anything written through its
``storage`` (snapshots, retention) - raises :class:`~sparkiq.errors.ReadOnlyError` before
touching a file, so a reader can never disturb the owner.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pyarrow as pa

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.manifest import TableManifest
from sparkiq.changelog.segment import (
    SegmentInfo,
    read_segment,
    read_segment_arrays,
    write_segment,
    write_segment_arrays,
)
from sparkiq.changelog.storage import Storage, open_storage
from sparkiq.errors import ReadOnlyError, UnknownStoreError

__all__ = ["Changelog", "list_tables"]

_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def list_tables(state_dir: str) -> list[str]:
    """Names of the tables with a manifest in ``state_dir``, sorted."""
    storage = open_storage(state_dir)
    names = storage.list_names(storage.path("tables"))
    return sorted(n for n in names if storage.exists(storage.path("tables", n, "table.json")))


def check_table_name(name: object) -> str:
    """Table names are SQL identifiers: letters, digits and underscores, not starting with a
    digit, at most 128 characters."""
    if not isinstance(name, str) or not _TABLE_NAME.match(name):
        raise ValueError(
            f"invalid table name {name!r}: use letters, digits and underscores, starting with "
            "a letter or underscore (at most 128 characters)"
        )
    return name


def _refusal(table: str, action: str, path: str) -> ReadOnlyError:
    return ReadOnlyError(
        f"cannot {action} {path!r}: the changelog of table {table!r} is open read-only here "
        "(a follower's or a reader's). Followers never write the owner's changelog; only the "
        "table's own Spark query does.",
        store=table,
    )


@dataclass(frozen=True)
class _ReadOnlyStorage(Storage):
    """A view of a :class:`Storage` whose every write raises :class:`ReadOnlyError`."""

    table: str = ""

    def write_atomic(self, path: str, data: bytes) -> None:
        raise _refusal(self.table, "write", path)

    def makedirs(self, path: str) -> None:
        raise _refusal(self.table, "create the directory", path)

    def delete(self, path: str) -> None:
        raise _refusal(self.table, "delete", path)

    def delete_dir(self, path: str) -> None:
        raise _refusal(self.table, "delete the directory", path)


class Changelog:
    """Access to one table's changelog files. Cheap to create; holds no open files.

    With ``read_only=True`` every write (:meth:`write_commit`, :meth:`write_segment`, and any
    write through :attr:`storage`) raises :class:`~sparkiq.errors.ReadOnlyError` naming the
    table, and nothing is written.
    """

    def __init__(self, state_dir: str, table: str, *, read_only: bool = False) -> None:
        self.state_dir = state_dir
        self.table = table
        self.read_only = read_only
        storage = open_storage(state_dir)
        if read_only:
            storage = _ReadOnlyStorage(storage.uri, storage.fs, storage.root, table)
        self.storage: Storage = storage
        self.root = self.storage.path("tables", table)
        self._manifest: TableManifest | None = None

    # -- paths -------------------------------------------------------------------------------

    @property
    def manifest_path(self) -> str:
        return f"{self.root}/table.json"

    def commit_path(self, batch_id: int) -> str:
        return f"{self.root}/commits/{batch_id:020d}.json"

    def segment_path(self, partition: int, batch_id: int, attempt: int = 0) -> str:
        """Where the segment of ``partition`` in ``batch_id`` is, as written by the batch's
        write ``attempt`` (:attr:`SegmentInfo.attempt`; a commit record says which)."""
        name = f"{batch_id:020d}.a{attempt}" if attempt else f"{batch_id:020d}"
        return f"{self.root}/segments/{partition:05d}/{name}.arrow"

    def committed_segment_path(self, record: CommitRecord, partition: int) -> str:
        """The file of ``partition``'s segment that ``record`` lists (it must list one)."""
        return self.segment_path(partition, record.batch_id, record.segments[partition].attempt)

    # -- manifest ------------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.storage.exists(self.manifest_path)

    def manifest(self) -> TableManifest:
        """The table's manifest (cached: the layout of a table never changes)."""
        if self._manifest is None:
            try:
                data = self.storage.read_bytes(self.manifest_path)
            except FileNotFoundError:
                raise UnknownStoreError(
                    f"no table {self.table!r} in {self.state_dir!r}; "
                    f"tables there: {list_tables(self.state_dir)}",
                    store=self.table,
                ) from None
            self._manifest = TableManifest.decode(data, self.manifest_path)
        return self._manifest

    # -- commits -----------------------------------------------------------------------------

    def has_commit(self, batch_id: int) -> bool:
        return self.storage.exists(self.commit_path(batch_id))

    def read_commit(self, batch_id: int) -> CommitRecord | None:
        """The commit record of ``batch_id``, or None when that batch is not committed."""
        path = self.commit_path(batch_id)
        try:
            data = self.storage.read_bytes(path)
        except FileNotFoundError:
            return None
        return CommitRecord.decode(data, path)

    def write_commit(self, record: CommitRecord) -> None:
        if self.read_only:
            raise _refusal(self.table, "write", self.commit_path(record.batch_id))
        self.storage.write_atomic(self.commit_path(record.batch_id), record.encode())

    def committed_batch_ids(self) -> list[int]:
        """Every committed batch id, ascending (lists the commits directory)."""
        names = self.storage.list_names(f"{self.root}/commits")
        return sorted(int(m[1]) for n in names if (m := _COMMIT_NAME.match(n)))

    def commits_after(self, batch_id: int) -> Iterator[CommitRecord]:
        """Committed batches after ``batch_id``, in order, up to the first one missing.

        Spark numbers micro-batches consecutively and the sink commits every one, so the
        next batch is found by probing its file name, which is cheap enough to poll. A batch
        missing below later ones was deleted by retention; replicas then restore from a
        snapshot (see :mod:`sparkiq.changelog.replica`).
        """
        next_id = batch_id + 1
        while True:
            record = self.read_commit(next_id)
            if record is None:
                return
            yield record
            next_id += 1

    # -- segments ----------------------------------------------------------------------------

    def write_segment(
        self, partition: int, batch_id: int, changes: dict[bytes, bytes | None]
    ) -> SegmentInfo:
        if self.read_only:
            raise _refusal(self.table, "write", self.segment_path(partition, batch_id))
        return write_segment(
            self.storage,
            self.segment_path(partition, batch_id),
            self.table,
            partition,
            batch_id,
            changes,
        )

    def write_segment_arrays(
        self, partition: int, batch_id: int, keys: pa.Array, values: pa.Array, attempt: int = 0
    ) -> SegmentInfo:
        """:meth:`write_segment` of changes given as parallel binary arrays (a null value
        deletes its key; of several rows with one key the last wins), as the batch's write
        ``attempt`` (its file name: :meth:`segment_path`)."""
        path = self.segment_path(partition, batch_id, attempt)
        if self.read_only:
            raise _refusal(self.table, "write", path)
        info = write_segment_arrays(
            self.storage, path, self.table, partition, batch_id, keys, values
        )
        return replace(info, attempt=attempt)

    def read_segment(
        self, record: CommitRecord, partition: int
    ) -> tuple[list[bytes], list[bytes | None]]:
        """The verified changes of ``partition`` in a committed batch (empty if none)."""
        info = record.segments.get(partition)
        if info is None:
            return [], []
        return read_segment(
            self.storage,
            self.committed_segment_path(record, partition),
            info,
            self.table,
            record.batch_id,
        )

    def read_segment_arrays(
        self, record: CommitRecord, partition: int
    ) -> tuple[pa.Array, pa.Array]:
        """:meth:`read_segment` as binary arrays, as the segment holds them."""
        info = record.segments.get(partition)
        if info is None:
            return pa.array([], pa.binary()), pa.array([], pa.binary())
        return read_segment_arrays(
            self.storage,
            self.committed_segment_path(record, partition),
            info,
            self.table,
            record.batch_id,
        )
