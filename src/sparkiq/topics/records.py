"""A topic's records as a table's rows: the key and value formats of one followed topic.

A record's key is read by its :class:`~sparkiq.topics.keys.KeyFormat`; its value by the
value format:

* ``json``: a JSON object; each column is read from the member of its name (a missing
  member is null; members that name no column are ignored); key columns always come from
  the key, not the value;
* ``string``: the UTF-8 value is the one column that is not a key column;
* ``avro``: Avro binary, plain or in Confluent's wire format, read with the writer's schema
  given as ``value_schema`` (:mod:`sparkiq.topics.avrovalues`); key columns come from the key.
  ``avro-confluent`` and ``avro-plain`` take only the one framing.

A null value (a tombstone) deletes the key. A record that cannot be read -- a key or value
that is not in its format, a member whose JSON type does not fit its column -- is
:class:`~sparkiq.topics.jsonvalues.BadValue` and is skipped by the follower (counted, and
logged naming the topic, partition and offset), never stored as a guessed row.

:func:`published_schema` reads what a sparkiq publisher writes to the ``sparkiq-schemas``
topic (docs/kafka.md, "Publishing a table to a topic: the record format").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import pyarrow as pa

from sparkiq.errors import ConfigError, SchemaError
from sparkiq.schema.arrowtypes import arrow_type
from sparkiq.schema.codec import RowCodec
from sparkiq.schema.types import Field, TableSchema
from sparkiq.topics.avrovalues import AVRO_FORMATS, AvroValues
from sparkiq.topics.columns import parse_columns, parse_ddl_type
from sparkiq.topics.jsonvalues import BadValue, reader
from sparkiq.topics.keys import KeyFormat

__all__ = [
    "SCHEMAS_TOPIC",
    "VALUE_FORMATS",
    "SchemaMismatch",
    "TopicFormat",
    "published_schema",
    "table_schema",
]

VALUE_FORMATS: Final = ("json", "string", *AVRO_FORMATS)
#: The compacted topic where a publisher writes each topic's schema, keyed by topic name.
SCHEMAS_TOPIC: Final = "sparkiq-schemas"


def table_schema(columns: str | Sequence[Field], key: Sequence[str] | str) -> TableSchema:
    """The table of ``columns`` (a DDL string or fields) keyed by ``key``; ConfigError
    naming the problem (a key column that is no column, a type that cannot be a key)."""
    fields = parse_columns(columns) if isinstance(columns, str) else tuple(columns)
    keys = (key,) if isinstance(key, str) else tuple(key)
    if not keys:
        raise ConfigError("key= names no column: name the key columns, e.g. key='user'")
    try:
        return TableSchema(fields, keys)
    except SchemaError as exc:
        raise ConfigError(exc.message) from None


class SchemaMismatch(BadValue):
    """A JSON value whose members are not the columns of a strict :class:`TopicFormat` (a
    record a publisher wrote under another schema)."""


class TopicFormat:
    """How one topic's records become rows of ``schema``. Immutable; thread-safe.

    ``strict`` (a topic sparkiq published, whose values hold every column by name) makes
    :meth:`read_value` raise :class:`SchemaMismatch` for a JSON value whose members are not
    exactly the columns: the follower then looks for a newer schema before reading it.
    ``value_schema`` (JSON text or a dict) is the Avro schema of ``value_format='avro'``."""

    def __init__(
        self,
        schema: TableSchema,
        key_format: str,
        value_format: str,
        value_schema: str | Mapping[str, Any] | None = None,
        *,
        strict: bool = False,
    ) -> None:
        if value_format not in VALUE_FORMATS:
            raise ConfigError(
                f"value_format must be one of {list(VALUE_FORMATS)}, got {value_format!r}"
            )
        avro = value_format in AVRO_FORMATS
        if value_schema is not None and not avro:
            raise ConfigError(
                f"value_schema= is the schema of Avro values; value_format is {value_format!r}"
            )
        self.schema = schema
        self.keys = KeyFormat(schema, key_format)
        self.value_format = value_format
        self.strict = strict and value_format == "json"
        self._names = frozenset(f.name for f in schema.fields)
        key_columns = set(schema.key_columns)
        self._values = tuple(f for f in schema.fields if f.name not in key_columns)
        if value_format == "string" and (
            len(self._values) != 1 or self._values[0].type.name != "string"
        ):
            shown = [f"{f.name} {f.type.simple_string()}" for f in schema.fields]
            raise ConfigError(
                "value_format='string' fills one STRING column besides the key columns; "
                f"the columns are {shown}"
            )
        try:
            self._readers = tuple(
                (f.name, reader(f.type, f.name), f.nullable) for f in self._values
            )
        except BadValue as exc:
            raise ConfigError(str(exc)) from None
        self._avro = AvroValues(value_schema, self._values, value_format) if avro else None
        self._arrow = pa.schema(
            [pa.field(f.name, arrow_type(f.type, timestamp_tz="UTC")) for f in schema.fields]
        )
        self._rows = RowCodec(schema)

    @property
    def key_format(self) -> str:
        return self.keys.format

    def read_value(
        self, key: Mapping[str, Any], data: bytes, *, strict: bool | None = None
    ) -> dict[str, Any]:
        """The row of a record whose key columns are ``key`` (by name) and value ``data``;
        ``strict`` (default: the format's) checks the members are the columns."""
        row = dict(key)
        if self.value_format == "string":
            try:
                row[self._values[0].name] = data.decode()
            except UnicodeDecodeError:
                raise BadValue(f"the value is not UTF-8: {bytes(data[:40])!r}") from None
            return row
        if self._avro is not None:
            row.update(self._avro.read(data))
            return row
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise BadValue(f"the value is not JSON: {bytes(data[:40])!r}") from None
        if not isinstance(doc, dict):
            raise BadValue(f"the value must be a JSON object, got {doc!r:.60}")
        if (self.strict if strict is None else strict) and doc.keys() != self._names:
            extra, missing = sorted(doc.keys() - self._names), sorted(self._names - doc.keys())
            raise SchemaMismatch(f"the value's members differ: extra {extra}, missing {missing}")
        for name, read, nullable in self._readers:
            found = doc.get(name)
            if found is None:
                if not nullable:
                    raise BadValue(f"column {name!r} is NOT NULL and the value has none")
                row[name] = None
            else:
                row[name] = read(found)
        return row

    def encode_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """The rows in sparkiq's row encoding (:class:`~sparkiq.schema.codec.RowCodec`), a
        chunk at a time through Arrow; a row Arrow refuses is :class:`BadValue`."""
        if not rows:
            return []
        try:
            return self._rows.encode_arrow(pa.Table.from_pylist(list(rows), schema=self._arrow))
        except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
            raise BadValue(f"the rows do not fit the columns: {exc}") from None


def published_schema(doc: Any, topic: str) -> tuple[TableSchema, str, str, int]:
    """``(schema, key_format, value_format, partitions)`` of a ``sparkiq-schemas`` value;
    ConfigError when it is not one a follower can read."""
    where = f"the schema of topic {topic!r} in {SCHEMAS_TOPIC!r}"
    if not isinstance(doc, dict) or doc.get("format") != "sparkiq-table":
        raise ConfigError(f"{where} is not a sparkiq table schema: {str(doc)[:80]}")
    if doc.get("version") != 1:
        raise ConfigError(
            f"{where} has version {doc.get('version')!r}; this sparkiq reads version 1: "
            "upgrade sparkiq"
        )
    try:
        fields = tuple(
            Field(str(c["name"]), parse_ddl_type(str(c["type"])), bool(c.get("nullable", True)))
            for c in doc["columns"]
        )
        schema = table_schema(fields, [str(k) for k in doc["key_columns"]])
        return (
            schema,
            str(doc.get("key_format", "json")),
            str(doc.get("value_format", "json")),
            int(doc.get("partitions", 0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where} cannot be read: {exc!r}") from None
