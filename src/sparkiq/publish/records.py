"""The record format of a table published to Kafka: key bytes, value bytes, schema record.

Format version 1 (:data:`RECORD_FORMAT_VERSION`), shared with whatever follows the topic
(``docs/kafka.md``, "Publishing a table to a topic: the record format"):

* **Key**, ``key_format="json"`` (default): compact UTF-8 JSON. One key column: its bare
  JSON value (``"u-1"``, ``42``); several: an object of the key columns in key order
  (``{"carrier":"AA","flight":17}``). A windowed table's key is always an object: the key
  columns, then the window column as ``{"start": <timestamp>}`` (the window start is part
  of a windowed table's key; its end is in the value).
  ``key_format="kafka"`` (ksqlDB's KAFKA format, one key column, not windowed): string as
  raw UTF-8, int as 4-byte and bigint as 8-byte big-endian signed, double as 8-byte IEEE
  big-endian; other types are refused.
* **Value**, ``value_format="json"``: a UTF-8 JSON object of every column by name, key
  columns included; a deleted key is a tombstone (value None).
* **JSON values**: strings, integers, booleans, null as themselves; float and double as
  numbers, except NaN and infinities as the strings ``"NaN"``, ``"Infinity"``,
  ``"-Infinity"`` (a float column's value as its shortest float32 spelling: ``0.1``, not
  ``0.10000000149011612``); decimal as a string of the exact decimal with the column's
  scale (``"12.50"``); date ``"YYYY-MM-DD"``; timestamp ISO-8601 UTC with microseconds and
  ``Z`` (``"2026-11-29T00:31:05.123456Z"``); timestamp_ntz the same without ``Z``; binary
  base64 (standard alphabet, padded); arrays as arrays, structs as objects, maps as objects
  whose keys are the map keys as strings (a non-string map key is written as its JSON text:
  ``1`` becomes ``"1"``), recursively by these rules.
* **Schema record**: :func:`schema_document`, published to :data:`SCHEMA_TOPIC` keyed by
  the data topic's name.

Values are converted a column at a time from the changelog's stored rows
(:mod:`sparkiq.schema.rowcodec`: one MessagePack call decodes a whole partition's rows);
dates and timestamps are formatted by numpy in bulk. Only nested values, binary and keys of
deleted rows cost Python work per value.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np

from sparkiq.changelog.manifest import TableManifest
from sparkiq.errors import ConfigError
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.types import DataType

__all__ = [
    "KEY_FORMATS",
    "RECORD_FORMAT_VERSION",
    "SCHEMA_TOPIC",
    "VALUE_FORMATS",
    "RecordEncoder",
    "schema_document",
]

RECORD_FORMAT_VERSION = 1
#: The compacted topic holding each published topic's schema, keyed by the topic's name.
SCHEMA_TOPIC = "sparkiq-schemas"
KEY_FORMATS = ("json", "kafka")
VALUE_FORMATS = ("json",)

_ARRAY32 = struct.Struct(">BI")  # a MessagePack array header: frames many rows as one
_KAFKA_KEY_TYPES = ("string", "integer", "long", "double")
# Key types whose value in a row is exactly the key's (no normalization in the key encoding:
# a float key's -0.0 is 0.0, a NaN any NaN): their key JSON is taken from the row's column.
_ROW_KEY_TYPES = frozenset(
    {"string", "byte", "short", "integer", "long", "boolean", "date", "timestamp", "timestamp_ntz"}
)
_Convert = Callable[[Any], Any]


def schema_document(
    manifest: TableManifest, topic: str, key_format: str = "json", value_format: str = "json"
) -> dict[str, Any]:
    """The schema record's value (as a dict) of ``manifest``'s table published to ``topic``."""
    schema = manifest.schema
    key_columns = list(schema.key_columns)
    if schema.window_column is not None:
        key_columns.append(schema.window_column)
    return {
        "format": "sparkiq-table",
        "version": RECORD_FORMAT_VERSION,
        "table": manifest.name,
        "topic": topic,
        "key_columns": key_columns,
        "columns": [
            {"name": f.name, "type": f.type.simple_string(), "nullable": f.nullable}
            for f in schema.fields
        ],
        "key_format": key_format,
        "value_format": value_format,
        "partitions": manifest.partitions,
    }


# --- one value -> its JSON form --------------------------------------------------------------


def _float_json(value: float) -> Any:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _float32_json(value: float) -> Any:
    # the stored value is the float32 widened exactly; its shortest float32 spelling is what
    # Spark's to_json and every JVM client print
    return (
        _float_json(float(str(np.float32(value)))) if math.isfinite(value) else _float_json(value)
    )


def _date_json(days: int) -> str:
    return str(np.datetime64(days, "D"))


def _timestamp_json(micros: int) -> str:
    return np.datetime_as_string(np.datetime64(micros, "us"), unit="us") + "Z"


def _ntz_json(micros: int) -> str:
    return np.datetime_as_string(np.datetime64(micros, "us"), unit="us")


def _binary_json(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _decimal_text(unscaled: int, scale: int) -> str:
    """The exact decimal ``unscaled * 10**-scale`` with ``scale`` fraction digits."""
    if scale <= 0:
        return str(unscaled * 10**-scale)
    sign = "-" if unscaled < 0 else ""
    digits = str(abs(unscaled)).rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def _map_key(value: Any) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _converter(dtype: DataType) -> _Convert | None:
    """A function from a non-null *stored* value (rowcodec) to its JSON form; None when
    they are the same."""
    kind = dtype.name
    if kind == "struct":
        names = tuple(f.name for f in dtype.fields)
        fields = tuple(_converter(f.type) for f in dtype.fields)

        def struct_json(values: list[Any]) -> dict[str, Any]:
            return {
                name: v if v is None or convert is None else convert(v)
                for name, convert, v in zip(names, fields, values, strict=True)
            }

        return struct_json
    if kind == "array":
        assert dtype.element is not None
        item = _converter(dtype.element)
        if item is None:
            return None
        return lambda values: [v if v is None else item(v) for v in values]
    if kind == "map":
        assert dtype.key is not None and dtype.value is not None
        key, value = _converter(dtype.key), _converter(dtype.value)

        def map_json(pairs: list[Any]) -> dict[str, Any]:
            return {
                _map_key(k if key is None else key(k)): v
                if v is None or value is None
                else value(v)
                for k, v in pairs
            }

        return map_json
    simple: dict[str, _Convert] = {
        "double": _float_json,
        "float": _float32_json,
        "date": _date_json,
        "timestamp": _timestamp_json,
        "timestamp_ntz": _ntz_json,
        "binary": _binary_json,
    }
    return simple.get(kind)


def _temporal_column(values: Sequence[Any], unit: Any, zone: str) -> list[Any]:
    """Dates (days) or timestamps (µs) of one column as ISO strings, formatted by numpy."""
    present = [i for i, v in enumerate(values) if v is not None]
    out: list[Any] = [None] * len(values)
    if not present:
        return out
    raw = np.array([values[i] for i in present], dtype=np.int64).astype(f"datetime64[{unit}]")
    texts = np.datetime_as_string(raw, unit=unit)
    for i, text in zip(present, texts.tolist(), strict=True):
        out[i] = text + zone
    return out


def _json_column(values: Sequence[Any], dtype: DataType) -> Sequence[Any]:
    """A column's stored values (rowcodec) as their JSON forms, a column at a time."""
    kind = dtype.name
    if kind == "date":
        return _temporal_column(values, "D", "")
    if kind in ("timestamp", "timestamp_ntz"):
        return _temporal_column(values, "us", "Z" if kind == "timestamp" else "")
    if kind == "double":
        if all(v is None or math.isfinite(v) for v in values):
            return values
        return [v if v is None else _float_json(v) for v in values]
    convert = _converter(dtype)
    if convert is None:
        return values
    return [v if v is None else convert(v) for v in values]


def _key_json(dtype: DataType) -> _Convert:
    """A key column's *internal* value (keycodec) to its JSON form."""
    if dtype.name == "decimal":
        scale = dtype.scale
        return lambda v: None if v is None else _decimal_text(v, scale)
    convert = _converter(dtype)
    if convert is None:
        return lambda v: v
    return lambda v: None if v is None else convert(v)


# --- ksqlDB's KAFKA key format -----------------------------------------------------------------

_KAFKA_KEY: dict[str, Callable[[Any], bytes]] = {
    "string": lambda v: v.encode("utf-8"),
    "integer": struct.Struct(">i").pack,
    "long": struct.Struct(">q").pack,
    "double": struct.Struct(">d").pack,
}


class RecordEncoder:
    """Turns one table's changes (encoded keys, stored rows) into Kafka key and value bytes.

    Deterministic: the same changes always give the same bytes (a re-published batch is
    byte-identical). Immutable and thread-safe; build one per table and format.
    Raises :class:`~sparkiq.errors.ConfigError` for a format the table cannot take.
    """

    def __init__(
        self, manifest: TableManifest, key_format: str = "json", value_format: str = "json"
    ) -> None:
        schema = manifest.schema
        if key_format not in KEY_FORMATS:
            raise ConfigError(
                f"unknown key_format {key_format!r}; the key formats are {list(KEY_FORMATS)}"
            )
        if value_format not in VALUE_FORMATS:
            raise ConfigError(
                f"unknown value_format {value_format!r}; the value formats are "
                f"{list(VALUE_FORMATS)} (Avro with a schema registry is not supported yet)"
            )
        if key_format == "kafka":
            types = [t.name for t in schema.key_types]
            if (
                len(types) != 1
                or schema.window_column is not None
                or types[0] not in (_KAFKA_KEY_TYPES)
            ):
                raise ConfigError(
                    f"key_format='kafka' takes one key column of type string, int, bigint or "
                    f"double and no window; table {manifest.name!r} has key columns "
                    f"{list(schema.key_columns)} of types "
                    f"{[t.simple_string() for t in schema.key_types]}"
                    + (f" and window {schema.window_column!r}" if schema.window_column else "")
                    + ": use key_format='json'",
                    store=manifest.name,
                )
        self.manifest = manifest
        self.key_format = key_format
        self.value_format = value_format
        self._codec = KeyCodec(schema)
        self._types = tuple(f.type for f in schema.fields)
        self._names = schema.column_names
        self._key_json = tuple(_key_json(t) for t in schema.key_types)
        self._key_index = tuple(schema.column_names.index(c) for c in schema.key_columns)
        self._window = schema.window_column
        self._window_index = (
            None if self._window is None else schema.column_names.index(self._window)
        )
        self._start_json = (
            _ntz_json
            if schema.window_start_type and (schema.window_start_type.name == "timestamp_ntz")
            else _timestamp_json
        )
        self._encoder = msgspec.json.Encoder()
        self._keys_from_rows = all(t.name in _ROW_KEY_TYPES for t in schema.key_types)

    def encode(
        self, keys: Sequence[bytes], rows: Sequence[bytes | None]
    ) -> tuple[list[bytes], list[bytes | None]]:
        """Key and value bytes of each change (``rows[i]`` None: ``keys[i]`` was deleted,
        its value is None: a tombstone)."""
        present = [i for i, r in enumerate(rows) if r is not None]
        values: list[bytes | None] = [None] * len(rows)
        columns: list[Sequence[Any]] = []
        if present:
            framed = _ARRAY32.pack(0xDD, len(present)) + b"".join(rows[i] for i in present)  # type: ignore[misc]
            decoded: list[list[Any]] = msgspec.msgpack.decode(framed)
            stored = list(zip(*decoded, strict=True))
            columns = [_json_column(c, t) for c, t in zip(stored, self._types, strict=True)]
            encode, names = self._encoder.encode, self._names
            for i, row in zip(present, zip(*columns, strict=True), strict=True):
                values[i] = encode(dict(zip(names, row, strict=True)))
        return self._keys(keys, rows, present, columns), values

    def _keys(
        self,
        keys: Sequence[bytes],
        rows: Sequence[bytes | None],
        present: list[int],
        columns: list[Sequence[Any]],
    ) -> list[bytes]:
        """The key bytes: a function of the key alone (a tombstone's key bytes equal those of
        the rows it deletes), from the row's key columns when their types allow it (cheaper),
        else decoded from the changelog's encoded key."""
        out: list[bytes] = [b""] * len(keys)
        if present and self._keys_from_rows:
            parts = [columns[i] for i in self._key_index]
            if self._window_index is not None:
                windows = columns[self._window_index]
                parts.append([None if w is None else {"start": w["start"]} for w in windows])
            for i, values in zip(present, zip(*parts, strict=True), strict=True):
                out[i] = self._key_bytes(values)
        for i, row in enumerate(rows):
            if row is None or not self._keys_from_rows:
                out[i] = self._key_bytes(self._decode_key(keys[i]))
        return out

    def _decode_key(self, key: bytes) -> tuple[Any, ...]:
        if self._window is None:
            internal = self._codec.decode(key)
            window: tuple[Any, ...] = ()
        else:
            internal, start = self._codec.decode_windowed(key)
            window = ({"start": None if start is None else self._start_json(start)},)
        return tuple(c(v) for c, v in zip(self._key_json, internal, strict=True)) + window

    def _key_bytes(self, values: tuple[Any, ...]) -> bytes:
        if self.key_format == "kafka":
            value = values[0]
            if value is None:
                raise ConfigError(
                    f"table {self.manifest.name!r} has a null key, which key_format='kafka' "
                    "cannot write: use key_format='json'",
                    store=self.manifest.name,
                )
            return _KAFKA_KEY[self._types[self._key_index[0]].name](value)
        if len(values) == 1:
            return self._encoder.encode(values[0])
        names = list(self.manifest.schema.key_columns)
        if self._window is not None:
            names.append(self._window)
        return self._encoder.encode(dict(zip(names, values, strict=True)))
