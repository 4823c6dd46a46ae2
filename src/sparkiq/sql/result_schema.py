"""The types of a SQL result's columns, as one Arrow schema every renderer reads.

A result's schema is decided once, where the result is made, never guessed back from its
values or from the statement's text:

- a statement DuckDB runs is typed by DuckDB (:func:`from_duck`: the Arrow schema of its
  result over empty tables, computed once per plan);
- a key lookup answered in Python is typed by the table's own columns (:func:`from_table`);
- a fixed answer (``EXPLAIN``, ``SHOW TABLES``) names its types (:func:`strings`).

Arrow alone does not say two things the renderers need, so a field may carry
:data:`SPARK_TYPE` metadata:

- ``timestamp``: a naive Arrow timestamp that holds Spark's ``timestamp`` (an instant, shown
  as local wall-clock time, as PySpark shows it), not ``timestamp_ntz``. The Postgres
  endpoint sends it as ``timestamptz``. DuckDB sees both Spark types as ``TIMESTAMP``; its
  results are zoned unless the statement reads ``timestamp_ntz`` columns and no zoned ones
  (Spark's own default, ``spark.sql.timestampType=TIMESTAMP_LTZ``, makes a timestamp
  literal zoned too).
- ``hugeint``: DuckDB's 128-bit integer (``sum`` of integers), sent as int64, which Spark's
  own ``sum`` of integers gives; a value beyond int64 widens that column to
  ``decimal128(38, 0)`` (:func:`sparkiq.sql.result.result_table`).
- ``uuid``: DuckDB's UUID, whose values are :class:`uuid.UUID`, sent as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import pyarrow as pa

from sparkiq.schema.arrowrows import PSEUDO_COLUMNS, arrow_type
from sparkiq.schema.types import TableSchema

__all__ = [
    "DUCK_TYPE",
    "SPARK_TYPE",
    "from_duck",
    "from_table",
    "spark_type",
    "strings",
    "zoned_timestamps",
]

#: Field metadata naming the DuckDB type of a column DuckDB produced (``HUGEINT``, ``UUID``).
DUCK_TYPE = b"duckdb.type"
#: Field metadata naming what a column holds where its Arrow type does not say it.
SPARK_TYPE = b"sparkiq.type"

_ZONED = {SPARK_TYPE: b"timestamp"}


def spark_type(field: pa.Field) -> str | None:
    """The :data:`SPARK_TYPE` of ``field`` (None: its Arrow type says what it holds)."""
    meta = field.metadata
    if not meta:
        return None
    found = meta.get(SPARK_TYPE)
    return None if found is None else found.decode()


def zoned_timestamps(schemas: Iterable[TableSchema]) -> bool:
    """Whether the ``TIMESTAMP`` columns of a statement reading tables of ``schemas`` hold
    Spark's zoned ``timestamp`` (see the module docstring)."""
    kinds = {f.type.name for s in schemas for f in s.fields}
    return not ("timestamp_ntz" in kinds and "timestamp" not in kinds)


def from_duck(schema: pa.Schema, zoned: bool) -> pa.Schema:
    """The result schema of a statement whose result DuckDB gives as ``schema`` (fields
    carrying :data:`DUCK_TYPE`, as :func:`sparkiq.sql.duck.run` gives them)."""
    fields = []
    for field in schema:
        duck = (field.metadata or {}).get(DUCK_TYPE, b"")
        if duck == b"HUGEINT":
            field = pa.field(field.name, pa.int64(), metadata={SPARK_TYPE: b"hugeint"})
        elif duck == b"UUID":
            field = pa.field(field.name, pa.string(), metadata={SPARK_TYPE: b"uuid"})
        elif zoned and pa.types.is_timestamp(field.type) and field.type.tz is None:
            field = pa.field(field.name, field.type, metadata=_ZONED)
        else:
            field = field.remove_metadata()
        fields.append(field)
    return pa.schema(fields)


def from_table(schema: TableSchema, items: Sequence[tuple[str, str]]) -> pa.Schema:
    """The result schema of ``(output name, column)`` pairs read from a table of
    ``schema`` (a column may be ``WINDOWSTART``/``WINDOWEND``)."""
    fields = []
    for name, column in items:
        if column in PSEUDO_COLUMNS:
            fields.append(pa.field(name, pa.timestamp("us"), metadata=_ZONED))
            continue
        dtype = schema.field(column).type
        zoned = dtype.name == "timestamp"
        fields.append(pa.field(name, arrow_type(dtype), metadata=_ZONED if zoned else None))
    return pa.schema(fields)


def strings(columns: Sequence[str]) -> pa.Schema:
    """A schema of text columns."""
    return pa.schema([pa.field(name, pa.string()) for name in columns])
