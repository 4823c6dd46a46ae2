"""Record values in Avro: ``value_format="avro"`` with the writer's schema given by the user.

Framing
    A value is read in Confluent's wire format -- byte ``0x00`` (the magic byte), a 4-byte
    big-endian schema id, then the Avro binary encoding of one datum -- which is what Kafka
    Streams, ksqlDB, Debezium and every Confluent serializer write when a schema registry
    is configured; or, without that header, as plain Avro binary. No registry is asked: the
    schema id is skipped and the datum is read with the one schema given
    (``value_schema=``), which must be the schema the producer wrote with. A value that
    starts with ``0x00`` may be either (a plain record whose first field is a null union
    branch or a zero starts with ``0x00`` too), so ``value_format="avro"`` reads it framed
    first and plain when that fails. A reading counts only when it uses every byte of the
    value, so a record written with another schema (a field added, removed or retyped) is
    malformed, not misread; but a plain record that starts with ``0x00`` and whose bytes
    from the sixth on happen to be one whole record is read as framed. A topic whose
    framing is known is read without guessing: ``value_format="avro-confluent"`` (a value
    without the header is malformed) or ``"avro-plain"`` (never a header).

Types (what Spark's own Avro reader maps them to)
    ``boolean`` BOOLEAN; ``int`` INT; ``long`` BIGINT; ``float`` FLOAT; ``double`` DOUBLE;
    ``string`` and ``enum`` STRING; ``bytes`` and ``fixed`` BINARY; logical types ``date``
    (int) DATE, ``timestamp-millis``/``timestamp-micros`` (long) TIMESTAMP,
    ``local-timestamp-millis``/``-micros`` (long) TIMESTAMP_NTZ, ``decimal(p, s)`` (bytes or
    fixed; p <= 38) DECIMAL(p, s); other logical types are read as their underlying type
    (``time-millis`` an INT of milliseconds, ``uuid`` a STRING); ``array`` ARRAY, ``map``
    MAP<STRING, ...>, a nested ``record`` STRUCT. A union ``[null, T]`` (either order) is a
    nullable T; every other type is NOT NULL. Unions of several non-null types and
    recursive records have no column type and are refused when the schema is given.

Columns
    Without ``columns=``, the table's columns are the top-level record's fields, in order
    (:func:`avro_columns`). With them, every column that is not a key column must be a field
    of the record whose type fits the column: the same type, or a wider one (INT into
    BIGINT, FLOAT into DOUBLE, DECIMAL(p, s) into DECIMAL(p', s) with p' >= p), nested the
    same way; a STRUCT column names a subset of the nested record's fields. Fields that name
    no column are read and dropped. Key columns come from the record's key, never its
    value.

Bytes that do not decode with the schema, and values that do not fit their column (a
decimal with more digits than its precision, a null in a NOT NULL column), raise
:class:`~sparkiq.topics.jsonvalues.BadValue`: the follower skips the record as malformed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, Final

from fastavro import parse_schema, schemaless_reader

from sparkiq.errors import ConfigError
from sparkiq.schema.types import DataType, Field
from sparkiq.topics.jsonvalues import BadValue

__all__ = ["AVRO_FORMATS", "CONFLUENT_MAGIC", "AvroValues", "avro_columns", "parse_avro_schema"]

#: The value formats of Avro: either framing (guessed per value), or one only.
AVRO_FORMATS: Final = ("avro", "avro-confluent", "avro-plain")

#: The first byte of a value in Confluent's wire format; 4 bytes of schema id follow.
CONFLUENT_MAGIC: Final = 0
_HEADER: Final = 5
_MAX_DECIMAL_PRECISION: Final = 38
_PRIMITIVES: Final = {
    "boolean": "boolean",
    "int": "integer",
    "long": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "bytes": "binary",
}
# logical types read as such, by the underlying type they annotate; others are dropped
_LOGICAL: Final = {
    ("date", "int"): "date",
    ("timestamp-millis", "long"): "timestamp",
    ("timestamp-micros", "long"): "timestamp",
    ("local-timestamp-millis", "long"): "timestamp_ntz",
    ("local-timestamp-micros", "long"): "timestamp_ntz",
    ("decimal", "bytes"): "decimal",
    ("decimal", "fixed"): "decimal",
}
# how an Avro type may be read into a wider column (value unchanged in Python)
_WIDER: Final = {("integer", "long"), ("float", "double")}

#: Turns one decoded (non-null) value into the value the column holds.
Convert = Callable[[Any], Any]


def _problem(text: str) -> ConfigError:
    return ConfigError(f"value_schema: {text}")


def _strip_logical(node: Any) -> Any:
    """The schema with the logical types it is not read by removed (``time-millis`` is then
    an int, as Spark reads it), so fastavro hands back the underlying values for them."""
    if isinstance(node, list):
        return [_strip_logical(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strip_logical(v) for k, v in node.items()}
    logical = out.get("logicalType")
    if logical is not None and (logical, out.get("type")) not in _LOGICAL:
        del out["logicalType"]
    return out


def parse_avro_schema(
    value_schema: str | Mapping[str, Any] | None,
) -> tuple[dict[str, Any], tuple[Field, ...]]:
    """The schema given (JSON text or its parsed form) as fastavro reads it, and the
    columns of its record's fields; ConfigError naming the problem when it is not an Avro
    record whose fields all have a column type."""
    if value_schema is None:
        raise ConfigError(
            "value_format='avro' needs value_schema=: the Avro schema the values were written "
            "with, as JSON (e.g. the schema registry's schema of the topic's value subject)"
        )
    doc: Any = dict(value_schema) if isinstance(value_schema, Mapping) else value_schema
    if isinstance(value_schema, str):
        try:
            doc = json.loads(value_schema)
        except ValueError as exc:
            raise _problem(f"not JSON ({exc}): {value_schema[:60]!r}") from None
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise _problem(
            f"the values' schema must be an Avro record (type 'record'), got {str(doc)[:60]}"
        )
    if not isinstance(doc.get("fields"), list) or not doc["fields"]:
        raise _problem(f"record {doc.get('name')!r} has no fields")
    doc = _strip_logical(doc)
    try:
        parsed: Any = parse_schema(doc)
        expanded: Any = parse_schema(doc, expand=True)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise _problem(f"not a valid Avro schema: {type(exc).__name__}: {exc}") from None
    return parsed, _record_fields(expanded, str(expanded["name"]))


def _record_fields(record: Mapping[str, Any], where: str) -> tuple[Field, ...]:
    fields = record.get("fields")
    if not isinstance(fields, list) or not fields:
        raise _problem(f"record {where!r} has no fields")
    out = []
    for item in fields:
        name = str(item["name"])
        dtype, nullable = _column_type(item["type"], f"{where}.{name}")
        out.append(Field(name, dtype, nullable))
    return tuple(out)


def _column_type(node: Any, where: str) -> tuple[DataType, bool]:
    """(the Spark type of an Avro type in an expanded schema, whether it may be null)."""
    if isinstance(node, list):
        branches = [b for b in node if b != "null"]
        if len(branches) != 1:
            raise _problem(
                f"{where} is the union {node}: only a type or a nullable type [null, T] has a "
                "column type"
            )
        return _column_type(branches[0], where)[0], len(branches) < len(node)
    if isinstance(node, str):
        if node in _PRIMITIVES:
            return DataType(_PRIMITIVES[node]), False
        if node == "null":
            raise _problem(f"{where} is always null: it has no column type")
        # an expanded schema names a type only where it refers to itself
        raise _problem(
            f"{where} refers to the enclosing record {node!r}: recursive records "
            "have no column type"
        )
    kind = node.get("type")
    logical = _LOGICAL.get((node.get("logicalType"), kind))
    if logical == "decimal":
        precision, scale = int(node.get("precision", 0)), int(node.get("scale", 0))
        if not 0 < precision <= _MAX_DECIMAL_PRECISION:
            raise _problem(
                f"{where} is a decimal of precision {precision}; a column holds 1 to "
                f"{_MAX_DECIMAL_PRECISION} digits"
            )
        return DataType("decimal", precision=precision, scale=scale), False
    if logical is not None:
        return DataType(logical), False
    if kind == "record":
        return DataType("struct", fields=_record_fields(node, where)), False
    if kind == "enum":
        return DataType("string"), False
    if kind == "fixed":
        return DataType("binary"), False
    if kind == "array":
        return DataType("array", element=_column_type(node["items"], f"{where}[]")[0]), False
    if kind == "map":
        value = _column_type(node["values"], f"{where}{{}}")[0]
        return DataType("map", key=DataType("string"), value=value), False
    return _column_type(kind, where)  # {"type": "long"} and the like


def avro_columns(
    value_schema: str | Mapping[str, Any] | None, key: Sequence[str] = ()
) -> tuple[Field, ...]:
    """The columns of the record's fields (the table's columns when none are given);
    ConfigError when a ``key`` column is not one of them."""
    schema, fields = parse_avro_schema(value_schema)
    names = [f.name for f in fields]
    missing = [k for k in key if k not in names]
    if missing:
        raise ConfigError(
            f"key column {missing[0]!r} is not a field of value_schema's record "
            f"{schema['name']!r} (its fields: {names}): to key by a column that only the "
            "record's key holds, give columns= with every column, key columns included"
        )
    return fields


def _fits(found: DataType, column: DataType) -> bool:
    """Whether values of Avro's column type ``found`` can be held by ``column`` unchanged."""
    if found == column or (found.name, column.name) in _WIDER:
        return True
    if found.name != column.name:
        return False
    if found.name == "decimal":
        return found.scale == column.scale and found.precision <= column.precision
    if found.name == "array":
        assert found.element is not None and column.element is not None
        return _fits(found.element, column.element)
    if found.name == "map":
        assert found.value is not None and column.value is not None
        return _fits(found.value, column.value)
    if found.name == "struct":
        inner = {f.name: f.type for f in found.fields}
        return all(f.name in inner and _fits(inner[f.name], f.type) for f in column.fields)
    return False


def _converter(column: DataType, where: str) -> Convert | None:
    """What turns fastavro's value into the column's (None: it already is)."""
    name = column.name
    if name == "decimal":
        limit = Decimal(10) ** (column.precision - column.scale)

        def decimal(value: Any) -> Any:
            if not abs(value) < limit:
                raise BadValue(
                    f"{where}: {value} has more digits than decimal"
                    f"({column.precision},{column.scale})"
                )
            return value

        return decimal
    if name == "array":
        assert column.element is not None
        element = _converter(column.element, f"{where}[]")
        if element is None:
            return None
        return lambda values: [None if v is None else element(v) for v in values]
    if name == "map":
        assert column.value is not None
        value = _converter(column.value, f"{where}{{}}")
        # a map's Python value is a list of (key, value) pairs, as the JSON format's is
        if value is None:
            return lambda found: list(found.items())
        return lambda found: [(k, None if v is None else value(v)) for k, v in found.items()]
    if name == "struct":
        members = tuple((f.name, _converter(f.type, f"{where}.{f.name}")) for f in column.fields)

        def struct(found: Any) -> Any:
            out = {}
            for member, convert in members:
                item = found[member]
                out[member] = item if item is None or convert is None else convert(item)
            return out

        return struct
    return None


class AvroValues:
    """Reads the values of ``columns`` from Avro values written with ``value_schema``, framed
    as ``value_format`` says (see the module docstring). Immutable once made; :meth:`read`
    is thread-safe."""

    def __init__(
        self,
        value_schema: str | Mapping[str, Any] | None,
        columns: Sequence[Field],
        value_format: str = "avro",
    ):
        if value_format not in AVRO_FORMATS:
            raise ConfigError(
                f"value_format must be one of {list(AVRO_FORMATS)}, got {value_format!r}"
            )
        self.value_format = value_format
        self.schema, fields = parse_avro_schema(value_schema)
        record = str(self.schema["name"])
        found = {f.name: f for f in fields}
        readers: list[tuple[str, Convert | None, bool]] = []
        for column in columns:
            field = found.get(column.name)
            if field is None:
                raise ConfigError(
                    f"column {column.name!r} is not a field of value_schema's record "
                    f"{record!r} (its fields: {list(found)}): name the record's fields in "
                    "columns=, or leave columns= out to take them all"
                )
            if not _fits(field.type, column.type):
                raise ConfigError(
                    f"column {column.name!r} is {column.type.simple_string()} but field "
                    f"{column.name!r} of value_schema's record {record!r} is "
                    f"{field.type.simple_string()} in Avro: give the column that type (or a "
                    "wider one: int -> bigint, float -> double, a decimal of more precision)"
                )
            readers.append((column.name, _converter(column.type, column.name), column.nullable))
        self._readers = tuple(readers)

    def decode(self, data: bytes) -> Any:
        """The record of one value (framed or plain), every byte used; BadValue otherwise."""
        if self.value_format == "avro-plain":
            return self._datum(data, 0)
        if self.value_format == "avro-confluent":
            if len(data) < _HEADER or data[0] != CONFLUENT_MAGIC:
                raise BadValue(
                    f"the value has no Confluent header (0x00 and a 4-byte schema id): "
                    f"{bytes(data[:40])!r}"
                )
            return self._datum(data, _HEADER)
        if len(data) >= _HEADER and data[0] == CONFLUENT_MAGIC:
            try:
                return self._datum(data, _HEADER)
            except BadValue as framed:
                try:
                    return self._datum(data, 0)
                except BadValue:
                    raise framed from None
        return self._datum(data, 0)

    def _datum(self, data: bytes, start: int) -> Any:
        stream = io.BytesIO(data)
        stream.seek(start)
        try:
            record = schemaless_reader(stream, self.schema, None)
        except (EOFError, ValueError, IndexError, KeyError, TypeError, OverflowError) as exc:
            raise BadValue(
                f"the value is not Avro of value_schema ({'framed' if start else 'plain'}: "
                f"{type(exc).__name__}: {exc}): {bytes(data[:40])!r}"
            ) from None
        if stream.tell() != len(data):
            raise BadValue(
                f"the value is not one Avro record of value_schema: {len(data) - stream.tell()} "
                f"of its {len(data)} bytes are left over ({'framed' if start else 'plain'})"
            )
        return record

    def read(self, data: bytes) -> dict[str, Any]:
        """The column values (by name) of one value; BadValue when it does not decode with
        the schema or a value does not fit its column."""
        record = self.decode(data)
        row: dict[str, Any] = {}
        for name, convert, nullable in self._readers:
            value = record[name]
            if value is None:
                if not nullable:
                    raise BadValue(f"column {name!r} is NOT NULL and the value has none")
            elif convert is not None:
                value = convert(value)
            row[name] = value
        return row
