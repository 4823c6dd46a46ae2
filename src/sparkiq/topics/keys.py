"""Record keys of a topic: their two formats, and the partition Kafka gives each key.

Key formats (``key_format``)
    ``json`` (the default): UTF-8 JSON, compact (no spaces, non-ASCII characters as
    themselves, not escaped). One key column: the bare value (``"u-1"``, ``42``); several: an
    object of the key columns in key order (``{"carrier":"AA","flight":17}``). Values follow
    :mod:`sparkiq.topics.jsonvalues`.

    ``kafka`` (ksqlDB's KAFKA format; one key column only): STRING as raw UTF-8, INT as 4
    bytes and BIGINT as 8 bytes big-endian signed, DOUBLE as 8-byte big-endian IEEE 754.

Partitioning
    Kafka's default partitioner (the Java client's, which Kafka Streams, ksqlDB and Kafka
    Connect use) puts a record with key bytes ``k`` in partition
    ``(murmur2(k) & 0x7fffffff) % partitions``. :class:`Murmur2Partitioner` computes that over
    the key encoded in its format, so a lookup asks the partition the producer wrote to.
    It is deterministic (only the key, its format and the partition count matter), and equal
    to the broker's choice only when the producer encodes keys exactly as above and
    partitions them with murmur2 (librdkafka's default is CRC32: confluent-kafka producers
    set ``"partitioner": "murmur2_random"``). A follower therefore places each row by this
    function, not by the partition it was read from (:mod:`sparkiq.topics.source`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any, Final

from sparkiq.errors import ConfigError
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.topics.jsonvalues import BadValue, reader, write_key_value

__all__ = [
    "KEY_FORMATS",
    "KeyFormat",
    "Murmur2Partitioner",
    "check_key_format",
    "murmur2",
    "table_partitioner",
]

KEY_FORMATS: Final = ("json", "kafka")
#: The ``partitioning`` of a table manifest whose keys are placed by Kafka's partitioner
#: over the key in ``<format>``: ``kafka-murmur2-<format>``.
PARTITIONING_PREFIX: Final = "kafka-murmur2-"

_M: Final = 0x5BD1E995
_MASK: Final = 0xFFFFFFFF
_SEED: Final = 0x9747B28C
# The KAFKA key format's fixed-width types (by Spark type name) and their struct formats.
_KAFKA_BINARY: Final = {"integer": struct.Struct(">i"), "long": struct.Struct(">q")}
_KAFKA_DOUBLE: Final = struct.Struct(">d")


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` of ``data``, as an unsigned 32-bit int (MurmurHash2 with
    Kafka's seed ``0x9747b28c``, 4-byte little-endian blocks, then the tail)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length & ~3
    for i in range(0, whole, 4):
        k = (data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24) * _M & _MASK
        k ^= k >> 24
        h = (h * _M & _MASK) ^ (k * _M & _MASK)
    tail = length & 3
    if tail:
        if tail == 3:
            h ^= data[whole + 2] << 16
        if tail >= 2:
            h ^= data[whole + 1] << 8
        h = ((h ^ data[whole]) * _M) & _MASK
    h ^= h >> 13
    h = h * _M & _MASK
    return h ^ (h >> 15)


def check_key_format(key_format: str, schema: TableSchema) -> None:
    """Refuse a key format the table's key columns cannot use, saying what to do."""
    if key_format not in KEY_FORMATS:
        raise ConfigError(f"key_format must be one of {list(KEY_FORMATS)}, got {key_format!r}")
    if key_format == "json":
        for column, dtype in zip(schema.key_columns, schema.key_types, strict=True):
            if dtype.name in ("float", "double"):
                # Python and Java spell some floats differently in JSON (1e+16 / 1.0E16):
                # the bytes, and so the partition, would not match the producer's.
                raise ConfigError(
                    f"key column {column!r} is {dtype.simple_string()}: a floating-point key "
                    "is not placed reliably from JSON; use key_format='kafka' (one DOUBLE key) "
                    "or a key of another type"
                )
        return
    if len(schema.key_columns) != 1:
        raise ConfigError(
            f"key_format='kafka' holds one key column, the table has "
            f"{list(schema.key_columns)}: use key_format='json' for a composite key"
        )
    dtype = schema.key_types[0]
    if dtype.name not in ("string", "double", *_KAFKA_BINARY):
        raise ConfigError(
            f"key_format='kafka' holds STRING, INT, BIGINT or DOUBLE keys; key column "
            f"{schema.key_columns[0]!r} is {dtype.simple_string()}: use key_format='json'"
        )


class KeyFormat:
    """Reads and writes the record keys of one table in one format (see the module
    docstring). Immutable; thread-safe."""

    def __init__(self, schema: TableSchema, key_format: str) -> None:
        check_key_format(key_format, schema)
        self.schema = schema
        self.format = key_format
        self._codec = KeyCodec(schema)
        self._columns = schema.key_columns
        self._types = schema.key_types
        self._readers = tuple(reader(t, c) for c, t in zip(self._columns, self._types, strict=True))

    def read(self, data: bytes) -> tuple[Any, ...]:
        """The internal key of a record's key bytes; :class:`BadValue` when they are not one."""
        if self.format == "kafka":
            return (self._read_kafka(data),)
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise BadValue(f"the key is not JSON: {bytes(data[:40])!r}") from None
        if len(self._columns) == 1:
            values: Any = self._value(0, doc)
        else:
            if not isinstance(doc, dict):
                raise BadValue(
                    f"the key must be a JSON object of {list(self._columns)}, got {doc!r:.60}"
                )
            values = tuple(self._value(i, doc.get(c)) for i, c in enumerate(self._columns))
        try:
            return self._codec.to_internal(values)
        except Exception as exc:  # the codec's own validation: a value it cannot hold
            raise BadValue(f"the key does not fit the key columns: {exc}") from None

    def _value(self, index: int, value: Any) -> Any:
        if value is None:
            raise BadValue(f"key column {self._columns[index]!r} is null or missing")
        return self._readers[index](value)

    def _read_kafka(self, data: bytes) -> Any:
        dtype = self._types[0]
        if dtype.name == "string":
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise BadValue(f"the key is not UTF-8: {bytes(data[:40])!r}") from None
        layout = _KAFKA_BINARY.get(dtype.name, _KAFKA_DOUBLE)
        if len(data) != layout.size:
            raise BadValue(
                f"a {dtype.simple_string()} key is {layout.size} bytes, got {len(data)} bytes"
            )
        return layout.unpack(data)[0]

    def write(self, internal: Sequence[Any]) -> bytes:
        """The key bytes of an internal key, as the format writes them."""
        if self.format == "kafka":
            value, dtype = internal[0], self._types[0]
            if dtype.name == "string":
                return str(value).encode()
            return _KAFKA_BINARY.get(dtype.name, _KAFKA_DOUBLE).pack(value)
        shown = self._codec.from_internal(tuple(internal))
        if len(self._columns) == 1:
            doc: Any = write_key_value(shown, self._types[0])
        else:
            doc = {
                c: write_key_value(v, t)
                for c, v, t in zip(self._columns, shown, self._types, strict=True)
            }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


class Murmur2Partitioner(Partitioner):
    """Kafka's default partitioner over a key in its record format: ``(murmur2(key bytes) &
    0x7fffffff) % partitions`` (see the module docstring). A drop-in for
    :class:`~sparkiq.schema.partitioner.Partitioner` wherever a table's keys are located;
    :meth:`hash` is Kafka's positive murmur2, not Spark's hash."""

    __slots__ = ("_format",)

    def __init__(self, key_format: KeyFormat, partitions: int) -> None:
        super().__init__(key_format.schema.key_types, partitions)
        self._format = key_format

    @property
    def key_format(self) -> KeyFormat:
        return self._format

    def hash(self, values: Sequence[Any]) -> int:
        return murmur2(self._format.write(values)) & 0x7FFFFFFF

    def __call__(self, values: Sequence[Any]) -> int:
        return (murmur2(self._format.write(values)) & 0x7FFFFFFF) % self.partitions

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Murmur2Partitioner):
            return NotImplemented
        return (
            self.types == other.types
            and self.partitions == other.partitions
            and self._format.format == other._format.format
        )

    def __hash__(self) -> int:
        return hash((self.types, self.partitions, self._format.format))

    def __repr__(self) -> str:
        return (
            f"Murmur2Partitioner(key_format={self._format.format!r}, partitions={self.partitions})"
        )


def table_partitioner(schema: TableSchema, partitions: int, partitioning: str) -> Partitioner:
    """The partitioner a table's manifest names: ``spark`` (Spark's hash partitioning) or
    ``kafka-murmur2-<key format>`` (:class:`Murmur2Partitioner`)."""
    if partitioning.startswith(PARTITIONING_PREFIX):
        key_format = KeyFormat(schema, partitioning[len(PARTITIONING_PREFIX) :])
        return Murmur2Partitioner(key_format, partitions)
    return Partitioner(schema.key_types, partitions)
