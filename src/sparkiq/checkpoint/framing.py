"""The row framing of Spark's RocksDB state store provider: what a key and a value are.

:mod:`sparkiq.checkpoint.rocksdb` finds a store's raw keys and values in the provider's files;
a :class:`RowFraming` turns each into the UnsafeRow bytes the row decoder reads, so the same
decoder serves both providers. A :class:`RocksDBEncoding` says how one store is framed
(``RocksDBStateEncoder.scala`` writes it).

The key prefix of a virtual column family (transformWithState keeps every state variable in
RocksDB's default column family, each under its id, :func:`family_prefix`) is removed by the
files reader, so the framing sees the keys of one store alone.

UnsafeRow format (the default ``encodingFormat``):

- a row is ``0x00`` (encoding version) + the UnsafeRow bytes;
- ``NoPrefixKeyStateEncoderSpec`` keys are one such row; ``PrefixKeyScanStateEncoderSpec``
  keys are ``int32 LE len(prefix)`` + prefix row (the first N key columns) + row of the rest,
  rejoined here into one row of the key schema (each part checked to be a whole row of its
  columns first: joined, a cut-short part would decode as other values, never as an error);
- a single value is one row; a multi-value (list state) value is ``int32 LE len`` + row per
  element; RocksDB's string-append merge operator puts ``,`` between merged operands
  (``mergeOperatorVersion`` 1; version 2 puts nothing, but a snapshot is merged by RocksDB's
  default ``,`` operator). An element is ``0x00`` + an UnsafeRow, so its length is 1 modulo
  8 and can never start with ``,`` (0x2C): the delimiter is recognised without knowing the
  version. A changelog merge record appends elements.

Avro format (``spark.sql.streaming.stateStore.encodingFormat=avro``, ``AvroStateEncoder``;
transformWithState only -- the stores of other operators keep UnsafeRows): the same framing
with Avro binary rows (:mod:`sparkiq.checkpoint.avro`) in place of UnsafeRows, and a schema
id after the version byte:

- a ``NoPrefixKeyStateEncoderSpec`` key and every value: ``0x00`` + ``int16 LE`` schema id +
  the Avro row;
- a ``PrefixKeyScanStateEncoderSpec`` key: ``int32 LE len(prefix)`` + ``0x00`` + the prefix
  columns' Avro row (no schema id), then ``0x00`` + schema id + the other columns' Avro row;
- list state: ``int32 LE len`` + value per element, as above; an element's length says
  nothing about the delimiter here, so the elements are split where the whole value parses.

The schema ids are those of the column family in the state schema file; a row written under
another id (a query that evolved its state schema) is refused by name, never decoded by the
wrong schema. Each row is converted to UnsafeRow bytes, so everything downstream is shared.

Not supported (an error, never a wrong row): ``RangeKeyScan`` keys (only Spark's internal
timer and TTL index column families use them), encoding versions other than 0 and Avro rows
of an evolved schema. The framing makes no error of its own: the files reader that owns it
passes the functions that make them, so every error names the operator, partition and file.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from sparkiq.checkpoint.avro import AvroRowCodec, AvroStateError
from sparkiq.checkpoint.unsaferow import UnsafeRowError, field_is_variable, join_rows
from sparkiq.errors import ChangelogError
from sparkiq.schema.types import DataType

__all__ = ["Fault", "RocksDBEncoding", "RowFraming", "family_prefix"]

#: Makes the error for a message (its owner adds the operator, partition and file).
Fault = Callable[[str], ChangelogError]

#: ``int32`` little-endian, as Spark's ``Platform.putInt`` writes it on every platform it runs on.
_LE_INT = struct.Struct("<i")
_LE_SHORT = struct.Struct("<h")
_ROW_VERSION = 0


def family_prefix(family_id: int) -> bytes:
    """The bytes every key of virtual column family ``family_id`` starts with (its id as
    ``int16 LE``; the ids are the ``columnFamilyMapping`` of a snapshot's metadata)."""
    return _LE_SHORT.pack(family_id)


@dataclass(frozen=True, slots=True)
class RocksDBEncoding:
    """How one store's rows are framed in RocksDB.

    ``column_family`` is the virtual column family (a transformWithState state variable),
    None when the store owns the whole database (aggregations, dropDuplicates, joins...).
    ``key_schema`` is the store's key struct; ``prefix_columns`` > 0 means
    ``PrefixKeyScanStateEncoderSpec`` with that many leading columns. ``multi_value`` marks
    list state. ``row_format`` is Spark's ``encodingFormat``: ``"unsaferow"`` or ``"avro"``;
    Avro rows also need the ``value_schema`` (one list element's, for list state) and the
    schema ids the state schema file gives the column family.
    """

    key_schema: DataType
    column_family: str | None = None
    prefix_columns: int = 0
    range_scan: bool = False
    multi_value: bool = False
    row_format: str = "unsaferow"
    value_schema: DataType | None = None
    key_schema_id: int = 0
    value_schema_id: int = 0


class RowFraming:
    """The keys and values of one store, as :class:`RocksDBEncoding` frames them, turned into
    UnsafeRow bytes.

    Immutable once built, so safe to share between threads. Building it refuses an encoding
    it cannot read (``unsupported``; ``error`` when Avro rows come without a value schema);
    a key or value that does not parse raises ``corrupt``'s error, one of another encoding
    version or schema id ``unsupported``'s. Nothing is returned from a row that fails.
    """

    def __init__(
        self, encoding: RocksDBEncoding, *, error: Fault, corrupt: Fault, unsupported: Fault
    ) -> None:
        self._enc = encoding
        self._corrupt = corrupt
        self._unsupported = unsupported
        row_format = encoding.row_format.lower()
        if row_format not in ("unsaferow", "avro"):
            raise unsupported(
                f"row encoding {encoding.row_format!r}: supported are 'unsaferow' and 'avro' "
                "(spark.sql.streaming.stateStore.encodingFormat)"
            )
        if encoding.range_scan:
            raise unsupported(
                "RangeKeyScanStateEncoderSpec keys: supported are NoPrefixKeyStateEncoderSpec "
                "and PrefixKeyScanStateEncoderSpec"
            )
        fields = encoding.key_schema.fields
        # prefix-scan keys: which columns of the prefix and of the rest are variable-length,
        # to rejoin the two rows
        self._split: tuple[tuple[bool, ...], tuple[bool, ...]] | None = None
        if encoding.prefix_columns:
            var = tuple(field_is_variable(f.type) for f in fields)
            self._split = (var[: encoding.prefix_columns], var[encoding.prefix_columns :])
        # Avro: one codec per encoded part -- the whole key (or its prefix and the rest) and
        # the value; None for UnsafeRows
        self._avro: tuple[AvroRowCodec, AvroRowCodec | None, AvroRowCodec] | None = None
        if row_format == "avro":
            if encoding.value_schema is None:
                raise error("Avro-encoded state needs the store's value schema")
            self._avro = self._avro_codecs(encoding.value_schema)

    def unframe_key(self, key: bytes) -> bytes:
        """A raw key (column family prefix removed) as one UnsafeRow of the key schema."""
        avro = self._avro
        if self._split is None:
            if avro is not None:
                return self._avro_row(key, avro[0], "key", self._enc.key_schema_id)
            return self._row(key, "key")
        if len(key) < 4:
            raise self._corrupt("prefix-scan key shorter than its length field")
        (size,) = _LE_INT.unpack_from(key, 0)
        if size < 1 or 4 + size > len(key):
            raise self._corrupt(f"prefix-scan key prefix of {size} bytes overruns the key")
        if avro is not None:
            assert avro[1] is not None
            left = self._avro_row(key[4 : 4 + size], avro[0], "key prefix", None)
            right = self._avro_row(
                key[4 + size :], avro[1], "key remainder", self._enc.key_schema_id
            )
        else:
            left = self._row(key[4 : 4 + size], "key prefix")
            right = self._row(key[4 + size :], "key remainder")
        try:
            return join_rows(left, self._split[0], right, self._split[1])
        except UnsafeRowError as exc:
            # a part cut short or pointing outside itself: joined, it would read as a null
            # or as the other part's bytes
            raise self._corrupt(f"prefix-scan key of {len(key)} bytes: {exc}") from None

    def unframe_value(self, value: bytes) -> bytes:
        """A raw single value (or one list element) as its UnsafeRow bytes."""
        if self._avro is not None:
            return self._avro_row(value, self._avro[2], "value", self._enc.value_schema_id)
        return self._row(value, "value")

    def unframe_values(self, value: bytes) -> list[bytes]:
        """A raw multi-value (list state) value as the UnsafeRow bytes of its elements, in
        append order."""
        if self._avro is not None:
            return [self.unframe_value(element) for element in self._avro_elements(value)]
        out: list[bytes] = []
        pos, end = 0, len(value)
        while pos < end:
            if pos + 4 > end:
                raise self._corrupt("list value ends inside an element length")
            (size,) = _LE_INT.unpack_from(value, pos)
            pos += 4
            if size % 8 != 1 or pos + size > end:
                raise self._corrupt(f"list element of {size} bytes does not fit its value")
            out.append(self.unframe_value(value[pos : pos + size]))
            pos += size
            if value[pos : pos + 1] == b",":
                pos += 1
        return out

    def _avro_codecs(
        self, value_schema: DataType
    ) -> tuple[AvroRowCodec, AvroRowCodec | None, AvroRowCodec]:
        enc = self._enc
        fields = enc.key_schema.fields
        try:
            if enc.prefix_columns:
                head = DataType("struct", fields=fields[: enc.prefix_columns])
                rest = DataType("struct", fields=fields[enc.prefix_columns :])
                return AvroRowCodec(head), AvroRowCodec(rest), AvroRowCodec(value_schema)
            return AvroRowCodec(enc.key_schema), None, AvroRowCodec(value_schema)
        except AvroStateError as exc:
            raise self._unsupported(f"Avro state: {exc}") from None

    def _row(self, data: bytes, what: str) -> bytes:
        if not data or data[0] != _ROW_VERSION:
            found = f"version byte {data[0]}" if data else "no bytes"
            raise self._unsupported(f"{what} with {found}: only encoding version 0 is known")
        return data[1:]

    def _avro_row(
        self, data: bytes, codec: AvroRowCodec, what: str, schema_id: int | None
    ) -> bytes:
        """An Avro part (version byte, then the schema id unless ``schema_id`` is None) as
        UnsafeRow bytes."""
        body = self._row(data, what)
        if schema_id is not None:
            if len(body) < 2:
                raise self._corrupt(f"{what} ends inside its schema id")
            (found,) = _LE_SHORT.unpack_from(body, 0)
            if found != schema_id:
                raise self._unsupported(
                    f"{what} written with state schema id {found}, but the state schema file "
                    f"describes id {schema_id}: rows of an evolved state schema are not "
                    "decoded; restart the query from a new checkpoint to serve it"
                )
            body = body[2:]
        try:
            return codec.unsafe_row(body)
        except AvroStateError as exc:
            raise self._corrupt(f"{what}: {exc}") from None

    def _avro_elements(self, value: bytes) -> list[bytes]:
        """The encoded elements of an Avro list value. Each is ``int32 LE len`` + bytes that
        start with the version byte and a schema id; a ``,`` may follow each one (merge
        operator version 1, or RocksDB's own merge of a snapshot). Where a ``,`` could also
        be the low byte of the next length, the split that parses the whole value wins."""
        end = len(value)
        # every position an element can start at, with the positions the next one can
        # start at (right after it, or after a "," delimiter)
        nexts: dict[int, tuple[int, ...]] = {}
        todo = [0]
        while todo:
            pos = todo.pop()
            if pos in nexts or pos == end:
                continue
            nexts[pos] = ()
            if pos + 4 > end:
                continue
            (size,) = _LE_INT.unpack_from(value, pos)
            stop = pos + 4 + size
            if size < 3 or stop > end or value[pos + 4] != _ROW_VERSION:
                continue
            after = (stop + 1, stop) if value[stop : stop + 1] == b"," else (stop,)
            nexts[pos] = after
            todo.extend(after)
        parses = {end}  # positions from which the rest of the value splits into elements
        for pos in sorted(nexts, reverse=True):  # a successor always lies further on
            if any(n in parses for n in nexts[pos]):
                parses.add(pos)
        if 0 not in parses:
            raise self._corrupt("list value does not split into length-prefixed elements")
        found: list[bytes] = []
        pos = 0
        while pos != end:
            (size,) = _LE_INT.unpack_from(value, pos)
            found.append(value[pos + 4 : pos + 4 + size])
            pos = next(n for n in nexts[pos] if n in parses)
        return found
