"""In-memory store: a dict, for tests and small tables. Nothing survives ``close``.

Costs, so that nobody mistakes it for a database:

* ``get`` is a dict lookup under a lock.
* ``apply`` holds the lock while it mutates the dict, so readers wait for a whole batch.
  Ops are validated (and an ``ops`` generator consumed) *before* the first mutation, which
  is what makes ``apply`` all-or-nothing.
* ``range`` needs the keys in sorted order. The sorted key list is rebuilt lazily, on the
  first ``range`` after an ``apply`` that inserted or deleted keys: O(n log n) then, a
  bisect afterwards. A workload that alternates small writes and ranges over a large
  table pays a full sort per range; use :class:`~sparkiq.stores.RocksDBStore` there.
* The snapshot a ``range`` reads is a list of the matching ``(key, value)`` pairs copied
  under the lock when ``range`` is called: O(matching rows) time and memory up front,
  however few of them the caller then consumes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from sparkiq.stores.base import (
    RESERVED_PREFIX,
    StoreIterator,
    _closed_error,
    _invalid_op,
    _iterator_closed_error,
    _reserved_key,
    _StoreBase,
)

__all__ = ["MemoryStore"]


class MemoryStore(_StoreBase["_MemoryIterator"]):
    """A :class:`~sparkiq.stores.Store` kept in a dict; see the module docstring for costs."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[bytes, bytes] = {}
        # Sorted keys of _data, or None when an apply inserted or deleted keys since.
        self._sorted: list[bytes] | None = []
        self._meta: bytes | None = None

    def __repr__(self) -> str:
        return f"<MemoryStore at {id(self):#x}>"

    @property
    def path(self) -> Path | None:
        return None

    def get(self, key: bytes) -> bytes | None:
        if key >= RESERVED_PREFIX:
            raise _reserved_key(key)
        with self._lock:
            if self._closed:
                raise _closed_error(self)
            return self._data.get(key)

    def _snapshot(self, lo: bytes, hi: bytes, reverse: bool) -> _MemoryIterator:
        keys = self._sorted
        if keys is None:
            keys = self._sorted = sorted(self._data)
        start, stop = bisect_left(keys, lo), bisect_left(keys, hi)
        data = self._data
        rows = [(key, data[key]) for key in keys[start:stop]]
        return _MemoryIterator(self, rows[::-1] if reverse else rows, self._meta)

    def _write(
        self, ops: Iterable[tuple[bytes, bytes | None]], meta: bytes, replace_all: bool
    ) -> None:
        staged = list(ops)
        has_deletes = False
        for key, value in staged:
            if key.__class__ is not bytes or key >= RESERVED_PREFIX:
                raise _invalid_op(key, value)
            if value is None:
                has_deletes = True
            elif value.__class__ is not bytes:
                raise _invalid_op(key, value)
        with self._lock:
            if self._closed:
                raise _closed_error(self)
            if replace_all:
                self._data = {}
            data = self._data
            size = len(data)
            for key, value in staged:
                if value is None:
                    data.pop(key, None)
                else:
                    data[key] = value
            self._meta = meta
            # Without deletes, the key set changed exactly when the dict grew.
            if replace_all or has_deletes or len(data) != size:
                self._sorted = None

    def meta(self) -> bytes | None:
        with self._lock:
            if self._closed:
                raise _closed_error(self)
            return self._meta

    def approximate_count(self) -> int:
        """The exact number of keys."""
        with self._lock:
            if self._closed:
                raise _closed_error(self)
            return len(self._data)

    def _release(self) -> None:
        self._data, self._sorted, self._meta = {}, None, None

    def destroy(self) -> None:
        """Same as :meth:`close`: a memory store has no files."""
        self.close()


class _MemoryIterator(StoreIterator):
    """A :class:`~sparkiq.stores.StoreIterator` over rows copied when ``range`` ran."""

    __slots__ = ("__weakref__", "_meta", "_rows", "_store")

    def __init__(self, store: MemoryStore, rows: list[tuple[bytes, bytes]], meta: bytes | None):
        self._store = store
        self._rows: Iterator[tuple[bytes, bytes]] | None = iter(rows)
        self._meta = meta

    @property
    def meta(self) -> bytes | None:
        return self._meta

    def __next__(self) -> tuple[bytes, bytes]:
        rows = self._rows
        if rows is None:
            raise _iterator_closed_error(self._store)
        return next(rows)

    def next_chunk(self, size: int) -> list[tuple[bytes, bytes]]:
        rows = self._rows
        if rows is None:
            raise _iterator_closed_error(self._store)
        return list(islice(rows, size))

    def close(self) -> None:
        self._rows = None
