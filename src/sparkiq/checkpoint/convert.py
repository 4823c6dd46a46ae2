"""Spark's state rows straight to sparkiq's encoded keys and stored rows.

A replica applies a store's changes as sparkiq keys (:class:`~sparkiq.schema.keycodec.KeyCodec`
encoding) and rows (the row codec's MessagePack, key columns first). Spark's UnsafeRow slots
already hold sparkiq's *internal* values -- dates as days, timestamps as microseconds,
decimals as unscaled ints -- so :class:`StateRowConverter` decodes them in that form
(``UnsafeRowDecoder(internal=True)``) and hands them to the key encoders and the MessagePack
encoder as they are: no ``datetime``, ``Decimal`` or ``dict`` is built per row, and only
decimals (stored as strings) and the folded presence flags of aggregation buffers are touched
per value. A timestamp key therefore never goes through the process's time zone.

This is the hot path of restoring and tailing an attached checkpoint (``bench.attach``); the
tests check it against the PySpark-form :class:`~sparkiq.checkpoint.provider.RowDecoder` and
Spark's State Data Source on every supported type.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from sparkiq.checkpoint.unsaferow import UnsafeRowDecoder, UnsafeRowError
from sparkiq.errors import ChangelogError, CorruptSegmentError
from sparkiq.schema.internal import decimal_from_internal
from sparkiq.schema.keycodec import KeyCodec
from sparkiq.schema.types import DataType, TableSchema

__all__ = ["StateRowConverter"]

_Convert = Callable[[Any], Any]


def _stored(dtype: DataType) -> _Convert | None:
    """Internal value -> the row codec's stored value, or None where they are the same (every
    type but decimals, which are stored as strings, and the containers holding one)."""
    name = dtype.name
    if name == "decimal":
        scale = dtype.scale
        return lambda v: f"{decimal_from_internal(v, scale):f}"
    if name == "struct":
        members = [_stored(f.type) for f in dtype.fields]
        if not any(members):
            return None
        pairs = [(i, _or_none(c)) for i, c in enumerate(members) if c is not None]

        def struct(v: tuple[Any, ...]) -> list[Any]:
            values = list(v)
            for i, convert in pairs:
                values[i] = convert(values[i])
            return values

        return struct
    if name == "array" and dtype.element is not None:
        element = _stored(dtype.element)
        if element is None:
            return None
        each = _or_none(element)
        return lambda v: [each(x) for x in v]
    if name == "map" and dtype.key is not None and dtype.value is not None:
        key, value = _stored(dtype.key), _stored(dtype.value)
        if key is None and value is None:
            return None
        k, x = _or_none(key or _same), _or_none(value or _same)
        return lambda v: [(k(a), x(b)) for a, b in v]
    return None


def _same(v: Any) -> Any:
    return v


def _or_none(convert: _Convert) -> _Convert:
    return lambda v: None if v is None else convert(v)


class StateRowConverter:
    """Turns one store's Spark key and value bytes into sparkiq's encoded keys and rows.

    ``store`` is the sparkiq table's name (for errors); ``table`` its schema (key columns
    first, then value columns); ``key_paths`` says where each key column is in Spark's key
    (``(i,)`` a field, ``(i, j)`` member ``j`` of struct field ``i``); ``value_indexes``
    which fields of Spark's value become the value columns; ``folds`` the ``(flag index,
    value index, null when flag is)`` presence flags folded into their neighbour;
    ``describe`` how errors name the store. Built once per store (decoders and per-column
    conversions compiled here); thread-safe.

    Raises :class:`~sparkiq.errors.ChangelogError` at construction for a type that cannot be
    decoded, and :class:`~sparkiq.errors.CorruptSegmentError` from :meth:`convert` when bytes
    do not fit the schemas.
    """

    def __init__(
        self,
        store: str,
        key_schema: DataType,
        value_schema: DataType,
        table: TableSchema,
        key_paths: tuple[tuple[int, ...], ...],
        value_indexes: tuple[int, ...],
        folds: tuple[tuple[int, int, bool], ...],
        describe: str,
    ) -> None:
        self.store, self.describe = store, describe
        try:
            self._key = UnsafeRowDecoder(key_schema, internal=True).decode
            self._value = UnsafeRowDecoder(value_schema, internal=True).decode
        except UnsafeRowError as exc:
            raise ChangelogError(f"{describe}: {exc}", store=store) from None
        self._codec = KeyCodec(table)
        flat_key = all(len(p) == 1 for p in key_paths) and [p[0] for p in key_paths] == list(
            range(len(key_schema.fields))
        )
        self._flat_key = flat_key
        self._key_paths = key_paths
        self._key_stored = tuple(
            (i, _or_none(c))
            for i, c in enumerate(_stored(t) for t in table.key_types)
            if c is not None
        )
        value_types = [f.type for f in value_schema.fields]
        self._value_stored = tuple(
            (n, _or_none(c))
            for n, c in enumerate(_stored(value_types[i]) for i in value_indexes)
            if c is not None
        )
        self._value_indexes = value_indexes
        self._folds = folds
        # the value columns are Spark's value fields as they are: no selection, no fold
        self._whole_value = (
            not folds
            and not self._value_stored
            and list(value_indexes) == list(range(len(value_types)))
        )
        self._encode = msgspec.msgpack.Encoder().encode

    def convert(self, records: Iterable[tuple[bytes, bytes | None]]) -> dict[bytes, bytes | None]:
        """``{encoded key: encoded row, or None for a removal}`` of Spark's ``(key bytes,
        value bytes or None)`` records, a later record of a key winning."""
        out: dict[bytes, bytes | None] = {}
        key_of, row_of = self._key_of(), self._row_of()
        key_data = b""
        value_data: bytes | None = None
        try:
            for key_data, value_data in records:
                encoded, stored = key_of(key_data)
                out[encoded] = None if value_data is None else row_of(stored, value_data)
        except UnsafeRowError as exc:
            part = "key" if _fails(self._key, key_data) else "value"
            raise CorruptSegmentError(
                f"{self.describe}: a state {part} does not fit the {part} schema: {exc}",
                store=self.store,
            ) from None
        return out

    def _key_of(self) -> Callable[[bytes], tuple[bytes, tuple[Any, ...] | list[Any]]]:
        decode, encode, stored = self._key, self._codec.encode, self._key_stored
        if self._flat_key and not stored:  # the common case: the decoded key is the key

            def flat_key(data: bytes) -> tuple[bytes, tuple[Any, ...]]:
                values = decode(data)
                return encode(values), values

            return flat_key
        paths = self._key_paths
        flat = self._flat_key

        def general(data: bytes) -> tuple[bytes, tuple[Any, ...] | list[Any]]:
            decoded = decode(data)
            if flat:
                internal = decoded
            else:
                internal = tuple(
                    decoded[p[0]]
                    if len(p) == 1
                    else (None if decoded[p[0]] is None else decoded[p[0]][p[1]])
                    for p in paths
                )
            if not stored:
                return encode(internal), internal
            columns = list(internal)
            for i, convert in stored:
                columns[i] = convert(columns[i])
            return encode(internal), columns

        return general

    def _row_of(self) -> Callable[[tuple[Any, ...] | list[Any], bytes], bytes]:
        decode, encode = self._value, self._encode
        if self._whole_value:

            def whole(key: tuple[Any, ...] | list[Any], data: bytes) -> bytes:
                return encode((*key, *decode(data)))

            return whole
        folds, indexes, stored = self._folds, self._value_indexes, self._value_stored

        def picked(key: tuple[Any, ...] | list[Any], data: bytes) -> bytes:
            values = decode(data)
            if folds:
                values = list(values)  # type: ignore[assignment]
                for flag, index, null_when in folds:
                    if bool(values[flag]) is null_when:
                        values[index] = None  # type: ignore[index]
            columns = [values[i] for i in indexes]
            for n, convert in stored:
                columns[n] = convert(columns[n])
            return encode((*key, *columns))

        return picked


def _fails(decode: Callable[[bytes], Any], data: bytes) -> bool:
    try:
        decode(data)
    except UnsafeRowError:
        return True
    return False
