"""RocksDB store: one RocksDB database per partition directory, through rocksdict.

On-disk layout, format version 1 (:data:`FORMAT_VERSION`)
    ``<path>/`` holds one RocksDB database with only the default column family, plus the
    ``rocksdict-config.json`` that rocksdict writes. Keys are compared bytewise (RocksDB's
    default comparator).

    * data keys - every key below ``0xFF``: an encoded key, mapped to an encoded row;
    * :data:`META_KEY` (``b"\\xff\\x00sparkiq.meta"``) - the meta blob. ``apply`` writes it
      in the same ``WriteBatch`` as the data, and ``range`` reads it through the same
      iterator as the rows, so data and meta can never disagree;
    * :data:`FORMAT_KEY` (``b"\\xff\\x00sparkiq.format"``) - ``b"1"``, written when the
      database is created. A store refuses a database with another version.

    ``replace_all`` is a ``DeleteRange`` over ``[b"", b"\\xff")`` at the head of the batch,
    so it never touches the reserved keys.

Durability
    Writes go through the write-ahead log without ``fsync``: an applied batch survives the
    process being killed (``SIGKILL`` included), and WAL recovery in point-in-time mode
    leaves exactly the batches whose records are complete - every state after a crash is
    one that ``apply`` published. Surviving power loss needs :meth:`RocksDBStore.flush`.

Tuning
    In :mod:`sparkiq.stores.rocksdb_options`: one block cache and one memtable budget shared
    by every store in the process (:data:`BLOCK_CACHE_BYTES`, :data:`MEMTABLE_BUDGET_BYTES`).

A failed write
    RocksDB refuses every write after one failed (a full disk, an I/O error) until the
    database is opened again; the next ``apply`` reopens it (:meth:`RocksDBStore._reopen`).

rocksdict pitfalls (0.3.29) this module works around
    ``Snapshot.iter`` / ``Snapshot.items`` ignore the snapshot, and
    ``ReadOptions.set_iterate_lower_bound`` sets the *upper* bound. A RocksDB iterator
    created without an explicit snapshot reads an implicit one taken at its creation, so
    ``range`` uses one plain iterator for both meta and rows, and checks bounds itself.
    ``RdictItems`` stops silently on an I/O error or corruption (it never checks the
    iterator's status), so ranges drive ``RdictIter`` and check ``status()`` at the end.
    ``ReadOptions`` iterate bounds point into memory rocksdict has already freed (0.3.27
    source), so no bound is ever set on a RocksDB iterator. ``Rdict`` replaces the default
    column family's options by those it finds in the database's OPTIONS file unless they
    are passed explicitly, which would drop the shared cache; they are passed explicitly.

Bulk reads (``next_chunk``)
    Driving ``RdictIter`` costs several native calls per row; ``RdictItems`` reads a row in
    one. A forward iterator's ``next_chunk`` therefore switches to an ``Rdict.items``
    iterator opened at its current key, and keeps the guarantees above:

    * same snapshot - the store's latest sequence number is read before the range's
      iterator is created and again after the items iterator is: if it did not move, no
      write was published in between and both read the same implicit snapshot; if it did,
      ``next_chunk`` stays on the range's own iterator, row by row;
    * bounds - rows are read in chunks that grow from :data:`_FIRST_CHUNK` rows (so a short
      range reads few rows beyond its end) and cut at the upper bound by bisection. The
      reserved keys (at least ``FORMAT_KEY``) lie above every bound, so a healthy scan
      always meets a key past its end;
    * errors - an items iterator that stops before such a key was stopped by an error: the
      range's own iterator (same snapshot) is positioned after the last row read and its
      ``status()`` raises it, or a :class:`~sparkiq.errors.StoreError` says the scan stopped
      early.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from bisect import bisect_left
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

from rocksdict import AccessType, DbClosedError, Rdict, WriteBatch

from sparkiq.errors import StoreError
from sparkiq.stores.base import (
    RESERVED_PREFIX,
    StoreIterator,
    _closed_error,
    _invalid_op,
    _iterator_closed_error,
    _reserved_key,
    _StoreBase,
)
from sparkiq.stores.rocksdb_options import (
    BLOCK_CACHE_BYTES,
    MEMTABLE_BUDGET_BYTES,
    rocksdb_memory,
    store_options,
)

__all__ = [
    "BLOCK_CACHE_BYTES",
    "FORMAT_KEY",
    "FORMAT_VERSION",
    "MEMTABLE_BUDGET_BYTES",
    "META_KEY",
    "RocksDBStore",
    "rocksdb_memory",
]

FORMAT_VERSION = 1
#: Reserved key holding the meta blob (the replica's position), written with the data.
META_KEY = RESERVED_PREFIX + b"\x00sparkiq.meta"
#: Reserved key holding the store format version as ASCII digits.
FORMAT_KEY = RESERVED_PREFIX + b"\x00sparkiq.format"

#: Free bytes a full disk needs before a store whose write failed is opened again: room for
#: the files RocksDB writes when it opens (a manifest, its options, a new log: tens of KB)
#: and a batch. Less, and the reopen would fail and take reads down with it.
_ROOM_TO_REOPEN = 1 << 20

#: Rows of the first bulk read of a range, then doubled on each read up to _MAX_CHUNK.
_FIRST_CHUNK = 32
_MAX_CHUNK = 8192
_key_of = itemgetter(0)

_CORRUPTION_HINT = "delete the directory (the local replica) and it is rebuilt from the changelog"
# Files RocksDB and rocksdict create; a directory without CURRENT holding anything else is
# not a half-created database but someone else's files, and we do not create one there.
_OWN_FILE = re.compile(
    r"LOCK|LOG(\.old\.\d+)?|IDENTITY|MANIFEST-\d+|OPTIONS-\d+(\.dbtmp)?"
    r"|\d+\.(log|sst|dbtmp)|rocksdict-config\.json"
)


class RocksDBStore(_StoreBase["_RocksDBIterator"]):
    """A :class:`~sparkiq.stores.Store` in the RocksDB database at ``path``.

    The directory is created if missing (unless ``read_only``). Only one read-write store
    may have a directory open at a time, across processes; read-only stores see the
    database as of their opening and reject ``apply``.

    Raises :class:`~sparkiq.errors.StoreError`, naming ``path``, if the directory holds
    something other than a RocksDB database of this format, or is corrupted - then delete
    the directory and the replica is rebuilt from the changelog - or is locked by another
    open store.
    """

    def __init__(self, path: str | os.PathLike[str], *, read_only: bool = False) -> None:
        super().__init__()
        self._path = Path(path)
        self._read_only = read_only
        #: Why the last write failed, until the database is opened again (:meth:`_reopen`).
        self._failed_write: str | None = None
        self._reopening = False  # set under _lock while _reopen swaps the database
        self._check_directory()
        self._db = self._open()

    def _open(self) -> Rdict:
        options = store_options(create=not self._read_only)
        access = AccessType.read_only(False) if self._read_only else AccessType.read_write()
        try:
            db = Rdict(
                str(self._path),
                options,
                column_families={"default": options},
                access_type=access,
            )
        except Exception as exc:
            raise self._open_error(exc) from exc
        try:
            self._check_format(db)
        except StoreError:
            db.close()
            raise
        except Exception as exc:
            db.close()
            raise self._fault(exc) from exc
        return db

    def __repr__(self) -> str:
        return f"RocksDBStore({str(self._path)!r})"

    @property
    def path(self) -> Path:
        return self._path

    @property
    def read_only(self) -> bool:
        return self._read_only

    def get(self, key: bytes) -> bytes | None:
        if key >= RESERVED_PREFIX:
            raise _reserved_key(key)
        # The hot path: ``_native_errors`` inline, without the cost of a context manager.
        db = self._db
        try:
            value: bytes | None = db.get(key)
        except DbClosedError:
            return self._get_reopened(key)
        except Exception as exc:
            # Met _reopen closing it (rocksdict: "Already mutably borrowed").
            if self._reopening or db is not self._db:
                return self._get_reopened(key)
            raise self._fault(exc) from exc
        return value

    def _get_reopened(self, key: bytes) -> bytes | None:
        """A get that found the database closed, or closing: by :meth:`close` (an error), or
        by :meth:`_reopen`, which holds ``_lock`` until the new one is open (read that)."""
        with self._lock:
            if self._closed:
                raise _closed_error(self) from None
            db = self._db
        try:
            value: bytes | None = db.get(key)
        except DbClosedError:  # the reopen failed: the next write tries again
            raise self._fault(
                RuntimeError(
                    f"closed to be opened again after a failed write and not open yet "
                    f"({self._failed_write})"
                )
            ) from None
        except Exception as exc:
            raise self._fault(exc) from exc
        return value

    def _snapshot(self, lo: bytes, hi: bytes, reverse: bool) -> _RocksDBIterator:
        # Inline rather than ``_native_errors``: a context manager costs about 10% of a
        # short range.
        try:
            sequence = self._db.latest_sequence_number()  # before the snapshot: bulk reads
            return _RocksDBIterator(self, self._db.iter(), lo, hi, reverse, sequence)
        except DbClosedError:
            raise _closed_error(self) from None
        except Exception as exc:
            raise self._fault(exc) from exc

    def _write(
        self, ops: Iterable[tuple[bytes, bytes | None]], meta: bytes, replace_all: bool
    ) -> None:
        if self._read_only:
            raise StoreError(f"store {self!r} is open read-only; apply needs a read-write open")
        batch = WriteBatch(raw_mode=True)
        if replace_all:
            batch.delete_range(b"", RESERVED_PREFIX)
        put, delete = batch.put, batch.delete
        for key, value in ops:
            if key.__class__ is not bytes or key >= RESERVED_PREFIX:
                raise _invalid_op(key, value)
            if value is None:
                delete(key)
            elif value.__class__ is bytes:
                put(key, value)
            else:
                raise _invalid_op(key, value)
        put(META_KEY, meta)
        if self._failed_write is not None:
            self._reopen()
        try:
            self._db.write(batch)
        except DbClosedError:
            raise _closed_error(self) from None
        except Exception as exc:
            self._failed_write = str(exc)
            raise self._fault(exc) from exc

    def _reopen(self) -> None:
        """Open the database again after a write failed.

        After a failed write (a full disk, an I/O error) RocksDB refuses every later one
        until ``DB::Resume``, which rocksdict does not expose, or a reopen; it does not
        resume by itself on a disk that has room again (only when it happens to start a new
        log file). Reads go on meanwhile. The database is reopened only once its disk has
        :data:`_ROOM_TO_REOPEN`: a reopen on a full disk fails, and reads would fail with it.
        Iterators handed out are closed, as by :meth:`close`: they hold the old database, its
        files and its lock. Reopening replays the log, which holds exactly the batches whose
        records are complete (module docstring, Durability).
        """
        free = shutil.disk_usage(self._path).free
        if free < _ROOM_TO_REOPEN:
            # The same words each time (not the bytes free): the replica logs a new message.
            raise StoreError(
                f"RocksDB store at '{self._path}' is on a disk with less than "
                f"{_ROOM_TO_REOPEN >> 20} MiB free after a write failed ({self._failed_write}); "
                "it writes again once the disk has room"
            )
        # Under _lock (which also guards _db here): range() and _get_reopened() wait for the
        # new database rather than find the old one closed.
        with self._lock:
            if self._closed:
                raise _closed_error(self)
            for iterator in list(self._iterators):
                iterator.close()
            self._reopening = True
            try:
                # Closing flushes the memtables, which fails with the write's error ("Writer
                # has previous error") and closes the database all the same; what it did not
                # flush, the log replays on the open.
                with contextlib.suppress(Exception):
                    self._db.close()
                self._db = self._open()  # raises: still closed; the next write tries again
                self._failed_write = None
            finally:
                self._reopening = False

    def meta(self) -> bytes | None:
        with self._native_errors():
            meta: bytes | None = self._db.get(META_KEY)
        return meta

    def approximate_count(self) -> int:
        """RocksDB's ``rocksdb.estimate-num-keys`` minus the reserved keys.

        Exact after inserts of distinct keys; overwrites, deletions and ``replace_all``
        make it drift until compaction.
        """
        with self._native_errors():
            estimate = self._db.property_int_value("rocksdb.estimate-num-keys") or 0
            reserved = sum(1 for _ in self._db.keys(from_key=RESERVED_PREFIX))
        return max(0, int(estimate) - reserved)

    def flush(self) -> None:
        """Write memtables to table files and sync the WAL: applied batches then survive
        power loss, not only a process crash. A no-op for a read-only store."""
        if self._closed:
            raise _closed_error(self)
        if self._read_only:
            return
        with self._native_errors():
            self._db.flush_wal(True)
            self._db.flush(True)

    def _release(self) -> None:
        """Flush memtables (read-write) and release the database.

        ``close`` has closed the iterators first: they hold a reference to the database, and
        its files would stay locked until the last one is garbage-collected.
        """
        try:
            self._db.close()
        except Exception as exc:
            raise self._fault(exc) from exc

    def destroy(self) -> None:
        """Close the store and delete its directory. Refused for a read-only store."""
        if self._read_only:
            raise StoreError(f"store {self!r} is open read-only; it cannot be destroyed")
        self.close()
        shutil.rmtree(self._path, ignore_errors=True)

    # -- errors and checks -------------------------------------------------------------

    @contextmanager
    def _native_errors(self) -> Iterator[None]:
        """Turn rocksdict's errors inside the block into :class:`StoreError`: "closed" for a
        closed database, else a fault naming the path. Wrap only native calls in it."""
        try:
            yield
        except DbClosedError:
            raise _closed_error(self) from None
        except Exception as exc:
            raise self._fault(exc) from exc

    def _check_directory(self) -> None:
        path = self._path
        if path.exists() and not path.is_dir():
            raise StoreError(
                f"RocksDB store path '{path}' is not a directory; remove it or choose "
                "another state directory"
            )
        if (path / "CURRENT").exists():
            return
        if self._read_only:
            raise StoreError(f"no RocksDB database at '{path}' to open read-only")
        strangers = sorted(
            entry.name
            for entry in (path.iterdir() if path.exists() else ())
            if not _OWN_FILE.fullmatch(entry.name)
        )
        if strangers:
            raise StoreError(
                f"'{path}' is not a RocksDB database (no CURRENT file) and holds other files "
                f"({', '.join(strangers[:5])}); refusing to create a store there. If it is "
                f"a damaged replica, {_CORRUPTION_HINT}."
            )

    def _check_format(self, db: Rdict) -> None:
        found = db.get(FORMAT_KEY)
        expected = str(FORMAT_VERSION).encode()
        if found is None and not self._read_only and next(db.keys(), None) is None:
            db.put(FORMAT_KEY, expected)  # a new database
            return
        if found != expected:
            raise StoreError(
                f"RocksDB store at '{self._path}' has store format {found!r}, this sparkiq "
                f"reads {expected!r}; {_CORRUPTION_HINT}."
            )

    def _open_error(self, exc: Exception) -> StoreError:
        message = str(exc)
        if "lock" in message.lower():
            return StoreError(
                f"RocksDB store at '{self._path}' is already open (by this or another "
                f"process): {message}. Close the other store first."
            )
        return StoreError(
            f"cannot open RocksDB store at '{self._path}': {message}. If its files are "
            f"corrupted or not a RocksDB database, {_CORRUPTION_HINT}."
        )

    def _fault(self, exc: Exception) -> StoreError:
        message = str(exc)
        hint = (
            f" If its files are corrupted, {_CORRUPTION_HINT}." if "Corruption" in message else ""
        )
        return StoreError(f"RocksDB store at '{self._path}' failed: {message}.{hint}")


class _RocksDBIterator(StoreIterator):
    """A :class:`~sparkiq.stores.StoreIterator` over one RocksDB iterator.

    The native iterator reads an implicit snapshot taken when it was created; the meta is
    read through it first, then it is positioned on the range. It pins memtables and table
    files until released (exhausted, closed, or its store closed). Once ``next_chunk``
    switched to bulk reads (module docstring), ``_bulk`` yields the rows, ``_native`` is
    None and ``_check`` keeps the native iterator for the final status check.
    """

    __slots__ = (
        "__weakref__",
        "_bulk",
        "_check",
        "_closed",
        "_hi",
        "_lo",
        "_meta",
        "_native",
        "_resume",
        "_reverse",
        "_sequence",
        "_step",
        "_store",
    )

    def __init__(
        self,
        store: RocksDBStore,
        native: Any,
        lo: bytes,
        hi: bytes,
        reverse: bool,
        sequence: int,
    ) -> None:
        self._store = store
        self._lo, self._hi, self._reverse = lo, hi, reverse
        self._sequence = sequence
        self._closed = False
        self._bulk: Any = None
        self._check: Any = None
        self._resume = b""  # where the rows not yet returned by bulk reads start
        self._step = _FIRST_CHUNK
        native.seek(META_KEY)
        self._meta: bytes | None = (
            native.value() if native.valid() and native.key() == META_KEY else None
        )
        native.status()
        self._native: Any = native
        if lo >= hi:
            self._native = None
        elif reverse:
            native.seek_for_prev(hi)  # the last key <= hi; hi itself is excluded
            if native.valid() and native.key() >= hi:
                native.prev()
        else:
            native.seek(lo)

    @property
    def meta(self) -> bytes | None:
        return self._meta

    def __next__(self) -> tuple[bytes, bytes]:
        native = self._native
        if native is None:
            if self._bulk is not None:
                chunk = self._next_bulk(1)
                if chunk:
                    return chunk[0]
            if self._closed:
                raise _iterator_closed_error(self._store)
            raise StopIteration
        try:
            if native.valid():
                key: bytes = native.key()
                if self._reverse:
                    if key >= self._lo:
                        value: bytes = native.value()
                        native.prev()
                        return key, value
                elif key < self._hi:
                    value = native.value()
                    native.next()
                    return key, value
            else:
                native.status()  # raises on I/O error or corruption
        except Exception as exc:
            self._native = None
            raise self._store._fault(exc) from exc
        self._native = None  # exhausted: release the snapshot now
        raise StopIteration

    def next_chunk(self, size: int) -> list[tuple[bytes, bytes]]:
        if self._bulk is None and not self._start_bulk():
            return list(islice(self, size))
        return self._next_bulk(size)

    def _start_bulk(self) -> bool:
        """Switch to an items iterator at the current row if it reads the same snapshot."""
        native = self._native
        if native is None or self._reverse:
            return False
        try:
            if not native.valid():
                return False  # at the end, or an error that ``next`` reports
            start: bytes = native.key()
            if start >= self._hi:
                return False
            bulk = self._store._db.items(from_key=start)
            if self._store._db.latest_sequence_number() != self._sequence:
                return False  # a write came in between: stay on our own snapshot
        except DbClosedError:
            return False  # ``next`` reports a closed store
        except Exception as exc:
            self._native = None
            raise self._store._fault(exc) from exc
        self._bulk, self._check, self._native = bulk, native, None
        self._resume = start
        return True

    def _next_bulk(self, size: int) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        hi = self._hi
        while len(out) < size:
            bulk = self._bulk
            if bulk is None:
                if self._closed:
                    raise _iterator_closed_error(self._store)
                break
            want = min(size - len(out), self._step)
            self._step = min(self._step * 2, _MAX_CHUNK)
            try:
                chunk: list[tuple[bytes, bytes]] = list(islice(bulk, want))
            except Exception as exc:
                self._release()
                raise self._store._fault(exc) from exc
            if chunk and chunk[-1][0] < hi:
                self._resume = chunk[-1][0] + b"\x00"
                out.extend(chunk)
                if len(chunk) < want:
                    self._end_early()
            elif chunk:
                out.extend(chunk[: bisect_left(chunk, hi, key=_key_of)])
                self._release()  # the range ends in this chunk
            else:
                self._end_early()
        return out

    def _end_early(self) -> None:
        """The items iterator ended with no key at or past the range's end, which a healthy
        store always has (the reserved keys): raise the error that stopped it."""
        check = self._check
        self._release()
        if check is None:
            raise _iterator_closed_error(self._store)
        try:
            check.seek(self._resume)
            stopped = check.valid() and check.key() < self._hi
            check.status()  # raises the I/O error or corruption that stopped the scan
        except Exception as exc:
            raise self._store._fault(exc) from exc
        if stopped:
            raise self._store._fault(
                RuntimeError(f"a scan stopped early before key {self._resume!r:.80}")
            )

    def _release(self) -> None:
        self._native = self._bulk = self._check = None

    def close(self) -> None:
        self._closed = True
        self._release()
