"""A subset of a table: the partitions, rows and columns a follower keeps.

A follower applies :class:`SubsetTransform` to every changelog row on its way into its
store: rows its filter rejects become deletions, kept rows are projected to the kept columns.
The projection works on the stored values (see :mod:`sparkiq.schema.rowcodec`): it takes
the kept positions of the row's MessagePack array and encodes them again, so the projected
schema's :class:`~sparkiq.schema.rowcodec.RowCodec` decodes exactly the values the owner
wrote. Everything here is deterministic when the filter is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from sparkiq.errors import ChangelogError, ConfigError
from sparkiq.schema.codec import RowCodec
from sparkiq.schema.types import TableSchema

__all__ = ["RowFilter", "SubsetTransform", "check_partitions", "identify", "project"]

#: A row filter: the row as ``Row.asDict(recursive=True)`` gives it (every column of the
#: table, before projection) -> keep it?
RowFilter = Callable[[dict[str, Any]], Any]


class SubsetTransform:
    """The follower's :data:`~sparkiq.changelog.replica.RowTransform`: filter on the row as
    PySpark gives it, then project the stored values (MessagePack-decoded but never
    converted to Python types, so a projected row holds exactly the values the owner wrote).
    A filter that raises becomes a :class:`ChangelogError`, which stops the partition at the
    batch before it. Deterministic when the filter is."""

    __slots__ = ("_codec", "_decode", "_encode", "_kept", "_table", "_where")

    def __init__(
        self, table: str, codec: RowCodec, where: RowFilter | None, kept: tuple[int, ...] | None
    ) -> None:
        self._table = table
        self._codec = codec
        self._where = where
        self._kept = kept
        self._decode = msgspec.msgpack.Decoder().decode
        self._encode = msgspec.msgpack.Encoder().encode

    def __call__(self, data: bytes) -> bytes | None:
        if self._where is not None:
            row = self._codec.decode(data)
            try:
                keep = self._where(row)
            except Exception as exc:
                raise ChangelogError(
                    f"the where= filter of this follower of {self._table!r} raised "
                    f"{type(exc).__name__}: {exc} on the row {row!r:.300}; it must accept "
                    "every row of the table: fix it and restart the follower",
                    store=self._table,
                ) from exc
            if not keep:
                return None
        if self._kept is None:
            return data
        values = self._decode(data)
        return self._encode([values[i] for i in self._kept])


def check_partitions(table: str, count: int, partitions: Iterable[int] | None) -> tuple[int, ...]:
    """The partitions to follow, sorted and unique (None: all ``count``); ConfigError
    naming the valid range otherwise."""
    if partitions is None:
        return tuple(range(count))
    if isinstance(partitions, int | str | bytes):
        raise ConfigError(
            f"partitions must be an iterable of partition numbers, got {partitions!r}",
            store=table,
        )
    chosen = list(partitions)
    bad = [p for p in chosen if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < count]
    if bad or not chosen:
        raise ConfigError(
            f"table {table!r} has partitions 0..{count - 1}; cannot follow "
            + (f"{bad}" if bad else "an empty set of partitions"),
            store=table,
        )
    return tuple(sorted(set(chosen)))


def project(
    table: str, schema: TableSchema, columns: Iterable[str] | None
) -> tuple[TableSchema, tuple[int, ...] | None]:
    """The schema of the kept columns and their indices in the stored row (None: all)."""
    if columns is None:
        return schema, None
    wanted = {columns} if isinstance(columns, str) else set(columns)
    unknown = sorted(c for c in wanted if c not in schema.column_names)
    if unknown:
        raise ConfigError(
            f"table {table!r} has no column {', '.join(map(repr, unknown))}; its columns are "
            f"{list(schema.column_names)}",
            store=table,
        )
    wanted.update(schema.key_columns)
    if schema.window_column is not None:
        wanted.add(schema.window_column)
    kept = tuple(i for i, f in enumerate(schema.fields) if f.name in wanted)
    if len(kept) == len(schema.fields):
        return schema, None
    projected = TableSchema(
        tuple(schema.fields[i] for i in kept), schema.key_columns, schema.window_column
    )
    return projected, kept


def identify(where: RowFilter | None) -> str | None:
    """A stable identity of a filter across runs: its qualified name and bytecode hash."""
    if where is None:
        return None
    name = getattr(where, "__qualname__", None) or type(where).__qualname__
    module = getattr(where, "__module__", None) or type(where).__module__
    code = getattr(where, "__code__", None) or getattr(type(where).__call__, "__code__", None)
    digest = "" if code is None else hashlib.sha256(code.co_code).hexdigest()[:16]
    return f"{module}.{name}:{digest}"
