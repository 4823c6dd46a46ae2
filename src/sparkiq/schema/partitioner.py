"""Spark's hash partitioning, computed in pure Python.

A streaming aggregation keeps the state of a key in the partition that Spark's
``HashPartitioning`` sends it to: ``pmod(hash(k1, k2, ...), P)``, where ``hash`` is Spark's
``Murmur3Hash`` with seed 42. To route a lookup to the right partition without a JVM, this
module recomputes that function bit for bit. It imports nothing from pyspark; the Murmur3
rounds run in C (mmh3).

Contract:

* **Deterministic.** The result depends only on the values, their Spark types and ``P``;
  never on the process, the machine, the Python version or ``PYTHONHASHSEED``.
* **Equal to Spark.** :func:`spark_hash` returns what Spark SQL's ``hash(col1, col2, ...)``
  returns, and :func:`partition_for` what ``pmod(hash(...), P)`` returns, which is the
  partition ``df.repartition(P, col1, col2, ...)`` puts the row in. Spark reads 4-byte
  blocks of strings and binaries in the JVM's native byte order; this module reads them
  little-endian, the order of every platform Spark ships for (x86-64, aarch64).

Keys are passed as *internal values*, the representation every sparkiq layer shares:

==========================  =============================================================
Spark type                  internal value
==========================  =============================================================
string                      ``str`` (hashed as its UTF-8 bytes)
binary                      ``bytes`` (or ``bytearray``)
byte, short, integer, long  ``int`` within the type's range
boolean                     ``bool``
float, double               ``float``; a float column's value is narrowed to float32 first
date                        ``int`` days since 1970-01-01
timestamp, timestamp_ntz    ``int`` microseconds since 1970-01-01 00:00:00 (UTC for
                            ``timestamp``)
decimal(p,s)                ``int`` unscaled value, ``value * 10**s``, with ``|v| < 10**p``
null                        ``None``
==========================  =============================================================

How Spark hashes each value (``hash.scala``, ``Murmur3_x86_32.java``), seed ``h``:

* A null leaves ``h`` unchanged. Column ``i`` is hashed with column ``i-1``'s result as
  seed; the first column's seed is 42.
* boolean, byte, short, integer, date: ``hashInt`` of the value (true is 1, false 0).
* long, timestamp, timestamp_ntz: ``hashLong``, which mixes the low 32-bit word, then the
  high word, and finalizes with length 8.
* float: ``hashInt(floatToIntBits(v))``, double: ``hashLong(doubleToLongBits(v))``; -0.0
  hashes as 0.0 and every NaN as the canonical NaN (0x7fc00000 / 0x7ff8000000000000).
* decimal of precision <= 18: ``hashLong`` of the unscaled value. Larger precision:
  ``hashUnsafeBytes`` of Java's ``BigInteger.toByteArray()`` of the unscaled value: two's
  complement, big-endian, shortest length that keeps the sign bit, so 0 is one byte.
* string, binary: ``hashUnsafeBytes``, which is *not* standard Murmur3 in its tail: after
  the 4-byte blocks, each remaining byte is mixed as its own block, sign-extended (0x80
  becomes 0xffffff80), and the finalizer gets the byte length.

Strings with a non-default collation (``string collate UTF8_LCASE``) hash through the
collation's key, which this module does not implement; they are rejected.
"""

from __future__ import annotations

import reprlib
import struct
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Final

import mmh3

from sparkiq.errors import ConfigError, InvalidQueryError, SchemaError
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType, parse_type

__all__ = ["SPARK_HASH_SEED", "Partitioner", "partition_for", "spark_hash"]

#: Seed of Spark's ``hash()`` and of ``HashPartitioning``.
SPARK_HASH_SEED: Final = 42

#: Largest decimal precision Spark hashes as a long (``Decimal.MAX_LONG_DIGITS``).
_MAX_LONG_DIGITS: Final = 18
_MAX_DECIMAL_PRECISION: Final = 38

# A hasher folds one non-null value into the running hash. Hashes are kept as unsigned
# 32-bit ints internally and turned into Java's signed int only at the end.
_Hasher = Callable[[Any, int], int]

_WORD: Final = struct.Struct("<I")
_FLOAT32: Final = struct.Struct("<f")
_FLOAT64_BITS: Final = struct.Struct("<Q")
_FLOAT64: Final = struct.Struct("<d")


# --- Murmur3_x86_32 as Spark implements it -------------------------------------------------
# The rounds run in C through mmh3 (standard MurmurHash3 x86_32), which is what Spark computes
# for 4- and 8-byte values and for byte strings whose length is a multiple of 4. Spark's
# hashUnsafeBytes differs only in its tail: each trailing byte is mixed as a block of its own,
# sign-extended, and the finalizer gets the original length. So the trailing bytes are
# rewritten as those blocks, mmh3 hashes the result, and the length folded into the hash is
# corrected by undoing the finalizer (fmix is a bijection) and applying it again.
# Hashes are unsigned 32-bit ints throughout and turn into Java's signed int at the end.

_MASK: Final = 0xFFFFFFFF
_FMIX_1: Final = 0x85EBCA6B
_FMIX_2: Final = 0xC2B2AE35
_FMIX_1_INV: Final = pow(_FMIX_1, -1, 1 << 32)
_FMIX_2_INV: Final = pow(_FMIX_2, -1, 1 << 32)
_INT32: Final = struct.Struct("<i")
_INT64: Final = struct.Struct("<q")

# The 4-byte block of each trailing byte value: the byte as Java's signed byte, widened.
_TAIL_BLOCKS: Final = tuple(_INT32.pack(b - 256 if b & 0x80 else b) for b in range(256))


def _hash_int(value: int, seed: int) -> int:
    """Spark's ``hashInt``: one block, finalized with length 4."""
    return _murmur3(_INT32.pack(value if value < 0x80000000 else value - (1 << 32)), seed)


def _hash_long(value: int, seed: int) -> int:
    """Spark's ``hashLong``: the low word, then the high word, finalized with length 8."""
    return _murmur3(_INT64.pack(value if value < (1 << 63) else value - (1 << 64)), seed)


def _hash_bytes(data: bytes | bytearray, seed: int) -> int:
    """Spark's ``hashUnsafeBytes``: little-endian 4-byte blocks, then one block per byte."""
    if not len(data) & 3:
        return _murmur3(data, seed)
    return _hash_with_tail(data if data.__class__ is bytes else bytes(data), seed)


# The tail's correction is some 20 operations on Python ints (about 1 us, 40 times mmh3's
# own work), and the same values come back: hot keys, and the leading columns of composite
# keys, which have few distinct values (airline codes, countries). So its results are kept,
# for a bounded number of (bytes, seed) pairs (thread-safe; a miss costs about 0.1 us).
@lru_cache(maxsize=1 << 14)
def _hash_with_tail(data: bytes, seed: int) -> int:
    """:func:`_hash_bytes` of a value whose length is not a multiple of 4."""
    length = len(data)
    tail = length & 3
    blocks = _TAIL_BLOCKS
    body = data[: length - tail]
    if tail == 1:
        data = body + blocks[data[-1]]
    elif tail == 2:
        data = body + blocks[data[-2]] + blocks[data[-1]]
    else:
        data = body + blocks[data[-3]] + blocks[data[-2]] + blocks[data[-1]]
    # mmh3 folded len(data) into the hash before finalizing; Spark folds the original length.
    h = _murmur3(data, seed)
    h ^= h >> 16  # undo fmix...
    h = (h * _FMIX_2_INV) & _MASK
    h ^= (h >> 13) ^ (h >> 26)
    h = (h * _FMIX_1_INV) & _MASK
    h ^= (h >> 16) ^ len(data) ^ length  # ...swap the length...
    h ^= h >> 16  # ...and finalize again
    h = (h * _FMIX_1) & _MASK
    h ^= h >> 13
    h = (h * _FMIX_2) & _MASK
    return h ^ (h >> 16)


def _murmur3(data: bytes | bytearray, seed: int) -> int:
    """Standard MurmurHash3 x86_32 as an unsigned int (mmh3 takes bytes, not bytearray)."""
    return mmh3.hash(data if data.__class__ is bytes else bytes(data), seed, signed=False)


_murmur3_signed: Final = mmh3.hash  # bytes, seed -> signed 32-bit (Java's int)


# --- one hasher per Spark type ---------------------------------------------------------------


class _BadValue(Exception):
    """Raised by a hasher for a value its type cannot hold; turned into InvalidQueryError."""


def _is_int(value: Any) -> bool:
    # bool is an int to Python, but a bool for a numeric column is a caller's mistake.
    return value.__class__ is int or (isinstance(value, int) and not isinstance(value, bool))


def _int_hasher(bits: int) -> _Hasher:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    mix = _hash_int if bits <= 32 else _hash_long

    def hasher(value: Any, seed: int) -> int:
        if not _is_int(value) or not low <= value <= high:
            raise _BadValue
        return mix(value, seed)

    return hasher


def _hash_boolean(value: Any, seed: int) -> int:
    if value is True:
        return _hash_int(1, seed)
    if value is False:
        return _hash_int(0, seed)
    raise _BadValue


def _hash_float(value: Any, seed: int) -> int:
    if value.__class__ is bool:
        raise _BadValue
    if value != value:
        return _hash_int(0x7FC00000, seed)
    try:
        bits = _WORD.unpack(_FLOAT32.pack(value))[0]
    except OverflowError:
        # Java's (float) narrowing rounds values beyond float32's range to infinity.
        bits = 0x7F800000 if value > 0 else 0xFF800000
    # -0.0 hashes as +0.0; tested after narrowing, since a tiny negative double becomes -0.0f.
    return _hash_int(0 if bits == 0x80000000 else bits, seed)


def _hash_double(value: Any, seed: int) -> int:
    if value.__class__ is bool:
        raise _BadValue
    if value != value:
        return _hash_long(0x7FF8000000000000, seed)
    if value == 0:
        return _hash_long(0, seed)
    return _hash_long(_FLOAT64_BITS.unpack(_FLOAT64.pack(value))[0], seed)


def _hash_string(value: Any, seed: int) -> int:
    if not isinstance(value, str):
        raise _BadValue
    return _hash_bytes(value.encode("utf-8"), seed)


def _hash_binary(value: Any, seed: int) -> int:
    if not isinstance(value, (bytes, bytearray)):
        raise _BadValue
    return _hash_bytes(value, seed)


def _decimal_hasher(precision: int) -> _Hasher:
    limit = 10**precision

    if precision <= _MAX_LONG_DIGITS:

        def small(value: Any, seed: int) -> int:
            if not _is_int(value) or not -limit < value < limit:
                raise _BadValue
            return _hash_long(value, seed)

        return small

    def large(value: Any, seed: int) -> int:
        if not _is_int(value) or not -limit < value < limit:
            raise _BadValue
        # BigInteger.toByteArray(): the shortest two's complement that keeps the sign bit.
        magnitude = value if value >= 0 else ~value
        return _hash_bytes(
            value.to_bytes(magnitude.bit_length() // 8 + 1, "big", signed=True), seed
        )

    return large


# By the kind's internal representation (:attr:`~sparkiq.schema.kinds.Kind.family`) and
# width: what Spark's ``hash`` does with a value of that representation.
_FAMILY_HASHERS: Final[dict[str, Callable[[int], _Hasher]]] = {
    "string": lambda bits: _hash_string,
    "binary": lambda bits: _hash_binary,
    "boolean": lambda bits: _hash_boolean,
    "int": _int_hasher,
    "float": lambda bits: _hash_float if bits == 32 else _hash_double,
}

_SUPPORTED = ", ".join(
    [*(k.name for k in KINDS.values() if k.key and k.family != "decimal"), "decimal(p,s)"]
)


@lru_cache(maxsize=512)
def _hasher_for(dtype: DataType) -> tuple[_Hasher, str]:
    """The hasher of one type and a description of the values it accepts."""
    kind = KINDS.get(dtype.name)
    if kind is not None and kind.family in _FAMILY_HASHERS:
        return _FAMILY_HASHERS[kind.family](kind.bits), kind.expects
    if kind is not None and kind.family == "decimal":
        if not 1 <= dtype.precision <= _MAX_DECIMAL_PRECISION:
            raise InvalidQueryError(
                f"type {dtype.simple_string()!r} is not a valid Spark decimal: "
                f"precision must be between 1 and {_MAX_DECIMAL_PRECISION}"
            )
        expects = (
            f"an int, the unscaled value (value * 10**{dtype.scale}), "
            f"with fewer than {dtype.precision} digits"
        )
        return _decimal_hasher(dtype.precision), expects
    hint = ""
    if dtype.name.startswith("string collate"):
        hint = " (only the default UTF8_BINARY collation is supported)"
    raise InvalidQueryError(
        f"type {dtype.simple_string()!r} cannot be hashed as a key column{hint}; "
        f"supported key types: {_SUPPORTED}"
    )


@lru_cache(maxsize=512)
def _parse(name: str) -> DataType:
    return parse_type(name)


def _resolve(spec: DataType | str) -> DataType:
    if isinstance(spec, DataType):
        return spec
    try:
        return parse_type(spec) if not isinstance(spec, str) else _parse(spec)
    except (SchemaError, KeyError, TypeError) as exc:  # TypeError, KeyError: a malformed doc
        raise InvalidQueryError(
            f"key type {spec!r} is neither a DataType nor a Spark type name such as "
            f"'string' or 'decimal(10,2)'"
        ) from exc


# The types of a key, resolved, and one hasher (with what it accepts) per column.
_Compiled = tuple[tuple[DataType, ...], tuple[_Hasher, ...], tuple[str, ...]]


def _build(types: tuple[DataType | str, ...]) -> _Compiled:
    if not types:
        raise InvalidQueryError("a key needs at least one column type; got none")
    resolved = tuple(_resolve(t) for t in types)
    specs = [_hasher_for(t) for t in resolved]
    return resolved, tuple(h for h, _ in specs), tuple(e for _, e in specs)


_build_cached = lru_cache(maxsize=512)(_build)


def _compile(types: Sequence[DataType | str]) -> _Compiled:
    key = types if isinstance(types, tuple) else tuple(types)
    try:
        return _build_cached(key)
    except TypeError:
        # An unhashable entry (a JSON dict for a type) cannot be a cache key; resolve it
        # directly, which raises a clear error unless it names a key type.
        return _build(key)


def _run(compiled: _Compiled, values: Sequence[Any]) -> int:
    """The unsigned 32-bit Murmur3 hash of a key, folding columns left to right."""
    resolved, hashers, _ = compiled
    if len(values) != len(hashers):
        raise InvalidQueryError(
            f"key has {len(values)} value(s) but {len(hashers)} key column(s) of types "
            f"[{', '.join(t.simple_string() for t in resolved)}]; pass one value per column"
        )
    h = SPARK_HASH_SEED
    try:
        for hasher, value in zip(hashers, values, strict=True):
            if value is not None:
                h = hasher(value, h)
    except _VALUE_ERRORS as exc:
        raise _invalid_value(compiled, values) from exc
    return h


# What a hasher raises for a value its type cannot hold: its own check, or Python's when an
# operation does not apply (a str where an int belongs, a lone surrogate in UTF-8...).
_VALUE_ERRORS: Final = (_BadValue, TypeError, ValueError, OverflowError, struct.error)


def _invalid_value(compiled: _Compiled, values: Sequence[Any]) -> InvalidQueryError:
    """Describe the first value its column's type cannot hold (whether one can does not
    depend on the seed, so each column is retried alone)."""
    resolved, hashers, expects = compiled
    for i, (hasher, value) in enumerate(zip(hashers, values, strict=True)):
        try:
            if value is not None:
                hasher(value, SPARK_HASH_SEED)
        except _VALUE_ERRORS:
            return InvalidQueryError(
                f"key column {i} has type {resolved[i].simple_string()}: expected "
                f"{expects[i]} or None, got {reprlib.repr(value)}"
            )
    return InvalidQueryError(f"key {reprlib.repr(values)} cannot be hashed")


def _signed(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


class Partitioner:
    """Maps a key to the partition Spark's hash partitioning assigns it.

    ``Partitioner(types, partitions)(values)`` equals Spark's
    ``pmod(hash(col1, col2, ...), partitions)`` for the key ``values`` (internal values,
    one per entry of ``types``; see the module docstring). The types are resolved and one
    hash function per column is chosen once, at construction; calls are deterministic and
    safe from any thread. Instances are immutable and compare equal when their types and
    partition counts are equal.

    Raises :class:`~sparkiq.errors.ConfigError` if ``partitions`` is not a positive int,
    :class:`~sparkiq.errors.InvalidQueryError` for a type that cannot be a key and, on a
    call, for a key of the wrong arity or a value its column's type cannot hold.
    """

    __slots__ = ("_compiled", "_partitions", "_single")

    def __init__(self, types: Sequence[DataType | str], partitions: int) -> None:
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigError(f"partitions must be a positive int, got {partitions!r}")
        self._compiled = _compile(types)
        self._partitions = partitions
        hashers = self._compiled[1]
        self._single: _Hasher | None = hashers[0] if len(hashers) == 1 else None

    @property
    def types(self) -> tuple[DataType, ...]:
        return self._compiled[0]

    @property
    def partitions(self) -> int:
        return self._partitions

    def hash(self, values: Sequence[Any]) -> int:
        """Spark's ``hash(col1, col2, ...)`` of the key: a signed 32-bit int."""
        return _signed(_run(self._compiled, values))

    def __call__(self, values: Sequence[Any]) -> int:
        """The key's partition, in ``range(self.partitions)``."""
        single = self._single
        if single is not None and len(values) == 1:  # the common case, without the loop
            value = values[0]
            if single is _hash_string and value.__class__ is str and value.isascii():
                # The commonest key, checked already (ASCII has no lone surrogates). Spark's
                # hashUnsafeBytes is plain Murmur3 for whole 4-byte blocks, and mmh3's signed
                # result is then Java's int: pmod is Python's % of a positive divisor.
                data = value.encode()
                if not len(data) & 3:
                    return _murmur3_signed(data, SPARK_HASH_SEED) % self._partitions
                h = _hash_bytes(data, SPARK_HASH_SEED)
            else:
                try:
                    h = SPARK_HASH_SEED if value is None else single(value, SPARK_HASH_SEED)
                except _VALUE_ERRORS as exc:
                    raise _invalid_value(self._compiled, values) from exc
        else:
            h = _run(self._compiled, values)
        # Spark takes pmod of the *signed* hash; Python's % of a positive divisor is pmod.
        return (h - 0x100000000 if h & 0x80000000 else h) % self._partitions

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partitioner):
            return NotImplemented
        return self.types == other.types and self._partitions == other._partitions

    def __hash__(self) -> int:
        return hash((self.types, self._partitions))

    def __repr__(self) -> str:
        names = ", ".join(t.simple_string() for t in self.types)
        return f"Partitioner(types=[{names}], partitions={self._partitions})"


@lru_cache(maxsize=256, typed=True)
def _partitioner(types: tuple[DataType | str, ...], partitions: int) -> Partitioner:
    return Partitioner(types, partitions)


def spark_hash(values: Sequence[Any], types: Sequence[DataType | str]) -> int:
    """Spark's ``hash(col1, col2, ...)`` (Murmur3Hash, seed 42): a signed 32-bit int.

    ``values`` are internal values, one per entry of ``types``; ``None`` is null.
    """
    return _signed(_run(_compile(types), values))


def partition_for(values: Sequence[Any], types: Sequence[DataType | str], partitions: int) -> int:
    """``pmod(hash(col1, col2, ...), partitions)``: the partition Spark assigns the key.

    Equivalent to ``Partitioner(types, partitions)(values)``, with the partitioner cached.
    """
    key = types if isinstance(types, tuple) else tuple(types)
    try:
        partitioner = _partitioner(key, partitions)
    except TypeError:  # unhashable type entry; Partitioner reports it
        partitioner = Partitioner(key, partitions)
    return partitioner(values)
