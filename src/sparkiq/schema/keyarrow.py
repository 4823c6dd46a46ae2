"""Key encoding of whole Arrow columns: the bytes of :meth:`KeyCodec.encode
<sparkiq.schema.keycodec.KeyCodec.encode>`, a column at a time.

The sink encodes every key of a micro-batch; doing it value by value in Python cost more
than the rest of a write task's encoding. Here each key column becomes one binary Arrow
array with Arrow compute and numpy, and the columns of a composite key are joined element
wise. The byte layout is the one documented in :mod:`sparkiq.schema.keycodec` (the tests
compare both encodings on random keys of every key type):

* string, binary: ``0x01``, the bytes with each ``0x00`` escaped as ``0x00 0xFF``, then
  ``0x00 0x01``;
* integers, dates, timestamps: ``0x01`` then the 8-byte big-endian value with its sign bit
  flipped;
* boolean: ``0x01`` then ``0x00`` or ``0x01``;
* null: ``0x00``.

Floats and decimals (rare as keys) are encoded value by value with the codec's own
functions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["encode_int_column", "encode_key_column", "join_key_columns"]

_NULL, _EMPTY, _PRESENT, _TERMINATOR = b"\x00", b"", b"\x01", b"\x00\x01"
_SIGN = np.uint64(1 << 63)


@functools.cache
def _binary(value: bytes) -> pa.Scalar:
    """``value`` as an Arrow binary scalar, made on first use: making one asks pyarrow's
    pandas shim, which imports pandas (a third of a CPU-second), and at import time that
    was paid by every process importing the schema, Spark's planner workers of the
    ``sparkiq`` data source included, which never encode a key column."""
    return pa.scalar(value, pa.binary())


def encode_key_column(
    column: Any, family: str, per_value: Callable[[Any], list[bytes]]
) -> pa.Array:
    """The key encoding of one key column (Array or ChunkedArray) of a kind of ``family``, as
    a binary array; ``per_value`` encodes the column value by value, for the families done
    that way (``float``, ``decimal``)."""
    array = _array(column)
    if family in ("string", "binary"):
        escaped = pc.replace_substring(array.cast(pa.binary()), b"\x00", b"\x00\xff")
        joined = pc.binary_join_element_wise(
            _binary(_PRESENT), escaped, _binary(_TERMINATOR), _binary(_EMPTY)
        )
        return pc.fill_null(joined, _binary(_NULL))
    if family == "int":
        return encode_int_column(array)
    if family == "boolean":
        marked = pc.if_else(array, _binary(b"\x01\x01"), _binary(b"\x01\x00"))
        return pc.fill_null(marked, _binary(_NULL))
    return pa.array(per_value(array), pa.binary())


def encode_int_column(column: Any) -> pa.Array:
    """An integer, date or timestamp column (timestamps in any unit, as microseconds) in the
    key encoding of 64-bit ints."""
    array = _array(column)
    kind = array.type
    if pa.types.is_timestamp(kind):
        if kind.unit != "us":
            array = array.cast(pa.timestamp("us", kind.tz))
        array = array.cast(pa.int64())
    elif pa.types.is_date(kind):
        array = array.cast(pa.int32())
    ints = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
    count = len(ints)
    raw = np.empty((count, 9), np.uint8)
    raw[:, 0] = 1
    flipped = ints.astype(np.int64, copy=False).view(np.uint64) ^ _SIGN
    raw[:, 1:] = flipped.astype(">u8").view(np.uint8).reshape(count, 8)
    offsets = np.arange(0, 9 * count + 1, 9, dtype=np.int32)
    encoded = pa.Array.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(raw)]
    )
    if not array.null_count:
        return encoded
    return pc.if_else(array.is_valid(), encoded, _binary(_NULL))


def join_key_columns(columns: list[pa.Array]) -> pa.Array:
    """The encodings of a composite key's columns, concatenated row by row."""
    if len(columns) == 1:
        return columns[0]
    return pc.binary_join_element_wise(*columns, _binary(_EMPTY))


def _array(column: Any) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    return column
