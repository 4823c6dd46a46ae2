"""Spark SQL data types, read from Spark's own JSON schema, without importing pyspark.

Every layer above this one (stores, changelog, routing, serving) must reason about column
types: to validate a key a caller passes, to encode it so byte order equals the key's natural
order, to compute Spark's partition for it, and to turn stored values back into the Python
objects PySpark would return. The writer records ``DataFrame.schema.json()`` in the table
manifest; this module parses that document into small immutable descriptors.

Type names follow Spark's JSON ``typeName`` (``"string"``, ``"integer"``, ``"long"``,
``"decimal(10,2)"``, ``{"type": "struct", ...}``), so a manifest written by any Spark 4.x
version is readable here.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from sparkiq.errors import SchemaError
from sparkiq.schema.kinds import KINDS, Temporal

__all__ = [
    "KEY_TYPE_NAMES",
    "DataType",
    "Field",
    "TableSchema",
    "parse_type",
]

#: Types a key column may have: each has a Spark hash, a total order and an
#: order-preserving encoding. Complex types (arrays, maps, structs) cannot be keys.
KEY_TYPE_NAMES = frozenset(name for name, kind in KINDS.items() if kind.key)
#: Types a window's start may have: timestamps (Spark's ``window()`` produces them).
_WINDOW_START_NAMES = frozenset(
    name for name, kind in KINDS.items() if kind.key and kind.python is dt.datetime
)

_DECIMAL = re.compile(r"^decimal\((\d+),\s*(-?\d+)\)$")


@dataclass(frozen=True, slots=True)
class DataType:
    """One Spark SQL type.

    ``name`` is Spark's type name without parameters (``"decimal"``, ``"struct"``...).
    ``precision``/``scale`` are set for decimals; ``fields`` for structs; ``element`` for
    arrays; ``key``/``value`` for maps.
    """

    name: str
    precision: int = 0
    scale: int = 0
    fields: tuple[Field, ...] = ()
    element: DataType | None = None
    key: DataType | None = None
    value: DataType | None = None

    @property
    def is_key_type(self) -> bool:
        return self.name in KEY_TYPE_NAMES

    def simple_string(self) -> str:
        """Spark's ``simpleString`` spelling, used in error messages."""
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.name == "struct":
            inner = ",".join(f"{f.name}:{f.type.simple_string()}" for f in self.fields)
            return f"struct<{inner}>"
        if self.name == "array" and self.element is not None:
            return f"array<{self.element.simple_string()}>"
        if self.name == "map" and self.key is not None and self.value is not None:
            return f"map<{self.key.simple_string()},{self.value.simple_string()}>"
        kind = KINDS.get(self.name)
        return kind.simple if kind is not None and kind.simple else self.name

    def to_json(self) -> Any:
        """Spark's JSON form of this type (inverse of :func:`parse_type`)."""
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        if self.name == "struct":
            return {"type": "struct", "fields": [f.to_json() for f in self.fields]}
        if self.name == "array":
            assert self.element is not None
            return {"type": "array", "elementType": self.element.to_json(), "containsNull": True}
        if self.name == "map":
            assert self.key is not None and self.value is not None
            return {
                "type": "map",
                "keyType": self.key.to_json(),
                "valueType": self.value.to_json(),
                "valueContainsNull": True,
            }
        return self.name


@dataclass(frozen=True, slots=True)
class Field:
    """A named, typed column (or struct member)."""

    name: str
    type: DataType
    nullable: bool = True

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type.to_json(),
            "nullable": self.nullable,
            "metadata": {},
        }


def parse_type(doc: Any) -> DataType:
    """Parse one type from Spark's JSON schema representation."""
    if isinstance(doc, str):
        match = _DECIMAL.match(doc)
        if match:
            return DataType("decimal", precision=int(match[1]), scale=int(match[2]))
        if doc == "decimal":  # Spark's default DecimalType()
            return DataType("decimal", precision=10, scale=0)
        return DataType(doc)
    if isinstance(doc, Mapping):
        kind = doc.get("type")
        if kind == "struct":
            return DataType("struct", fields=tuple(_parse_field(f) for f in doc["fields"]))
        if kind == "array":
            return DataType("array", element=parse_type(doc["elementType"]))
        if kind == "map":
            return DataType(
                "map", key=parse_type(doc["keyType"]), value=parse_type(doc["valueType"])
            )
        if kind == "udt":
            return parse_type(doc["sqlType"])
    raise SchemaError(f"unsupported Spark type in schema: {doc!r}")


def _parse_field(doc: Mapping[str, Any]) -> Field:
    return Field(str(doc["name"]), parse_type(doc["type"]), bool(doc.get("nullable", True)))


@dataclass(frozen=True, slots=True)
class TableSchema:
    """The columns of a materialized table and which of them form its key.

    ``key_columns`` are in the order the user gave them; a composite key is a tuple in that
    order. ``window_column``, when set, names a ``struct<start: timestamp, end: timestamp>``
    column (Spark's ``window()``); a windowed table's store key is the key columns followed by
    the window start, and its partition depends on the key columns only, so every window of a
    key lives in one partition.
    """

    fields: tuple[Field, ...]
    key_columns: tuple[str, ...]
    window_column: str | None = None
    # derived once (below): every key lookup reads them
    _names: tuple[str, ...] = dataclass_field(default=(), init=False, repr=False, compare=False)
    _key_types: tuple[DataType, ...] = dataclass_field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        object.__setattr__(self, "_names", tuple(names))
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise SchemaError(f"duplicate column names {dupes}: give each column a unique alias")
        if not self.key_columns:
            raise SchemaError("a table needs at least one key column")
        for column in self.key_columns:
            if column not in names:
                raise SchemaError(
                    f"key column {column!r} is not a column of the DataFrame; columns are {names}"
                )
            dtype = self.field(column).type
            if not dtype.is_key_type:
                raise SchemaError(
                    f"key column {column!r} has type {dtype.simple_string()}, which cannot be a "
                    f"key; supported key types: {sorted(KEY_TYPE_NAMES)}"
                )
        if self.window_column is not None:
            if self.window_column not in names:
                raise SchemaError(
                    f"window column {self.window_column!r} is not a column of the DataFrame; "
                    f"columns are {names}"
                )
            if self.window_column in self.key_columns:
                raise SchemaError(
                    f"window column {self.window_column!r} must not also be a key column"
                )
            wtype = self.field(self.window_column).type
            member_types = {f.name: f.type.name for f in wtype.fields}
            if wtype.name != "struct" or member_types.get("start") not in _WINDOW_START_NAMES:
                raise SchemaError(
                    f"window column {self.window_column!r} has type {wtype.simple_string()}; "
                    "expected the struct<start,end> of timestamps that window() produces"
                )
        object.__setattr__(self, "_key_types", tuple(self.field(c).type for c in self.key_columns))

    @property
    def column_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def key_types(self) -> tuple[DataType, ...]:
        return self._key_types

    @property
    def window_start_type(self) -> DataType | None:
        """Type of the window start (timestamp or timestamp_ntz), or None when not windowed."""
        if self.window_column is None:
            return None
        wtype = self.field(self.window_column).type
        return next(f.type for f in wtype.fields if f.name == "start")

    @property
    def window_start(self) -> Temporal | None:
        """Converters of the window start between PySpark's datetimes and internal
        microseconds (per its type, timestamp or timestamp_ntz), or None when not windowed."""
        start = self.window_start_type
        return None if start is None else KINDS[start.name].temporal

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise SchemaError(f"no column {name!r}; columns are {list(self.column_names)}")

    def spark_json(self) -> str:
        """The schema as Spark's ``StructType.json()`` would write it."""
        return json.dumps(
            {"type": "struct", "fields": [f.to_json() for f in self.fields]},
            separators=(",", ":"),
        )

    @classmethod
    def from_spark_json(
        cls,
        schema_json: str | Mapping[str, Any],
        key_columns: Sequence[str],
        window_column: str | None = None,
    ) -> TableSchema:
        doc = json.loads(schema_json) if isinstance(schema_json, str) else schema_json
        struct = parse_type(doc)
        if struct.name != "struct":
            raise SchemaError(f"a table schema must be a struct, got {struct.simple_string()}")
        return cls(struct.fields, tuple(key_columns), window_column)
