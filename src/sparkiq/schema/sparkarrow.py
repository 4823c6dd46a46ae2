"""Stored values (:mod:`sparkiq.schema.rowcodec`'s, the inverse of its Arrow to stored values)
as the Arrow arrays Spark exchanges with Python: timestamps in UTC, nested types built from
their children. Used where sparkiq hands rows to Spark: the ``sparkiq`` data source and
``enrich``'s lookups."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from sparkiq.schema.arrowtypes import arrow_type
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType

__all__ = ["spark_arrow_type", "stored_to_arrow"]


def spark_arrow_type(dtype: DataType) -> pa.DataType:
    """The Arrow type Spark exchanges a column of ``dtype`` as."""
    return arrow_type(dtype, timestamp_tz="UTC")


def stored_to_arrow(values: list[Any], dtype: DataType) -> pa.Array:
    """An Arrow array of stored values (see :mod:`sparkiq.schema.rowcodec`)."""
    kind = dtype.name
    if kind == "struct":
        children = [
            stored_to_arrow([None if v is None else v[i] for v in values], f.type)
            for i, f in enumerate(dtype.fields)
        ]
        return pa.StructArray.from_arrays(
            children,
            fields=list(spark_arrow_type(dtype)),
            mask=pa.array([v is None for v in values], pa.bool_()),
        )
    if kind in ("array", "map"):
        offsets, flat = [0], []
        for v in values:
            if v is not None:
                flat.extend(v)
            offsets.append(len(flat))
        mask = pa.array([v is None for v in values], pa.bool_())
        if kind == "array":
            assert dtype.element is not None
            return pa.ListArray.from_arrays(
                pa.array(offsets, pa.int32()),
                stored_to_arrow(flat, dtype.element),
                type=spark_arrow_type(dtype),
                mask=mask,
            )
        assert dtype.key is not None and dtype.value is not None
        return pa.MapArray.from_arrays(
            pa.array(offsets, pa.int32()),
            stored_to_arrow([k for k, _ in flat], dtype.key),
            stored_to_arrow([v for _, v in flat], dtype.value),
            type=spark_arrow_type(dtype),
            mask=mask,
        )
    return KINDS[kind].stored_to_arrow(values, dtype, "UTC")
