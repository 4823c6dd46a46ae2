"""Finding a partition's versioned rows by key without comparing every key: sorted key hashes.

:class:`~sparkiq.stores.versions.VersionedRows` keeps a partition's rows in Arrow chunks,
one per applied batch (merged now and then). Two structures find rows there by key:

* :class:`ChunkKeys`, one per chunk (immutable, read by any thread): the hashes of the
  chunk's keys, sorted, and the row of each. A read of one key at a past batch bisects each
  chunk instead of comparing the key with every row of the partition.
* :class:`CurrentKeys`, the writer's own: the hash of every *current* key, sorted, and where
  its current row lies (chunk serial and row, packed by :func:`location`). Applying a batch
  finds the rows it replaces with one ``searchsorted`` of the batch's sorted hashes, instead
  of matching the batch's keys against every chunk; the cost is a copy of these two vectors
  (16 bytes per key) per batch that inserts keys. A deleted key keeps its entry with
  location :data:`DELETED` (removing it would copy both vectors again) until the index is
  rebuilt, when chunks merge.

**Hashes** are Python's ``hash`` of the key bytes (SipHash, seeded per process), computed by
``map`` in C: nothing here is persisted, so the seed never has to agree with anything. Two
different keys can share a hash. :class:`ChunkKeys` answers every candidate row and the
caller compares the key bytes; :class:`CurrentKeys` holds one entry per hash, so the writer
checks each match against the key bytes and, on a collision, raises :class:`HashCollision`
before changing anything, then drops the index and matches keys by value from then on.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress

import numpy as np

from sparkiq.errors import StoreError

__all__ = [
    "DELETED",
    "ChunkKeys",
    "CurrentKeys",
    "HashCollision",
    "key_hash",
    "key_hashes",
    "last_write_wins",
    "location",
    "split_locations",
]

_ROW_BITS = 32
_ROW_MASK = (1 << _ROW_BITS) - 1
#: The location of a key deleted since :class:`CurrentKeys` was built.
DELETED = -1


class HashCollision(StoreError):
    """Two different keys share a hash: :class:`CurrentKeys` cannot tell them apart."""

    def __init__(self, message: str = "two different keys share a hash") -> None:
        super().__init__(message)


_hash = hash  # a module global, so that a test can make keys collide


def key_hash(key: bytes) -> int:
    """The hash of one key (as :func:`key_hashes`)."""
    return _hash(key)


def key_hashes(keys: Sequence[bytes]) -> np.ndarray:
    """The int64 hash of each key (no Python bytecode per key: ``map`` over ``hash``)."""
    return np.fromiter(map(_hash, keys), np.int64, len(keys))


def location(serial: int, rows: np.ndarray) -> np.ndarray:
    """The packed locations of ``rows`` (row numbers) of the chunk numbered ``serial``."""
    return (np.int64(serial) << _ROW_BITS) | rows.astype(np.int64)


def split_locations(locations: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``(chunk serial, rows, indexes into locations)`` for each chunk ``locations`` name."""
    if not locations.size:
        return []
    serials = locations >> _ROW_BITS
    low = int(serials.min())
    if int(serials.max()) - low < 1 << 16:  # a few chunks: a radix sort of small ints
        order = np.argsort((serials - low).astype(np.uint16), kind="stable")
    else:
        order = np.argsort(serials)
    cuts = np.flatnonzero(np.diff(serials[order])) + 1
    return [
        (int(serials[part[0]]), locations[part] & _ROW_MASK, part) for part in np.split(order, cuts)
    ]


class ChunkKeys:
    """The sorted key hashes of one chunk and the row of each (immutable)."""

    __slots__ = ("hashes", "rows")

    def __init__(self, hashes: np.ndarray, rows: np.ndarray) -> None:
        #: int64, ascending
        self.hashes = hashes
        #: int32 (a chunk's binary key column cannot hold 2**31 rows): rows[i] has hashes[i]
        self.rows = rows

    @staticmethod
    def of(aligned: np.ndarray) -> ChunkKeys:
        """From the hash of each row, in row order."""
        order = np.argsort(aligned, kind="stable")
        return ChunkKeys(aligned[order], order.astype(np.int32))

    def candidates(self, key_hash: int) -> np.ndarray:
        """The rows whose key has ``key_hash`` (usually one or none)."""
        hashes = self.hashes
        start = int(hashes.searchsorted(key_hash))
        if start == len(hashes) or hashes[start] != key_hash:
            return self.rows[:0]
        return self.rows[start : int(hashes.searchsorted(key_hash, side="right"))]

    def aligned(self) -> np.ndarray:
        """The hash of each row, in row order."""
        out = np.empty_like(self.hashes)
        out[self.rows] = self.hashes
        return out

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.rows.nbytes)


class CurrentKeys:
    """The writer's index of the current keys: hash -> location of the current row
    (:data:`DELETED`: none).

    One writer thread owns it; no reader touches it. ``hashes`` is ascending and unique.
    """

    __slots__ = ("hashes", "locations")

    def __init__(self, hashes: np.ndarray, locations: np.ndarray) -> None:
        self.hashes = hashes
        self.locations = locations

    @staticmethod
    def empty() -> CurrentKeys:
        return CurrentKeys(np.empty(0, np.int64), np.empty(0, np.int64))

    @staticmethod
    def build(hashes: np.ndarray, locations: np.ndarray) -> CurrentKeys:
        """From unordered entries; :class:`HashCollision` if two share a hash (the entries
        are distinct keys, so that is a collision)."""
        order = np.argsort(hashes, kind="stable")
        sorted_hashes = hashes[order]
        if sorted_hashes.size > 1 and bool((sorted_hashes[1:] == sorted_hashes[:-1]).any()):
            raise HashCollision
        return CurrentKeys(sorted_hashes, locations[order])

    def find(self, sorted_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(positions, found)`` of ascending ``sorted_hashes``: ``found[i]`` says entry
        ``positions[i]`` has hash ``sorted_hashes[i]`` (else it is where it would go); a
        found entry's location may be :data:`DELETED`."""
        hashes = self.hashes
        positions = np.searchsorted(hashes, sorted_hashes)
        found = positions < len(hashes)
        found[found] = hashes[positions[found]] == sorted_hashes[found]
        return positions, found

    def edit(
        self,
        update: np.ndarray,
        update_locations: np.ndarray,
        remove: np.ndarray,
        insert_hashes: np.ndarray,
        insert_locations: np.ndarray,
    ) -> None:
        """Move entries ``update`` (positions) to ``update_locations``, mark entries
        ``remove`` deleted, then add entries for ``insert_hashes`` (ascending, none
        present)."""
        self.locations[update] = update_locations
        self.locations[remove] = DELETED
        if insert_hashes.size:
            at = np.searchsorted(self.hashes, insert_hashes)
            self.hashes = np.insert(self.hashes, at, insert_hashes)
            self.locations = np.insert(self.locations, at, insert_locations)

    def __len__(self) -> int:
        return len(self.hashes)

    @property
    def nbytes(self) -> int:
        return int(self.hashes.nbytes + self.locations.nbytes)


def last_write_wins(
    keys: list[bytes], values: list[bytes | None]
) -> tuple[list[bytes], list[bytes | None], np.ndarray, np.ndarray, np.ndarray | None]:
    """``keys`` and ``values`` without the earlier writes of a key given twice (the store
    keeps the last), the hash of each key, the order that sorts the hashes, and which of
    the changes were kept (None: all); :class:`HashCollision` if two different keys share
    a hash."""
    keep = None
    hashes = key_hashes(keys)
    order = np.argsort(hashes)
    if len(keys) > 1:
        sorted_hashes = hashes[order]
        if bool((sorted_hashes[1:] == sorted_hashes[:-1]).any()):
            # sorted again, stably: of equal hashes, the last written comes last
            order = np.argsort(hashes, kind="stable")
            sorted_hashes = hashes[order]
            same = np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1])
            earlier, later = order[same], order[same + 1]
            for a, b in zip(earlier.tolist(), later.tolist(), strict=True):
                if keys[a] != keys[b]:
                    raise HashCollision
            keep = np.ones(len(keys), bool)
            keep[earlier] = False
            keys, values = list(compress(keys, keep)), list(compress(values, keep))
            hashes = hashes[keep]
            order = np.argsort(hashes)
    return keys, values, hashes, order, keep
