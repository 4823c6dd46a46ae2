"""Finding a partition's versioned rows by key without comparing every key: sorted key hashes.

:class:`~sparkiq.stores.versions.VersionedRows` keeps a partition's rows in Arrow chunks,
one per applied batch (merged now and then). Two structures find rows there by key:

* :class:`ChunkKeys`, one per chunk (immutable, read by any thread): the hashes of the
  chunk's keys, sorted, and the row of each. A read of one key at a past batch bisects each
  chunk instead of comparing the key with every row of the partition.
* :class:`CurrentKeys`, the writer's own: the hash of every *current* key, sorted, and the
  row number of its current row (:mod:`sparkiq.stores.versionchunk`). Applying a batch
  finds the rows it replaces with one ``searchsorted`` of the batch's sorted hashes, instead
  of matching the batch's keys against every chunk. New keys go to a small second run,
  merged into the large one when it passes an eighth of it, so a batch copies a little,
  not the whole index. A deleted key keeps its entry with location :data:`DELETED`
  (removing it would copy the vectors again) until the index is rebuilt, when chunks merge.

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
]

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
    """The writer's index of the current keys: hash -> row number of the current row
    (:data:`DELETED`: none).

    One writer thread owns it; no reader touches it. Entries are in two runs, each sorted by
    hash and unique across both: a large one, and a small one that takes a batch's new keys
    (inserting there copies little) and is merged into the large one when it passes an
    eighth of it, so a batch does not copy the whole index. An entry is named by its
    *position*: ``i`` in the large run, ``len(large) + j`` in the small one; positions hold
    until the next :meth:`edit`.
    """

    __slots__ = ("hashes", "locations", "more_hashes", "more_locations")

    def __init__(self, hashes: np.ndarray, locations: np.ndarray) -> None:
        self.hashes = hashes
        self.locations = locations
        self.more_hashes = hashes[:0]
        self.more_locations = locations[:0]

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
        ``positions[i]`` has hash ``sorted_hashes[i]`` (else ``positions[i]`` means
        nothing); a found entry's location may be :data:`DELETED`."""
        positions, found = _find(self.hashes, sorted_hashes)
        if self.more_hashes.size:
            more, found_more = _find(self.more_hashes, sorted_hashes)
            positions = np.where(found_more, more + len(self.hashes), positions)
            found |= found_more
        return positions, found

    def locations_at(self, positions: np.ndarray) -> np.ndarray:
        """The locations of the entries at ``positions``."""
        if not self.more_hashes.size:
            found: np.ndarray = self.locations[positions]
            return found
        large = len(self.hashes)
        out = np.empty(len(positions), np.int64)
        low = positions < large
        out[low] = self.locations[positions[low]]
        out[~low] = self.more_locations[positions[~low] - large]
        return out

    def all_locations(self) -> np.ndarray:
        """Every entry's location, by position (a copy when there are two runs)."""
        if not self.more_hashes.size:
            return self.locations
        return np.concatenate([self.locations, self.more_locations])

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
        self._set(update, update_locations)
        self._set(remove, np.int64(DELETED))
        if not insert_hashes.size:
            return
        more, more_locations = self.more_hashes, self.more_locations
        at = np.searchsorted(more, insert_hashes)
        more = np.insert(more, at, insert_hashes)
        more_locations = np.insert(more_locations, at, insert_locations)
        if len(more) * 8 <= len(self.hashes):
            self.more_hashes, self.more_locations = more, more_locations
            return
        at = np.searchsorted(self.hashes, more)
        self.hashes = np.insert(self.hashes, at, more)
        self.locations = np.insert(self.locations, at, more_locations)
        self.more_hashes, self.more_locations = self.hashes[:0], self.locations[:0]

    def _set(self, positions: np.ndarray, values: np.ndarray | np.int64) -> None:
        if not self.more_hashes.size:
            self.locations[positions] = values
            return
        large = len(self.hashes)
        low = positions < large
        if isinstance(values, np.ndarray):
            self.locations[positions[low]] = values[low]
            self.more_locations[positions[~low] - large] = values[~low]
        else:
            self.locations[positions[low]] = values
            self.more_locations[positions[~low] - large] = values

    def __len__(self) -> int:
        return len(self.hashes) + len(self.more_hashes)

    @property
    def nbytes(self) -> int:
        return int(
            self.hashes.nbytes
            + self.locations.nbytes
            + self.more_hashes.nbytes
            + self.more_locations.nbytes
        )


def _find(hashes: np.ndarray, sorted_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ascending ``sorted_hashes`` is or would go in ``hashes``, and whether
    it is there."""
    positions = np.searchsorted(hashes, sorted_hashes)
    found = positions < len(hashes)
    found[found] = hashes[positions[found]] == sorted_hashes[found]
    return positions, found


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
