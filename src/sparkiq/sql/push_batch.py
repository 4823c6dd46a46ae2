"""A committed batch of a table's changes as push queries see it: decoded once
(:class:`Decoder`, :class:`DecodedBatch`) and evaluated once per statement
(:class:`Evaluated`).

The table's tail (:mod:`sparkiq.sql.push`) and a subscription catching up in its consumer's
thread (:mod:`sparkiq.sql.subscription`) both build these; both import this module, and it
imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog import Changelog
from sparkiq.changelog.feed import BatchChanges
from sparkiq.changelog.source import ChangelogSource
from sparkiq.query.position import Position
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.sql.change import BatchPosition, Change
from sparkiq.sql.push_plan import PushPlan, Row

__all__ = ["Chunk", "DecodedBatch", "Decoder", "Evaluated", "SharedChanges"]

Encoder = Callable[[list[Change]], bytes]


@dataclass(slots=True)
class DecodedBatch:
    """One committed batch: encoded keys, decoded keys and rows (None: deleted), in order."""

    batch: BatchPosition
    raw: list[bytes]
    keys: list[Any]
    rows: list[Row | None]


class Decoder:
    """Decodes a table's keys and rows (thread-safe, like the codecs it holds)."""

    def __init__(self, changelog: ChangelogSource | Changelog) -> None:
        manifest = changelog.manifest()
        self.table, self.partitions = changelog.table, manifest.partitions
        self.keys, self.rows = KeyCodec(manifest.schema), RowCodec(manifest.schema)
        start = manifest.schema.window_start
        self._window: Callable[[int], Any] | None = None if start is None else start.from_internal

    def key(self, raw: bytes) -> Any:
        if self._window is None:
            return self.keys.from_internal(self.keys.decode(raw))
        internal, start = self.keys.decode_windowed(raw)
        return self.keys.from_internal(internal), None if start is None else self._window(start)

    def batch(self, batch_id: int, source: Any) -> BatchPosition:
        return BatchPosition(self.table, batch_id, self.partitions, source)

    def decode(self, changes: BatchChanges) -> DecodedBatch:
        decode = self.rows.decode
        return DecodedBatch(
            self.batch(changes.batch_id, changes.position),
            changes.keys,
            [self.key(k) for k in changes.keys],
            [None if v is None else decode(v) for v in changes.values],
        )


class SharedChanges:
    """Changes delivered together (one statement's verdict on one batch, or a part of it),
    shared by every subscription that delivers exactly these, with their wire encoding
    computed once for all of them: the tail hands each subscription a reference, never a
    copy, so fanning a batch out costs the same whatever its size. Read-only."""

    __slots__ = ("_encoded", "changes")

    EMPTY: SharedChanges

    def __init__(self, changes: list[Change]) -> None:
        self.changes = changes
        self._encoded: tuple[Encoder, bytes] | None = None

    def encoded(self, encoder: Encoder) -> bytes:
        """``encoder(changes)``, computed by the first subscription that asks and reused by
        the others (a race encodes twice, harmlessly: the encoder is pure)."""
        cached = self._encoded
        if cached is not None and cached[0] is encoder:
            return cached[1]
        value = encoder(self.changes)
        self._encoded = (encoder, value)
        return value

    def __len__(self) -> int:
        return len(self.changes)


SharedChanges.EMPTY = SharedChanges([])


class Evaluated:
    """One statement's verdict on one batch, shared by the subscriptions running it:
    ``rows`` is ``(encoded key, matches, change to deliver)`` per change, in order; the other
    fields are views of it that let each subscription pick its changes with set operations
    (a key appears at most once in a batch); ``everything`` and ``matched`` are what most
    subscriptions deliver, shared with their encoding."""

    __slots__ = (
        "_leaving",
        "everything",
        "matched",
        "matched_keys",
        "others",
        "others_keys",
        "rows",
    )

    def __init__(self, plan: PushPlan, d: DecodedBatch) -> None:
        predicate, project, batch = plan.predicate, plan.project, d.batch
        rows: list[tuple[bytes, bool, Change]] = []
        for i, (raw, key, row) in enumerate(zip(d.raw, d.keys, d.rows, strict=True)):
            if row is not None and (predicate is None or predicate(row)):
                rows.append((raw, True, Change.in_batch(key, project(row), batch, i)))
            else:
                rows.append((raw, False, Change.in_batch(key, None, batch, i)))
        self.rows = rows
        self.everything = SharedChanges([change for _, _, change in rows])
        self.matched = SharedChanges([change for _, matches, change in rows if matches])
        self.matched_keys = [raw for raw, matches, _ in rows if matches]
        self.others = {raw: change for raw, matches, change in rows if not matches}
        self.others_keys = self.others.keys()
        self._leaving: dict[frozenset[bytes], SharedChanges] = {}

    def with_leaving(self, gone: set[bytes]) -> SharedChanges:
        """The matched changes plus deletions of the keys ``gone`` (which stopped matching
        and were delivered as rows before), in batch order: one object, and one encoding,
        for every subscription with the same ``gone``. Called by one thread (the tail, or a
        consumer catching up with its own :class:`Evaluated`)."""
        key = frozenset(gone)
        found = self._leaving.get(key)
        if found is None:
            leaving = [self.others[raw] for raw in gone]
            changes = sorted([*self.matched.changes, *leaving], key=Change.order)
            found = self._leaving[key] = SharedChanges(changes)
        return found


class Chunk:
    """What a consumer takes at once (``Subscription.poll_chunk``): every change that
    was waiting, in order, and the consumer's position after them. ``encoded(encoder)``
    gives the changes' wire form, each batch's part encoded once for every subscription
    that delivers the same changes. Read-only."""

    __slots__ = ("parts", "position")

    def __init__(self, parts: list[SharedChanges], position: Position) -> None:
        self.parts, self.position = parts, position

    @property
    def changes(self) -> list[Change]:
        parts = self.parts
        return parts[0].changes if len(parts) == 1 else [c for p in parts for c in p.changes]

    def encoded(self, encoder: Encoder) -> bytes:
        parts = self.parts
        if len(parts) == 1:
            return parts[0].encoded(encoder)
        return b"".join(p.encoded(encoder) for p in parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)
