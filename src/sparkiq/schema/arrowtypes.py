"""Arrow types of Spark column types, shared by everything that hands rows to Arrow consumers
(Spark's Python exchange, DuckDB).

Spark's own exchange uses UTC-zoned timestamps (``timestamp_tz="UTC"``); the SQL engine hands
DuckDB naive local wall-clock timestamps, as PySpark shows them (``timestamp_tz=None``).
Lists and maps use Spark's field names (``element``; ``key`` not nullable, ``value``).
"""

from __future__ import annotations

import pyarrow as pa

from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType

__all__ = ["arrow_type"]


def arrow_type(dtype: DataType, *, timestamp_tz: str | None) -> pa.DataType:
    """The Arrow type of a column of ``dtype``; ``timestamp_tz`` zones ``timestamp``."""
    kind = KINDS.get(dtype.name)
    if kind is None:
        raise TypeError(f"no Arrow type for {dtype.simple_string()}")
    if kind.family == "struct":
        return pa.struct(
            [pa.field(f.name, arrow_type(f.type, timestamp_tz=timestamp_tz)) for f in dtype.fields]
        )
    if kind.family == "array":
        assert dtype.element is not None
        return pa.list_(pa.field("element", arrow_type(dtype.element, timestamp_tz=timestamp_tz)))
    if kind.family == "map":
        assert dtype.key is not None and dtype.value is not None
        return pa.map_(
            pa.field("key", arrow_type(dtype.key, timestamp_tz=timestamp_tz), nullable=False),
            pa.field("value", arrow_type(dtype.value, timestamp_tz=timestamp_tz)),
        )
    return kind.arrow_type(dtype, timestamp_tz)
