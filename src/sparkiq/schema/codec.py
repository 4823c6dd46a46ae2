"""Key and row codecs of a table: one import path for both.

- :class:`~sparkiq.schema.keycodec.KeyCodec` validates the keys callers pass and encodes
  them so that byte order equals the key's natural order (for ordered stores and ranges).
- :class:`~sparkiq.schema.rowcodec.RowCodec` encodes whole rows from Arrow as MessagePack
  and decodes them to exactly what PySpark's ``Row.asDict(recursive=True)`` gives.

Both are pure Python over pyarrow and msgspec and never import pyspark, so serving nodes
and clients can use them without a JVM. Their byte formats are documented in their modules.
"""

from __future__ import annotations

from sparkiq.schema.internal import (
    date_from_internal,
    date_to_internal,
    decimal_from_internal,
    decimal_unscaled,
    timestamp_from_internal,
    timestamp_ntz_from_internal,
    timestamp_ntz_to_internal,
    timestamp_to_internal,
)
from sparkiq.schema.keycodec import KEY_FORMAT_VERSION, KeyCodec, prefix_end
from sparkiq.schema.rowcodec import ROW_FORMAT_VERSION, RowCodec

__all__ = [
    "KEY_FORMAT_VERSION",
    "ROW_FORMAT_VERSION",
    "KeyCodec",
    "RowCodec",
    "date_from_internal",
    "date_to_internal",
    "decimal_from_internal",
    "decimal_unscaled",
    "prefix_end",
    "timestamp_from_internal",
    "timestamp_ntz_from_internal",
    "timestamp_ntz_to_internal",
    "timestamp_to_internal",
]
