"""One change a push query delivers: :class:`Change`, the same type in-process and from a
:class:`~sparkiq.Client`, and :class:`BatchPosition`, the position facts it derives from.

A table's tail decodes a committed batch once and shares its changes between subscriptions,
so a change built in-process keeps only a reference to its batch's facts and its index, and
builds its :class:`~sparkiq.query.position.Position` the first time it is asked (most are
never asked). A change read from HTTP carries its position as received.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkiq.query.position import Position

__all__ = ["BatchPosition", "Change"]

Row = dict[str, Any]


class BatchPosition:
    """The position facts of one committed batch of ``table``, shared by its changes:
    every partition at ``batch_id``, plus the source components of its commit record."""

    __slots__ = ("_after", "_map", "_tokens", "batch_id", "table")

    def __init__(self, table: str, batch_id: int, partitions: int, source: Any) -> None:
        self.table, self.batch_id = table, batch_id
        self._map = {c: dict(o) for c, o in source.items()}
        self._map[table] = dict.fromkeys(range(partitions), batch_id)
        self._after: Position | None = None
        self._tokens: Callable[[int], str] | None = None

    @property
    def after(self) -> Position:
        """The table's position once the whole batch is applied."""
        if self._after is None:
            self._after = Position.from_map(self._map)
        return self._after

    def within(self, seen: int) -> Position:
        """The position after the first ``seen`` changes of the batch (the ``push:<table>``
        component ``{batch_id: seen}`` says how far into the batch)."""
        return Position.from_map({**self._map, f"push:{self.table}": {self.batch_id: seen}})

    def token_within(self, seen: int) -> str:
        """``within(seen).to_token()``, without building the position (the JSON of the
        batch's facts is laid out once for all its changes)."""
        tokens = self._tokens
        if tokens is None:
            tokens = Position.tokens_varying(self._map, f"push:{self.table}", self.batch_id)
            self._tokens = tokens  # a race builds the same function twice: harmless
        return tokens(seen)


class Change:
    """One change a push query delivers.

    ``key`` is the row's key (a scalar, a tuple for several key columns; a windowed table's
    is ``(key, window start)``); ``row`` the projected row, or None when the key was deleted
    or stopped matching; ``batch_id`` the committed batch that made it; ``snapshot`` is True
    for rows of the initial snapshot; :attr:`position` resumes right after this change.
    Changes compare equal when all five are equal. A change and its row may be shared by
    the subscriptions of one statement: treat them as read-only.
    """

    __slots__ = ("_batch", "_index", "_position", "batch_id", "key", "row", "snapshot")

    def __init__(
        self,
        key: Any,
        row: Row | None,
        position: Position,
        *,
        batch_id: int,
        snapshot: bool = False,
    ) -> None:
        self.key, self.row, self.batch_id, self.snapshot = key, row, batch_id, snapshot
        self._position: Position | None = position
        self._batch: BatchPosition | None = None
        self._index = -1

    @classmethod
    def in_batch(
        cls, key: Any, row: Row | None, batch: BatchPosition, index: int, snapshot: bool = False
    ) -> Change:
        """Change number ``index`` of ``batch`` (a snapshot row: the position after it)."""
        change = cls.__new__(cls)
        change.key, change.row, change.batch_id, change.snapshot = (
            key,
            row,
            batch.batch_id,
            snapshot,
        )
        change._position, change._batch, change._index = None, batch, index
        return change

    @property
    def position(self) -> Position:
        position = self._position
        if position is None:
            batch = self._batch
            assert batch is not None  # one of the two is always set
            position = batch.after if self.snapshot else batch.within(self._index + 1)
            self._position = position  # a race computes the same value twice: harmless
        return position

    @property
    def token(self) -> str:
        """``position.to_token()``, cheaper for a change of a batch read in-process."""
        batch = self._batch
        if self._position is None and batch is not None and not self.snapshot:
            return batch.token_within(self._index + 1)
        return self.position.to_token()

    def order(self) -> int:
        """The change's index in its batch (-1 when unknown: a snapshot row, or a change
        received over HTTP)."""
        return self._index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Change):
            return NotImplemented
        return (self.key, self.row, self.batch_id, self.snapshot, self.position) == (
            other.key,
            other.row,
            other.batch_id,
            other.snapshot,
            other.position,
        )

    __hash__ = None  # type: ignore[assignment]  # equal by value, and rows are dicts

    def __repr__(self) -> str:
        return f"Change(key={self.key!r}, row={self.row!r}, batch_id={self.batch_id})"
