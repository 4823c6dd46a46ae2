"""A typed view of one table partition: a byte store plus the table's codecs and position.

:class:`PartitionStore` is what query handlers read. It pairs every answer with the position
the data was read at, and guarantees the pair is consistent: the position is never older or
newer than the data it is reported with.

- Point reads use a sequence counter: :meth:`PartitionStore.apply` bumps it before and after
  a write, a reader retries if the counter moved (or is odd) while it read. With one writer
  thread and writes that take microseconds, a retry is rare and cheap.
- Range reads take a store snapshot, which carries the meta blob (and so the position) of the
  same moment.
- Reads at a given batch (consistent reads across partitions, ``AS OF``) read the
  partition's :class:`~sparkiq.stores.versions.VersionedRows`, kept when the store is opened
  with a ``history``: every batch is applied there first, on the same thread, so that once
  ``batch_id`` moves every read path serves it (a failed store write reloads the versions).

The position is kept in the store's meta blob, written atomically with the data, so a
replica restarted from its local files resumes exactly where it stopped.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from sparkiq.errors import InvalidQueryError
from sparkiq.query.position import Position
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.types import TableSchema
from sparkiq.stores.base import PairsIterator, Store, StoreIterator
from sparkiq.stores.history import History
from sparkiq.stores.versions import VersionedRows

__all__ = ["PartitionStore", "decode_meta", "encode_meta"]

_META_VERSION = 1


def encode_meta(batch_id: int, position: Position) -> bytes:
    """Meta blob format v1: JSON ``{"v": 1, "batch": <id>, "position": {c: {p: o}}}``."""
    doc = {"v": _META_VERSION, "batch": batch_id, "position": position.to_map()}
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def decode_meta(blob: bytes | None) -> tuple[int, Position]:
    """``(last applied batch id, position)``; ``(-1, empty)`` for a store never written."""
    if blob is None:
        return -1, Position.empty()
    doc = json.loads(blob)
    return int(doc["batch"]), Position.from_map(doc["position"])


class PartitionStore:
    """One partition of one table, typed: keys and rows in, keys and rows out."""

    def __init__(
        self,
        table: str,
        partition: int,
        schema: TableSchema,
        store: Store,
        history: History | None = None,
        commit_time: Callable[[int], float] | None = None,
    ) -> None:
        self.table = table
        self.partition = partition
        self.schema = schema
        self.store = store
        self.keys = KeyCodec(schema)
        self.rows = RowCodec(schema)
        self._decode_row = self.rows.decode_row
        self._seq = 0
        self._write_lock = threading.Lock()
        # The writer's own: the versions hold a batch whose write failed and could not be
        # reset to the store's contents then.
        self._versions_stale = False
        self.batch_id, self.position = decode_meta(store.meta())
        # The commit time of a batch (0.0: unknown), for the batch the versions are loaded
        # at: the store's meta does not hold it, the changelog's commit record does.
        self._commit_time = commit_time
        #: The partition's versions as Arrow (None: opened without history).
        self.versions: VersionedRows | None = None
        if history is not None:
            self.versions = VersionedRows(schema, history)
            self._load_versions(self.versions)

    # -- reads -------------------------------------------------------------------------------

    def get(self, internal_key: tuple[Any, ...]) -> tuple[dict[str, Any] | None, Position]:
        """The row of a key (internal values) and the position it was read at."""
        return self.get_encoded(self.keys.encode(internal_key))

    def get_encoded(self, encoded_key: bytes) -> tuple[dict[str, Any] | None, Position]:
        """Like :meth:`get` for an already encoded key (a lookup that located its key once,
        :func:`~sparkiq.schema.keypath.key_locator`)."""
        # One pass of get_raw's loop inline: the read that meets no write (nearly all of
        # them) costs no loop and no second call.
        seq = self._seq
        raw = self.store.get(encoded_key)
        position = self.position
        if seq & 1 or self._seq != seq:
            raw, position = self.get_raw(encoded_key)
        return (None if raw is None else self._decode_row(raw)), position

    def get_raw(self, encoded_key: bytes) -> tuple[bytes | None, Position]:
        """Like :meth:`get` for an already encoded key, returning the encoded row."""
        store = self.store
        while True:
            seq = self._seq
            if seq & 1:
                with self._write_lock:
                    continue
            raw = store.get(encoded_key)
            position = self.position
            if self._seq == seq:
                return raw, position

    def get_at(self, encoded_key: bytes, batch_id: int) -> tuple[bytes | None, Position]:
        """The encoded row of a key at ``batch_id`` (from the versions) and that position."""
        version = self.version(batch_id)
        return version.row(encoded_key), version.position

    def scan(
        self,
        lower: bytes | None,
        upper: bytes | None,
        *,
        reverse: bool = False,
        upper_exclusive: bool = False,
        at_batch: int | None = None,
    ) -> tuple[StoreIterator, Position]:
        """A snapshot iterator over encoded keys and the position of that snapshot; with
        ``at_batch``, the partition's rows at that batch (from its versions)."""
        if at_batch is not None:
            version = self.version(at_batch)
            pairs = version.pairs(lower, upper, reverse=reverse, upper_exclusive=upper_exclusive)
            return PairsIterator(pairs), version.position
        iterator = self.store.range(lower, upper, reverse=reverse, upper_exclusive=upper_exclusive)
        _, position = decode_meta(iterator.meta)
        return iterator, position

    def version(self, batch_id: int) -> Any:
        """The partition's rows at ``batch_id`` (a :class:`~sparkiq.stores.versions.Version`);
        raises :class:`~sparkiq.stores.history.BatchOutOfHistory` when not retained."""
        if self.versions is None:
            raise InvalidQueryError(
                f"{self.table}[{self.partition}] keeps no history: it can answer only at its "
                "current batch",
                store=self.table,
                partition=self.partition,
            )
        return self.versions.version(batch_id)

    def decoded(self, iterator: StoreIterator) -> Iterator[tuple[Any, dict[str, Any]]]:
        """Decode ``(encoded key, encoded row)`` pairs into ``(key, row)``."""
        from_internal, decode_key, decode_row = (
            self.keys.from_internal,
            self.keys.decode,
            self.rows.decode,
        )
        for key, value in iterator:
            yield from_internal(decode_key(key)), decode_row(value)

    # -- writes (one writer thread) ----------------------------------------------------------

    def apply(
        self,
        ops: Iterable[tuple[bytes, bytes | None]],
        batch_id: int,
        position: Position,
        *,
        replace_all: bool = False,
        committed_at: float = 0.0,
    ) -> None:
        """Atomically apply a batch's changes and move to ``position``.

        Callers apply batches in order; a batch id at or below the current one is a
        programming error (the replica filters those out), so it is refused.
        """
        pairs = list(ops)
        self.apply_changes(
            [k for k, _ in pairs],
            [v for _, v in pairs],
            batch_id,
            position,
            replace_all=replace_all,
            committed_at=committed_at,
        )

    def apply_changes(
        self,
        keys: list[bytes],
        values: list[bytes | None],
        batch_id: int,
        position: Position,
        *,
        replace_all: bool = False,
        committed_at: float = 0.0,
        columns: tuple[pa.Array, pa.Array] | None = None,
    ) -> None:
        """:meth:`apply` with the changes as two lists (``values[i]`` is the new row of
        ``keys[i]``, None deletes it), as a segment holds them: no pair is built per row.
        ``columns``: the same changes as binary arrays when the caller holds them (a
        segment's), which the versions then use instead of building their own."""
        if batch_id <= self.batch_id:
            raise ValueError(
                f"batch {batch_id} is not after the applied batch {self.batch_id} of "
                f"{self.table}[{self.partition}]"
            )
        versions = self.versions
        if versions is not None:
            if self._versions_stale:  # a failed write could not reset them: do it now
                self._load_versions(versions)
                self._versions_stale = False
            # Versions first, so that once batch_id moves every read path can serve it.
            versions.apply(
                batch_id,
                position,
                committed_at,
                keys,
                values,
                replace_all=replace_all,
                columns=columns,
            )
        with self._write_lock:
            meta = encode_meta(batch_id, position)
            self._seq += 1
            try:
                self.store.apply(zip(keys, values, strict=True), meta, replace_all=replace_all)
                self.batch_id, self.position = batch_id, position
            except BaseException:
                if versions is not None:  # the batch did not land: neither may its versions
                    try:
                        self._load_versions(versions)
                    except Exception:  # the store cannot be read either: before the next batch
                        self._versions_stale = True
                raise
            finally:
                self._seq += 1

    def _load_versions(self, versions: VersionedRows) -> None:
        """Reset ``versions`` to the store's contents (opening, or after a failed write)."""
        batch_id, position = decode_meta(self.store.meta())
        if batch_id < 0:
            versions.reset()
            return
        with self.store.range(None, None) as iterator:
            pairs = iterator.next_chunk(1 << 62)
        committed_at = self._commit_time(batch_id) if self._commit_time is not None else 0.0
        versions.load(
            batch_id, position, committed_at, [k for k, _ in pairs], [v for _, v in pairs]
        )

    def close(self) -> None:
        self.store.close()
