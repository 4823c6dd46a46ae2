"""What applying one batch changes in a partition's versions, worked out before anything
changes (so that a batch that fails changes nothing).

:class:`~sparkiq.stores.versions.VersionedRows` asks for a :class:`Plan` -- the new chunk's
keys and encoded rows, the row numbers (:mod:`sparkiq.stores.versionchunk`) of the current
rows the batch replaces or deletes, and the edits of the writer's index of current keys --
then decodes the new chunk, and only then stamps and publishes.

:func:`plan_by_index` finds the replaced rows through :class:`~sparkiq.stores.keyindex.
CurrentKeys`: the batch's key hashes (sorted) are looked up with one ``searchsorted``, the
keys found are checked byte for byte against the stored keys with one ``take`` over every
chunk's key column, in the batch's order (segments and chunks are in key order, so the
stored keys are read front to back, not at random). No Python runs per row but the hashing
of the keys. :func:`plan_by_value` matches keys by value instead, after a hash collision.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress, repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import sparkiq.stores.keyindex as keyindex
from sparkiq.stores.keyindex import ChunkKeys, CurrentKeys, HashCollision
from sparkiq.stores.versionchunk import OPEN, ROW_COLUMN, Chunk

__all__ = ["Plan", "checked_columns", "plan_by_index", "plan_by_value"]

_NO_ROWS = np.empty(0, np.int64)


@dataclass(slots=True)
class Plan:
    """What applying a batch changes, worked out before anything is changed."""

    keys: pa.Array  # the new chunk's keys and encoded rows, in batch order
    rows: pa.Array
    index: ChunkKeys  # of ``keys``
    stamp: np.ndarray  # row numbers of the current rows the batch replaces or deletes
    # CurrentKeys.edit's arguments, with rows of the new chunk for locations (None: no index)
    edits: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None


def checked_columns(columns: tuple[pa.Array, pa.Array], count: int) -> tuple[pa.Array, pa.Array]:
    """``columns`` as plain binary arrays of ``count`` rows each (ValueError otherwise)."""
    keys, values = columns
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if keys.type != pa.binary() or values.type != pa.binary():
        raise ValueError(f"columns must be binary arrays, not {keys.type} and {values.type}")
    if len(keys) != count or len(values) != count:
        raise ValueError(
            f"columns hold {len(keys)} keys and {len(values)} values for {count} changes"
        )
    return keys, values


def _stored(chunks: Sequence[Chunk], column: str) -> pa.ChunkedArray:
    """One column of every chunk, indexed by row number (chunks are numbered from 0, one
    after another)."""
    if column == ROW_COLUMN:
        return pa.chunked_array([c.table.column(ROW_COLUMN).chunk(0) for c in chunks], pa.binary())
    return pa.chunked_array([c.keys for c in chunks], pa.binary())


def plan_by_index(
    chunks: Sequence[Chunk],
    current: CurrentKeys,
    keys: list[bytes],
    values: list[bytes | None],
    replace_all: bool,
    columns: tuple[pa.Array, pa.Array] | None,
) -> Plan:
    """The batch's changes found through ``current`` (see the module docstring);
    :class:`HashCollision` if two keys share a hash. ``columns``: ``keys`` and ``values`` as
    binary arrays (built here when None)."""
    if replace_all:  # the new table is the rows with a value
        present = list(map(operator.is_not, values, repeat(None)))
        keys, values = list(compress(keys, present)), list(compress(values, present))
        if columns is not None:
            columns = (columns[0].filter(columns[1].is_valid()), columns[1].drop_null())
    keys, values, hashes, order, kept = keyindex.last_write_wins(keys, values)
    if columns is None:
        columns = (pa.array(keys, pa.binary()), pa.array(values, pa.binary()))
    elif kept is not None:
        mask = pa.array(kept)
        columns = (columns[0].filter(mask), columns[1].filter(mask))
    batch_keys, batch_rows = columns
    count = len(keys)
    sorted_hashes = hashes[order]
    positions, matched = current.find(sorted_hashes)  # deleted keys' entries too
    # in batch order from here: the stored rows are then read front to back
    position_of = np.zeros(count, np.int64)
    position_of[order] = positions
    location_of = np.full(count, keyindex.DELETED, np.int64)
    location_of[order[matched]] = current.locations_at(positions[matched])
    old_index = np.flatnonzero(location_of >= 0)  # the batch's keys that have a current row
    old = location_of[old_index]  # and its row number
    if old.size:  # the same hash: the same key, or a collision
        held = _stored(chunks, "keys").take(old)
        if not pc.all(pc.equal(held, batch_keys.take(old_index))).as_py():
            raise HashCollision
    if replace_all:
        # rows the batch leaves as they were keep their version (a table re-emitted every
        # batch must not be copied every batch); the others and the rows it drops end
        same = pc.equal(_stored(chunks, ROW_COLUMN).take(old), batch_rows.take(old_index))
        same = same.to_numpy(zero_copy_only=False) if old.size else np.zeros(0, bool)
        upsert = np.ones(count, bool)
        upsert[old_index[same]] = False
        locations = current.all_locations()
        ended = locations >= 0
        ended[position_of[old_index[same]]] = False
        stamp = locations[ended]
    else:
        upsert = (
            np.ones(count, bool)
            if not batch_rows.null_count
            else batch_rows.is_valid().to_numpy(zero_copy_only=False)
        )
        stamp = old
    row_of = np.cumsum(upsert) - 1  # the new chunk's row of each upsert
    upsert_sorted, rows_sorted = upsert[order], row_of[order]
    update = matched & upsert_sorted  # a current key's entry, or a deleted key's
    insert = ~matched & upsert_sorted
    if replace_all:
        ended[positions[update]] = False
        remove = np.flatnonzero(ended)
    else:
        remove = position_of[old_index[~upsert[old_index]]]
    if not upsert.all():
        mask = pa.array(upsert)
        batch_keys, batch_rows = batch_keys.filter(mask), batch_rows.filter(mask)
    return Plan(
        batch_keys,
        batch_rows,
        ChunkKeys(sorted_hashes[upsert_sorted], rows_sorted[upsert_sorted].astype(np.int32)),
        stamp,
        (
            positions[update],
            rows_sorted[update],
            remove,
            sorted_hashes[insert],
            rows_sorted[insert],
        ),
    )


def plan_by_value(
    chunks: Sequence[Chunk], keys: list[bytes], values: list[bytes | None], replace_all: bool
) -> Plan:
    """The batch's changes found by comparing keys (after a hash collision)."""
    stamps: list[np.ndarray] = []
    if replace_all:
        new = {k: v for k, v in zip(keys, values, strict=True) if v is not None}
        for old in chunks:
            current = np.flatnonzero(old.valid_to == OPEN)
            if not current.size:
                continue
            old_keys = old.keys.take(pa.array(current)).to_pylist()
            old_rows = old.table.column(ROW_COLUMN).take(pa.array(current)).to_pylist()
            gone = []
            for index, key, row in zip(current, old_keys, old_rows, strict=True):
                if new.get(key) == row:
                    del new[key]  # unchanged: its version stays current
                else:
                    gone.append(index)
            if gone:
                stamps.append(old.start + np.array(gone, dtype=np.int64))
    else:
        latest = dict(zip(keys, values, strict=True))  # a key given twice: the last value
        changed = pa.array(list(latest), pa.binary())
        for old in chunks:
            hits = np.flatnonzero(
                pc.is_in(old.keys, value_set=changed).to_numpy(zero_copy_only=False)
            )
            live = hits[old.valid_to[hits] == OPEN]
            if live.size:
                stamps.append(old.start + live)
        new = {k: v for k, v in latest.items() if v is not None}
    upserts = list(new)
    return Plan(
        pa.array(upserts, pa.binary()),
        pa.array(list(new.values()), pa.binary()),
        ChunkKeys.of(keyindex.key_hashes(upserts)),
        np.concatenate(stamps) if stamps else _NO_ROWS,
        None,
    )
