"""Arrow types of Spark column types, shared by everything that hands rows to Arrow consumers
(Spark's Python exchange, DuckDB).

Spark's own exchange uses UTC-zoned timestamps (``timestamp_tz="UTC"``); the SQL engine hands
DuckDB naive local wall-clock timestamps, as PySpark shows them (``timestamp_tz=None``).
Lists and maps use Spark's field names (``element``; ``key`` not nullable, ``value``).
"""

from __future__ import annotations

import pyarrow as pa

from sparkiq.schema.types import DataType

__all__ = ["SCALAR_ARROW_TYPES", "arrow_type"]

#: Spark types whose Arrow type has no parameters (timestamps get their zone in arrow_type).
SCALAR_ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "byte": pa.int8(),
    "short": pa.int16(),
    "integer": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
}


def arrow_type(dtype: DataType, *, timestamp_tz: str | None) -> pa.DataType:
    """The Arrow type of a column of ``dtype``; ``timestamp_tz`` zones ``timestamp``."""
    kind = dtype.name
    scalar = SCALAR_ARROW_TYPES.get(kind)
    if scalar is not None:
        return scalar
    if kind == "timestamp":
        return pa.timestamp("us", tz=timestamp_tz)
    if kind == "decimal":
        return pa.decimal128(dtype.precision, dtype.scale)
    if kind == "struct":
        return pa.struct(
            [pa.field(f.name, arrow_type(f.type, timestamp_tz=timestamp_tz)) for f in dtype.fields]
        )
    if kind == "array":
        assert dtype.element is not None
        return pa.list_(pa.field("element", arrow_type(dtype.element, timestamp_tz=timestamp_tz)))
    if kind == "map":
        assert dtype.key is not None and dtype.value is not None
        return pa.map_(
            pa.field("key", arrow_type(dtype.key, timestamp_tz=timestamp_tz), nullable=False),
            pa.field("value", arrow_type(dtype.value, timestamp_tz=timestamp_tz)),
        )
    raise TypeError(f"no Arrow type for {dtype.simple_string()}")
