"""Versions of one partition's rows, as Arrow, readable at any retained batch.

RocksDB holds a partition's newest state and answers point lookups. Reads that span rows --
scans, SQL, reads at one batch across partitions, ``AS OF`` and versioned key queries -- read
:class:`VersionedRows` instead: the same rows decoded once into Arrow, with every version kept
for the table's history window.

**Layout** (:mod:`sparkiq.stores.versionchunk`). A list of chunks, each an Arrow table of
decoded rows plus four internal columns: the encoded store key, the encoded row (so typed
queries decode exactly as they do from RocksDB), the batch that wrote the row
(:data:`VALID_FROM`) and the batch that replaced or deleted it (:data:`VALID_TO`,
:data:`OPEN` while current). Applying batch ``b`` stamps ``valid_to = b`` on the current rows
of the keys it changes and appends a chunk of its upserts. The state at batch ``B`` is the
rows with ``valid_from <= B < valid_to``.

**Readers take no lock.** The chunk list, the retained range and the per-batch positions are
one immutable :class:`_State`, replaced whole by the writer. ``valid_to`` is a NumPy vector
the Arrow column shares without copying, and the writer stamps it in place -- safe for any
reader at ``B``, because a stamp only ever turns ``OPEN`` into a batch newer than every batch
a reader can hold, so ``valid_to > B`` reads the same before and after it (and a reader
holding chunks over a vector the writer has since outgrown reads the same without the
later stamps).

**History.** :class:`History` says how far back reads may go. Rows that no retained batch can
see are dropped when chunks are merged (when dead rows pass a quarter of the live ones, or
the chunk count grows), so memory is the live rows plus the versions replaced within the
window. The window starts when the partition is opened: history is not kept across restarts.

**Finding rows by key** (:mod:`sparkiq.stores.keyindex`). Each chunk carries its keys' hashes,
sorted, so a key read at a past batch bisects each chunk. The writer keeps an index of the
current keys' hashes and the row number of their rows: applying a batch
(:mod:`sparkiq.stores.applyplan`) hashes and sorts its keys, finds the rows it replaces with
one ``searchsorted``, checks them bytewise with one ``take`` and stamps them with one
scatter -- the work follows the batch, not the rows stored, nor the number of chunks.
Everything a batch changes is worked out first (the plan, and its chunk decoded) and only
then stamped and published, so a batch that fails (a row that does not decode) changes
nothing. Two keys with one hash make the writer drop its index and match keys by value until
the index is rebuilt (when chunks merge). A replica hands the batch's segment columns with
its lists when it has them, and the chunk is built from those (its rows decoded from the
column's buffers): no Arrow array is built from Python objects.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import sparkiq.stores.keyindex as keyindex
from sparkiq.query.position import Position
from sparkiq.schema.arrowrows import KEY_COLUMN, PSEUDO_COLUMNS, ArrowRows
from sparkiq.schema.types import TableSchema
from sparkiq.stores.applyplan import checked_columns, plan_by_index, plan_by_value
from sparkiq.stores.history import DEFAULT_HISTORY, BatchOutOfHistory, History
from sparkiq.stores.keyindex import ChunkKeys, CurrentKeys, HashCollision
from sparkiq.stores.versionchunk import (
    OPEN,
    ROW_COLUMN,
    VALID_FROM,
    VALID_TO,
    Chunk,
    ValidTo,
    visible_mask,
)

__all__ = [
    "OPEN",
    "ROW_COLUMN",
    "VALID_FROM",
    "VALID_TO",
    "KeyHistory",
    "Version",
    "VersionedRows",
    "visible_mask",
]

_MAX_CHUNKS = 48
_NO_ROWS = np.empty(0, np.int64)


@dataclass(frozen=True, slots=True)
class _State:
    chunks: tuple[Chunk, ...]
    oldest: int  # the oldest batch readable (-1: nothing applied yet)
    newest: int
    batches: dict[int, tuple[Position, float]]  # retained batch -> (position, committed_at)


@dataclass(frozen=True, slots=True)
class KeyHistory:
    """The retained versions of one key and the window they were read in: ``oldest`` ..
    ``newest`` (-1: nothing applied), ``batches`` maps each retained batch to its
    ``(position, committed_at)``; ``versions`` as :meth:`VersionedRows.versions_of`."""

    oldest: int
    newest: int
    batches: dict[int, tuple[Position, float]]
    versions: list[tuple[int, int, bytes]]


@dataclass(frozen=True, slots=True)
class Version:
    """One partition's rows at ``batch_id``: the chunks that can hold them and the predicate
    ``valid_from <= batch_id < valid_to`` that selects them. Holding a version keeps its
    buffers alive; it stays readable after the history moves on."""

    batch_id: int
    position: Position
    committed_at: float
    chunks: tuple[pa.Table, ...]
    schema: pa.Schema
    #: the same chunks with their key index, for :meth:`row`
    keyed: tuple[Chunk, ...] = ()

    def raw(self) -> pa.Table:
        """Every candidate row with its validity columns, without copying."""
        if not self.chunks:
            return self.schema.empty_table()
        return pa.concat_tables(self.chunks)

    def table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The rows at ``batch_id`` (a copy: the visible rows only)."""
        raw = self.raw()
        if raw.num_rows:
            raw = raw.filter(visible_mask(raw, self.batch_id))
        return raw if columns is None else raw.select(list(columns))

    def row(self, key: bytes) -> bytes | None:
        """The encoded row of ``key`` at ``batch_id`` (None: no row)."""
        key_hash, batch_id = keyindex.key_hash(key), self.batch_id
        for chunk in self.keyed:
            for row in chunk.rows_of(key, key_hash):
                if chunk.valid_from[row] <= batch_id < chunk.valid_to[row]:
                    return chunk.row_bytes(row)
        return None

    def pairs(
        self,
        lower: bytes | None,
        upper: bytes | None,
        *,
        reverse: bool = False,
        upper_exclusive: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """``(encoded key, encoded row)`` at ``batch_id`` in the key range, in key order."""
        table = self.table([KEY_COLUMN, ROW_COLUMN])
        keys = table.column(KEY_COLUMN)
        mask = None
        if lower is not None:
            mask = pc.greater_equal(keys, pa.scalar(lower, pa.binary()))
        if upper is not None:
            cmp = pc.less if upper_exclusive else pc.less_equal
            high = cmp(keys, pa.scalar(upper, pa.binary()))
            mask = high if mask is None else pc.and_(mask, high)
        if mask is not None:
            table = table.filter(mask)
        order = "descending" if reverse else "ascending"
        table = table.take(pc.sort_indices(table, sort_keys=[(KEY_COLUMN, order)]))
        return list(
            zip(
                table.column(KEY_COLUMN).to_pylist(),
                table.column(ROW_COLUMN).to_pylist(),
                strict=True,
            )
        )


class VersionedRows:
    """The retained versions of one partition (see the module docstring).

    One writer thread calls :meth:`load` and :meth:`apply`; any thread reads. ``_state`` is
    replaced whole, never mutated, except ``valid_to`` stamps (safe, see above); the
    condition ``_applied`` guards nothing but wakes readers waiting for a batch.
    """

    def __init__(self, schema: TableSchema, history: History = DEFAULT_HISTORY) -> None:
        self.schema = schema
        self.history = history
        columns = list(schema.column_names)
        if schema.window_column is not None:
            columns += PSEUDO_COLUMNS
        self.columns = tuple(columns)
        self._rows = ArrowRows(schema, columns)
        self._schema = pa.schema(
            [
                *self._rows.out_schema,
                pa.field(KEY_COLUMN, pa.binary()),
                pa.field(ROW_COLUMN, pa.binary()),
                pa.field(VALID_FROM, pa.int64()),
                pa.field(VALID_TO, pa.int64()),
            ]
        )
        self._state = _State((), -1, -1, {})
        self._applied = threading.Condition()
        # The writer's own (no reader touches them): where each current key's row is (None
        # after a hash collision: keys are then matched by value), how many rows were
        # stamped at each batch (dead rows, for merging), every row's valid_to.
        self._current: CurrentKeys | None = CurrentKeys.empty()
        self._valid_to = ValidTo.of(_NO_ROWS)
        self._stamped: dict[int, int] = {}

    # -- reads -------------------------------------------------------------------------------

    @property
    def arrow_schema(self) -> pa.Schema:
        """The schema of every chunk: the columns, then the four internal ones."""
        return self._schema

    @property
    def newest(self) -> int:
        return self._state.newest

    @property
    def oldest(self) -> int:
        return self._state.oldest

    def committed_at(self, batch_id: int) -> float | None:
        found = self._state.batches.get(batch_id)
        return None if found is None else found[1]

    def retained(self) -> list[tuple[int, float]]:
        """``(batch id, committed_at)`` of every retained batch, oldest first."""
        return [(b, at) for b, (_, at) in sorted(self._state.batches.items())]

    def version(self, batch_id: int) -> Version:
        """The rows at ``batch_id``; :class:`BatchOutOfHistory` when it is not retained."""
        state = self._state
        found = state.batches.get(batch_id)
        if found is None or not state.oldest <= batch_id <= state.newest:
            raise BatchOutOfHistory(self._out_of_history(state, batch_id))
        keyed = tuple(c for c in state.chunks if c.first <= batch_id)
        return Version(
            batch_id, found[0], found[1], tuple(c.table for c in keyed), self._schema, keyed
        )

    def wait_for(self, batch_id: int, timeout: float) -> bool:
        """Block until ``batch_id`` is applied (at most ``timeout`` s); return whether it is."""
        if self._state.newest >= batch_id:
            return True
        deadline = time.monotonic() + timeout
        with self._applied:
            while self._state.newest < batch_id:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._applied.wait(remaining)
        return True

    def versions_of(self, key: bytes) -> list[tuple[int, int, bytes]]:
        """Every retained version of ``key``: ``(valid_from, valid_to, encoded row)``,
        oldest first (``valid_to`` is :data:`OPEN` for the current one)."""
        return self._versions_in(self._state, key)

    def key_history(self, key: bytes) -> KeyHistory:
        """:meth:`versions_of` with the retained batches it was read at (one state, so the
        versions, the window and the batches' positions and commit times agree)."""
        state = self._state
        return KeyHistory(state.oldest, state.newest, state.batches, self._versions_in(state, key))

    @staticmethod
    def _versions_in(state: _State, key: bytes) -> list[tuple[int, int, bytes]]:
        key_hash = keyindex.key_hash(key)
        found: list[tuple[int, int, bytes]] = []
        for chunk in state.chunks:
            for row in chunk.rows_of(key, key_hash):
                valid_to = int(chunk.valid_to[row])
                if valid_to <= state.oldest:
                    continue  # replaced before the history window
                found.append((int(chunk.valid_from[row]), valid_to, chunk.row_bytes(row)))
        found.sort()
        return found

    def current_rows(self) -> int:
        """Rows of the newest batch: the table's rows in this partition now (exact)."""
        return sum(int(np.count_nonzero(c.valid_to == OPEN)) for c in self._state.chunks)

    def stored_rows(self) -> int:
        """Rows held, current and past (what memory is spent on)."""
        return sum(c.table.num_rows for c in self._state.chunks)

    def nbytes(self) -> int:
        """Bytes held: the chunks, their key indexes, the writer's index of current keys and
        the room its ``valid_to`` vector keeps for more rows."""
        current = self._current
        held: int = sum(c.table.nbytes + c.index.nbytes for c in self._state.chunks)
        room = self._valid_to.vector.nbytes - 8 * self._valid_to.used
        return held + room + (current.nbytes if current is not None else 0)

    @staticmethod
    def _out_of_history(state: _State, batch_id: int) -> str:
        if state.newest < 0:
            return f"batch {batch_id} is not readable: this replica has applied no batch yet"
        if batch_id > state.newest:
            return (
                f"batch {batch_id} is not applied yet (the newest is {state.newest}): retry later"
            )
        if batch_id >= state.oldest:  # inside the range, yet not kept: a snapshot skipped it
            later = min(b for b in state.batches if b > batch_id)
            return (
                f"batch {batch_id} was never applied by this replica: it restored the snapshot "
                f"of batch {later} instead; ask another replica"
            )
        return (
            f"batch {batch_id} is beyond the retained history: the oldest batch still "
            f"readable is {state.oldest} (raise materialize(history=...) to keep more)"
        )

    # -- writes (one writer thread) ----------------------------------------------------------

    def load(
        self,
        batch_id: int,
        position: Position,
        committed_at: float,
        keys: list[bytes],
        rows: list[bytes],
    ) -> None:
        """Replace everything with the state of ``batch_id`` (opening, or a snapshot)."""
        chunks: tuple[Chunk, ...] = ()
        valid_to = ValidTo.of(_NO_ROWS)
        if keys:
            row_array = pa.array(rows, pa.binary())
            decoded = self._rows.from_stored_array(row_array)
            valid_to = valid_to.placed(len(keys))
            index = ChunkKeys.of(keyindex.key_hashes(keys))
            chunks = (
                self._new_chunk(
                    0, batch_id, pa.array(keys, pa.binary()), row_array, decoded, index, valid_to
                ),
            )
        self._valid_to = valid_to
        self._current = self._index_of(chunks)
        self._stamped = {}
        self._publish(_State(chunks, batch_id, batch_id, {batch_id: (position, committed_at)}))

    def reset(self) -> None:
        """Forget everything (the store holds no batch)."""
        self._current = CurrentKeys.empty()
        self._valid_to = ValidTo.of(_NO_ROWS)
        self._stamped = {}
        self._publish(_State((), -1, -1, {}))

    def apply(
        self,
        batch_id: int,
        position: Position,
        committed_at: float,
        keys: list[bytes],
        values: list[bytes | None],
        *,
        replace_all: bool = False,
        columns: tuple[pa.Array, pa.Array] | None = None,
    ) -> None:
        """Apply batch ``batch_id``: ``values[i]`` is the new row of ``keys[i]`` (None
        deletes it; a key given twice takes its last value, as in the store).
        ``replace_all`` replaces every row (a complete-mode batch). ``columns``: ``keys``
        and ``values`` as binary arrays, when the caller holds them (a segment's), used
        instead of building them. Nothing changes if it raises (a row that does not
        decode)."""
        state = self._state
        if batch_id <= state.newest:
            raise ValueError(f"batch {batch_id} is not after the applied batch {state.newest}")
        if columns is not None:
            columns = checked_columns(columns, len(keys))
        chunks = state.chunks
        plan = None
        if self._current is not None:
            try:
                plan = plan_by_index(chunks, self._current, keys, values, replace_all, columns)
            except HashCollision:
                self._current = None  # two keys share a hash: match keys by value instead
        if plan is None:
            plan = plan_by_value(chunks, keys, values, replace_all)
        count = len(plan.keys)
        decoded = self._rows.from_stored_array(plan.rows) if count else None  # may raise
        # From here on nothing raises: place the new chunk, stamp, move the index, publish.
        valid_to = self._valid_to
        start = valid_to.used
        if decoded is not None:
            placed = valid_to.placed(count)
            if placed.vector is not valid_to.vector:  # a larger vector: the chunks move over
                chunks = tuple(c.over(placed.vector) for c in chunks)
            valid_to = placed
            new = self._new_chunk(
                start, batch_id, plan.keys, plan.rows, decoded, plan.index, valid_to
            )
            chunks += (new,)
        if plan.stamp.size:
            valid_to.vector[plan.stamp] = batch_id
            self._stamped[batch_id] = len(plan.stamp)
        if self._current is not None and plan.edits is not None:
            update, update_rows, remove, insert_hashes, insert_rows = plan.edits
            self._current.edit(
                update, update_rows + start, remove, insert_hashes, insert_rows + start
            )
        self._valid_to = valid_to
        batches = {**state.batches, batch_id: (position, committed_at)}
        oldest = state.oldest if state.oldest >= 0 else batch_id
        oldest = self._oldest_kept(batches, batch_id, oldest)
        batches = {b: v for b, v in batches.items() if b >= oldest}
        self._publish(_State(self._compacted(chunks, oldest), oldest, batch_id, batches))

    def _index_of(self, chunks: tuple[Chunk, ...]) -> CurrentKeys | None:
        """The index of the current rows of ``chunks`` (None: two keys share a hash)."""
        hashes, locations = [], []
        for chunk in chunks:
            current = np.flatnonzero(chunk.valid_to == OPEN)
            hashes.append(chunk.index.aligned()[current])
            locations.append(chunk.start + current)
        if not chunks:
            return CurrentKeys.empty()
        try:
            return CurrentKeys.build(np.concatenate(hashes), np.concatenate(locations))
        except HashCollision:
            return None

    def _oldest_kept(
        self, batches: dict[int, tuple[Position, float]], newest: int, oldest: int
    ) -> int:
        """The oldest batch the history still needs to keep readable."""
        keep = newest - self.history.batches
        if self.history.seconds > 0:
            cutoff = time.time() - self.history.seconds
            # batches is in ascending order (built by appending): stop at the first hit
            for earlier, later in itertools.pairwise(batches):
                if batches[later][1] > cutoff:  # ``earlier`` was current after the cutoff
                    keep = min(keep, earlier)
                    break
            else:
                keep = min(keep, newest)
        return max(oldest, keep)

    def _compacted(self, chunks: tuple[Chunk, ...], oldest: int) -> tuple[Chunk, ...]:
        """Merge the chunks into one, without rows no retained batch sees, once dead rows
        pass a quarter of the live ones or there are too many chunks (then the index of
        current keys is rebuilt: rows moved)."""
        if len(chunks) < 2:
            return chunks
        stored = sum(c.table.num_rows for c in chunks)
        dead = sum(count for batch, count in self._stamped.items() if batch <= oldest)
        if len(chunks) <= _MAX_CHUNKS and dead * 4 <= stored - dead:
            return chunks
        self._stamped = {b: n for b, n in self._stamped.items() if b > oldest}
        live = [c.valid_to > oldest for c in chunks]
        merged = pa.concat_tables(
            [c.table.filter(pa.array(m)) for c, m in zip(chunks, live, strict=True)]
        ).combine_chunks()
        if not merged.num_rows:
            self._current = CurrentKeys.empty()
            self._valid_to = ValidTo.of(_NO_ROWS)  # rows are numbered from 0 again
            return ()
        hashes = np.concatenate([c.index.aligned()[m] for c, m in zip(chunks, live, strict=True)])
        self._valid_to = ValidTo.of(merged.column(VALID_TO).chunk(0).to_numpy())
        valid_to = self._valid_to.vector[: merged.num_rows]
        merged = merged.set_column(
            merged.schema.get_field_index(VALID_TO), VALID_TO, pa.array(valid_to)
        )
        valid_from = merged.column(VALID_FROM).chunk(0).to_numpy()
        chunk = Chunk(
            0,
            int(valid_from.min()),
            merged,
            merged.column(KEY_COLUMN).chunk(0),
            valid_from,
            valid_to,
            ChunkKeys.of(hashes),
        )
        self._current = self._index_of((chunk,))
        return (chunk,)

    def _new_chunk(
        self,
        start: int,
        batch_id: int,
        keys: pa.Array,
        rows: pa.Array,
        decoded: pa.Table,
        index: ChunkKeys,
        valid_to: ValidTo,
    ) -> Chunk:
        """The chunk of the rows ``batch_id`` wrote (``decoded`` from ``rows``; ``index``:
        of ``keys``), numbered from ``start``, its ``valid_to`` in ``valid_to``."""
        count = len(keys)
        valid_from = np.full(count, batch_id, dtype=np.int64)
        stamps = valid_to.vector[start : start + count]
        table = pa.Table.from_arrays(
            [
                *decoded.columns,
                keys,
                rows,
                pa.array(valid_from),  # zero-copy, as valid_to
                pa.array(stamps),  # zero-copy: stamps on valid_to show in the column
            ],
            schema=self._schema,
        )
        return Chunk(start, batch_id, table, keys, valid_from, stamps, index)

    def _publish(self, state: _State) -> None:
        with self._applied:
            self._state = state
            self._applied.notify_all()
