"""The contract every partition store fulfils.

A store holds ONE partition of one materialized table on one replica. It knows nothing
about schemas: keys and values are opaque ``bytes`` produced by the encoding layer, plus one
opaque ``meta`` blob (the replica's serialized position in the changelog) that changes
atomically with the data. Two implementations exist, and one contract test suite
(``tests/stores/test_store_contract.py``) runs against both:

* :class:`~sparkiq.stores.MemoryStore` - a dict, for tests and small tables;
* :class:`~sparkiq.stores.RocksDBStore` - one RocksDB database per partition directory.

Key space
    Keys are compared as unsigned bytes, lexicographically (Python's ``bytes`` order), and
    every result is in that order. Encoded keys always start with ``0x00`` or ``0x01``; keys
    starting with :data:`RESERVED_PREFIX` (``0xFF``) belong to the store itself (RocksDB keeps
    ``meta`` there) and are rejected with :class:`~sparkiq.errors.ConfigError` by ``get`` and
    ``apply``. Range bounds may lie anywhere; the reserved space is simply never returned.

Thread safety
    Any number of threads may call ``get``, ``range``, ``meta`` and ``approximate_count`` and
    iterate *their own* iterators while one other thread calls ``apply``. A single iterator
    must not be advanced by two threads at once. Two concurrent ``apply`` calls are not
    supported (the replica has one writer per partition). ``close`` may come from any thread:
    a call racing with it either completes or raises :class:`~sparkiq.errors.StoreError`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar, runtime_checkable

from sparkiq.errors import ConfigError, StoreError

__all__ = ["RESERVED_PREFIX", "PairsIterator", "Store", "StoreIterator"]

#: First byte of keys a store keeps for itself. Encoded keys start with 0x00 or 0x01, so
#: every data key sorts strictly below this one-byte string.
RESERVED_PREFIX = b"\xff"


@runtime_checkable
class StoreIterator(Protocol):
    """``(key, value)`` pairs of one :meth:`Store.range` call, read from one snapshot.

    The snapshot is taken when ``range`` is called: writes applied afterwards are never
    seen, and :attr:`meta` is the meta blob of that same snapshot, so the pairs are exactly
    the partition's content at that position.

    The iterator is single-pass. It holds resources (a copy of the rows for the memory
    store; pinned memtables and files for RocksDB) until it is exhausted, closed, or its
    store is closed - so close it promptly, preferably with ``with``. ``close`` is
    idempotent. Calling ``next`` on a closed iterator (closed by ``close``, by the ``with``
    block, or because its store was closed) raises :class:`~sparkiq.errors.StoreError`; an
    iterator that was merely exhausted keeps raising ``StopIteration``.

    An implementation may subclass this protocol to inherit ``__iter__``, ``__enter__`` and
    ``__exit__`` (``__exit__`` calls ``close``), as the built-in stores do.
    """

    __slots__ = ()

    @property
    def meta(self) -> bytes | None:
        """The store's meta blob as of this iterator's snapshot; ``None`` if never set."""
        ...

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> tuple[bytes, bytes]: ...

    def next_chunk(self, size: int) -> list[tuple[bytes, bytes]]:
        """The next ``size`` pairs (fewer only at the end of the range; ``[]`` after it).

        Equal to ``list(itertools.islice(iterator, size))``, from the same snapshot and
        mixable with ``next``, but a store may read them in bulk: much faster for scans.
        Raises like ``next`` on a closed iterator.
        """
        ...

    def close(self) -> None:
        """Release the snapshot. Idempotent."""
        ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@runtime_checkable
class Store(Protocol):
    """One partition of one table: ordered ``bytes -> bytes`` plus an atomic ``meta`` blob.

    Every method except ``close``, ``destroy`` and ``path`` raises
    :class:`~sparkiq.errors.StoreError` (``"store ... is closed"``) once the store is closed,
    and :class:`~sparkiq.errors.StoreError` for infrastructure faults (I/O errors,
    corruption). See the module docstring for key order and thread safety.
    """

    @property
    def path(self) -> Path | None:
        """Directory holding the store's files; ``None`` for a store without files."""
        ...

    def get(self, key: bytes) -> bytes | None:
        """The value stored under ``key``, or ``None``.

        Reads the latest state published by ``apply``; never a half-applied batch. ``get``
        and :meth:`meta` are two reads: to pair a value with the meta it reflects, use
        ``range(key, key)`` and its iterator's :attr:`StoreIterator.meta`.
        """
        ...

    def range(
        self,
        lower: bytes | None,
        upper: bytes | None,
        *,
        reverse: bool = False,
        upper_exclusive: bool = False,
    ) -> StoreIterator:
        """Pairs with ``lower <= key <= upper`` (``key < upper`` if ``upper_exclusive``).

        ``None`` leaves that side open. Keys ascend bytewise, or descend with ``reverse``.
        The rows and :attr:`StoreIterator.meta` come from one snapshot taken by this call;
        later ``apply`` calls are invisible to the returned iterator. An empty interval
        (``lower > upper``) yields nothing.
        """
        ...

    def apply(
        self,
        ops: Iterable[tuple[bytes, bytes | None]],
        meta: bytes,
        *,
        replace_all: bool = False,
    ) -> None:
        """Atomically apply ``ops`` and set ``meta``.

        Each op is ``(key, value)``; ``value=None`` deletes the key. Ops apply in order, so
        a later op for the same key wins. With ``replace_all`` every existing key is removed
        first, in the same atomic write (a batch that replaces the whole partition).

        Atomic means readers see either all of it, ``meta`` included, or none of it, and a
        crash (even ``SIGKILL``) during ``apply`` leaves the previous state. If ``ops`` is
        invalid (a non-bytes key or value, a key in the reserved space) or raises while
        being consumed, nothing is applied and the error propagates
        (:class:`~sparkiq.errors.ConfigError` for an invalid op).
        """
        ...

    def meta(self) -> bytes | None:
        """The meta blob of the latest ``apply``; ``None`` if ``apply`` never ran."""
        ...

    def approximate_count(self) -> int:
        """Number of keys; exact for :class:`~sparkiq.stores.MemoryStore`, an estimate
        for RocksDB (deletions and overwrites not yet compacted make it drift)."""
        ...

    def close(self) -> None:
        """Release the store and close every iterator it handed out. Idempotent.

        After ``close`` returns, the files (if any) may be opened again by another store.
        """
        ...

    def destroy(self) -> None:
        """Close the store and delete its files (if any). Idempotent."""
        ...


def _closed_error(store: object) -> StoreError:
    return StoreError(f"store {store!r} is closed; open a new store to read it again")


def _iterator_closed_error(store: object) -> StoreError:
    return StoreError(
        f"iterator over store {store!r} is closed (by close(), a with block, or the store "
        "closing); call range() again"
    )


def _invalid_op(key: object, value: object) -> ConfigError:
    """The error for an op that is not ``(bytes, bytes | None)`` outside the reserved space."""
    if not isinstance(key, bytes):
        return ConfigError(f"store keys must be bytes, got {type(key).__name__}: {key!r:.80}")
    if key.startswith(RESERVED_PREFIX):
        return _reserved_key(key)
    return ConfigError(
        f"store values must be bytes or None (delete), got {type(value).__name__} "
        f"for key {key!r:.80}"
    )


def _reserved_key(key: bytes) -> ConfigError:
    return ConfigError(
        f"key {key!r:.80} starts with 0xFF, which stores reserve for themselves; "
        "encoded keys start with 0x00 or 0x01"
    )


def _interval(
    lower: bytes | None, upper: bytes | None, upper_exclusive: bool
) -> tuple[bytes, bytes]:
    """The half-open data-key interval ``[lo, hi)`` equal to a ``range`` call's bounds.

    ``key <= upper`` is ``key < upper + b"\\x00"`` because ``upper + b"\\x00"`` is the
    smallest byte string greater than ``upper``. ``hi`` never exceeds the reserved space.
    """
    lo = b"" if lower is None else lower
    if upper is None:
        hi = RESERVED_PREFIX
    else:
        hi = min(upper if upper_exclusive else upper + b"\x00", RESERVED_PREFIX)
    return lo, hi


_Iterator = TypeVar("_Iterator", bound=StoreIterator)


class _StoreBase(Generic[_Iterator]):
    """What the built-in stores share: the closed flag and the iterators handed out.

    ``range`` takes the snapshot under ``_lock``, so that ``close`` (which sets ``_closed``
    under the same lock) either sees the new iterator and closes it, or the snapshot is
    refused; every iterator a store handed out is therefore closed by its ``close``.
    ``apply`` checks the store is open and ``meta`` is bytes before :meth:`_write` runs.
    Subclasses provide :meth:`_snapshot`, :meth:`_write` and :meth:`_release`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._iterators: weakref.WeakSet[_Iterator] = weakref.WeakSet()

    def range(
        self,
        lower: bytes | None,
        upper: bytes | None,
        *,
        reverse: bool = False,
        upper_exclusive: bool = False,
    ) -> _Iterator:
        lo, hi = _interval(lower, upper, upper_exclusive)
        with self._lock:
            if self._closed:
                raise _closed_error(self)
            iterator = self._snapshot(lo, hi, reverse)
            self._iterators.add(iterator)
        return iterator

    def apply(
        self,
        ops: Iterable[tuple[bytes, bytes | None]],
        meta: bytes,
        *,
        replace_all: bool = False,
    ) -> None:
        if self._closed:
            raise _closed_error(self)
        if meta.__class__ is not bytes:
            raise ConfigError(f"store meta must be bytes, got {type(meta).__name__}")
        self._write(ops, meta, replace_all)

    def close(self) -> None:
        """Close every iterator handed out, then :meth:`_release` the store. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            iterators = list(self._iterators)
        for iterator in iterators:
            iterator.close()
        self._release()

    def _snapshot(self, lo: bytes, hi: bytes, reverse: bool) -> _Iterator:
        """An iterator over the data keys in ``[lo, hi)``; called under ``_lock``."""
        raise NotImplementedError

    def _write(
        self, ops: Iterable[tuple[bytes, bytes | None]], meta: bytes, replace_all: bool
    ) -> None:
        """``apply`` itself, all or nothing; ``ops`` is not validated yet (``_invalid_op``)."""
        raise NotImplementedError

    def _release(self) -> None:
        """Free the store's resources; called once, after every iterator is closed."""
        raise NotImplementedError


class PairsIterator(StoreIterator):
    """A :class:`StoreIterator` over pairs already read (from a version, say)."""

    __slots__ = ("_closed", "_next", "_pairs")

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self._pairs = pairs
        self._next = 0
        self._closed = False

    @property
    def meta(self) -> bytes | None:
        return None

    def __next__(self) -> tuple[bytes, bytes]:
        if self._closed:
            raise StoreError("the iterator is closed")
        if self._next >= len(self._pairs):
            raise StopIteration
        self._next += 1
        return self._pairs[self._next - 1]

    def next_chunk(self, size: int) -> list[tuple[bytes, bytes]]:
        if self._closed:
            raise StoreError("the iterator is closed")
        chunk = self._pairs[self._next : self._next + size]
        self._next += len(chunk)
        return chunk

    def close(self) -> None:
        self._closed = True
        self._pairs = []
