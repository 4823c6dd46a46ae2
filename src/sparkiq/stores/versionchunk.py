"""The layout of a partition's versions in memory: Arrow chunks of decoded rows with their
validity, numbered rows, and the ``valid_to`` vector the writer stamps.

:class:`~sparkiq.stores.versions.VersionedRows` holds a list of :class:`Chunk`, each an Arrow
table of decoded rows plus four internal columns: the encoded store key (:data:`KEY_COLUMN`),
the encoded row (:data:`ROW_COLUMN`), the batch that wrote the row (:data:`VALID_FROM`) and
the batch that replaced or deleted it (:data:`VALID_TO`, :data:`OPEN` while current). The
state at batch ``B`` is the rows with ``valid_from <= B < valid_to``.

**Row numbers.** The writer numbers every stored row: a chunk's rows are ``start ..
start + n - 1``, the chunks one after another, from 0 again when chunks are merged into one.
The writer's index of current keys names rows by these numbers, so the rows a batch replaces
are found, checked and stamped with one vectorized call each, whatever chunks they lie in.

**valid_to.** Every chunk's ``valid_to`` is a slice of one writer-owned vector,
:class:`ValidTo`, numbered the same way; the Arrow column shares it without copying and the
writer stamps it in place with one scatter per batch. When the vector is full the writer
copies it into a larger one and rebuilds the chunks over it; a reader still holding the old
chunks misses the later stamps, which is harmless -- a stamp only turns :data:`OPEN` into a
batch newer than every batch that reader can read (see the ``versions`` module docstring).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sparkiq.stores.keyindex import ChunkKeys

__all__ = ["OPEN", "ROW_COLUMN", "VALID_FROM", "VALID_TO", "Chunk", "ValidTo", "visible_mask"]

ROW_COLUMN = "__sq_row"
VALID_FROM = "__sq_valid_from"
VALID_TO = "__sq_valid_to"
#: ``valid_to`` of a row that is still current.
OPEN = np.iinfo(np.int64).max

_FIRST_CAPACITY = 1024


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of a partition's versions (immutable but for ``valid_to`` stamps)."""

    start: int  # the row number of its first row (see the module docstring)
    first: int  # the smallest valid_from in the chunk: a read at B skips chunks with first > B
    table: pa.Table  # columns, KEY_COLUMN, ROW_COLUMN, VALID_FROM, VALID_TO (shares valid_to)
    keys: pa.Array  # the KEY_COLUMN as one array, for matching changed keys
    valid_from: np.ndarray  # int64, the VALID_FROM column without a copy
    valid_to: np.ndarray  # int64, a slice of the writer's ValidTo, stamped in place
    index: ChunkKeys  # the rows of each key hash

    def rows_of(self, key: bytes, key_hash: int) -> list[int]:
        """The rows holding ``key`` (any version), found by hash, checked by bytes."""
        keys = self.keys
        return [row for row in self.index.candidates(key_hash).tolist() if keys[row].as_py() == key]

    def row_bytes(self, row: int) -> bytes:
        value: bytes = self.table.column(ROW_COLUMN)[row].as_py()
        return value

    def over(self, vector: np.ndarray) -> Chunk:
        """This chunk with its ``valid_to`` read from ``vector`` (a copy of the old one)."""
        valid_to = vector[self.start : self.start + self.table.num_rows]
        table = self.table.set_column(
            self.table.schema.get_field_index(VALID_TO), VALID_TO, pa.array(valid_to)
        )
        return dataclasses.replace(self, table=table, valid_to=valid_to)


def visible_mask(raw: pa.Table, batch_id: int) -> pa.ChunkedArray:
    """Rows of ``raw`` that are current at ``batch_id``."""
    return pc.and_(
        pc.less_equal(raw.column(VALID_FROM), batch_id),
        pc.greater(raw.column(VALID_TO), batch_id),
    )


class ValidTo:
    """The writer's ``valid_to`` of every numbered row (one writer thread owns it): rows
    ``0 .. used - 1`` belong to chunks, the rest is room for the next ones."""

    __slots__ = ("used", "vector")

    def __init__(self, vector: np.ndarray, used: int) -> None:
        self.vector = vector
        self.used = used

    @staticmethod
    def of(valid_to: np.ndarray) -> ValidTo:
        """A vector holding ``valid_to`` as rows ``0 ..``, with room to grow."""
        vector = np.empty(max(_FIRST_CAPACITY, 2 * len(valid_to)), np.int64)
        vector[: len(valid_to)] = valid_to
        return ValidTo(vector, len(valid_to))

    def placed(self, count: int) -> ValidTo:
        """Room for ``count`` more rows, set :data:`OPEN`: in this vector when it has the
        room (rows past ``used`` belong to no published chunk, so no reader sees them
        change), else in a larger copy. The writer adopts the result when it publishes."""
        need = self.used + count
        vector = self.vector
        if need > len(vector):
            vector = np.empty(max(2 * len(vector), need), np.int64)
            vector[: self.used] = self.vector[: self.used]
        vector[self.used : need] = OPEN
        return ValidTo(vector, need)
