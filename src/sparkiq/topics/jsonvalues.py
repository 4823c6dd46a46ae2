"""Column values as JSON, both ways, by the rules of the topic record format.

The format (docs/kafka.md, "Publishing a table to a topic: the record format") writes each
Spark type as: strings, integers, floats (``NaN``, ``Infinity`` and ``-Infinity`` as those
strings), booleans and null as themselves; DECIMAL as a string of the exact decimal; DATE as
``"YYYY-MM-DD"``; TIMESTAMP as ISO-8601 UTC with microseconds and ``Z``
(``"2026-11-29T00:31:05.123456Z"``), TIMESTAMP_NTZ the same without ``Z``; BINARY as base64;
arrays, maps (string keys) and structs as JSON arrays and objects, recursively.

:func:`reader` turns a parsed JSON value into the Python value PySpark would hold (what
Arrow and the key codec take), refusing anything else with :class:`BadValue` (the record is
then malformed: never a guessed value). :func:`write_key_value` writes a key column's value
the way the format does, which is what the Kafka partition of a key is computed over.
Readers are lenient only where no value can be misread: an integer where a float or decimal
is expected, a decimal given as a JSON number, a timestamp with another UTC offset.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import math
from collections.abc import Callable
from decimal import Decimal, InvalidOperation
from typing import Any

from sparkiq.schema.types import DataType

__all__ = ["BadValue", "Reader", "reader", "write_key_value"]

#: Reads one parsed JSON value (never None: nulls are handled by the caller).
Reader = Callable[[Any], Any]

_INT_BITS = {"byte": 8, "short": 16, "integer": 32, "long": 64}
_SPECIAL_FLOATS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class BadValue(ValueError):
    """A JSON value that the column's type cannot hold (the message says what was found)."""


def _kind(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def reader(dtype: DataType, where: str) -> Reader:
    """The reader of one column (or nested field) of ``dtype``; ``where`` names it in errors."""
    name = dtype.name
    if name == "string":
        return _typed(str, "a string", where)
    if name == "boolean":
        return _typed(bool, "a boolean", where)
    if name in _INT_BITS:
        return _int_reader(_INT_BITS[name], where)
    if name in ("double", "float"):
        return _float_reader(where)
    if name == "decimal":
        return _decimal_reader(dtype.precision, dtype.scale, where)
    if name == "date":
        return _parsed(dt.date.fromisoformat, "a date 'YYYY-MM-DD'", where)
    if name == "timestamp":
        return _parsed(_timestamp, "an ISO-8601 timestamp", where)
    if name == "timestamp_ntz":
        return _parsed(_timestamp_ntz, "an ISO-8601 timestamp without zone", where)
    if name == "binary":
        return _parsed(_base64, "a base64 string", where)
    if name == "array":
        assert dtype.element is not None
        return _array_reader(reader(dtype.element, f"{where}[]"), where)
    if name == "map":
        assert dtype.key is not None and dtype.value is not None
        return _map_reader(dtype.key, reader(dtype.value, f"{where}{{}}"), where)
    if name == "struct":
        fields = tuple((f.name, reader(f.type, f"{where}.{f.name}")) for f in dtype.fields)
        return _struct_reader(fields, where)
    raise BadValue(f"column {where!r} has type {dtype.simple_string()}, which JSON cannot fill")


def _typed(kind: type, expected: str, where: str) -> Reader:
    def read(value: Any) -> Any:
        if type(value) is not kind:
            raise BadValue(f"{where}: expected {expected}, got {_kind(value)}")
        return value

    return read


def _int_reader(bits: int, where: str) -> Reader:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def read(value: Any) -> Any:
        if type(value) is not int or not low <= value <= high:
            raise BadValue(f"{where}: expected an integer in [{low}, {high}], got {_kind(value)}")
        return value

    return read


def _float_reader(where: str) -> Reader:
    def read(value: Any) -> Any:
        if type(value) is float or type(value) is int:
            return float(value)
        if isinstance(value, str) and value in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[value]
        raise BadValue(f"{where}: expected a number, got {_kind(value)}")

    return read


def _decimal_reader(precision: int, scale: int, where: str) -> Reader:
    quantum = Decimal(1).scaleb(-scale)
    limit = Decimal(10) ** (precision - scale)

    def read(value: Any) -> Any:
        if type(value) not in (str, int, float):
            raise BadValue(f"{where}: expected a decimal string, got {_kind(value)}")
        try:
            number = Decimal(str(value))
            exact = number.quantize(quantum)
        except InvalidOperation:
            raise BadValue(f"{where}: {_kind(value)} is not a decimal") from None
        if not exact.is_finite() or exact != number or abs(exact) >= limit:
            raise BadValue(
                f"{where}: {_kind(value)} does not fit decimal({precision},{scale}) exactly"
            )
        return exact

    return read


def _parsed(parse: Callable[[str], Any], expected: str, where: str) -> Reader:
    def read(value: Any) -> Any:
        if not isinstance(value, str):
            raise BadValue(f"{where}: expected {expected}, got {_kind(value)}")
        try:
            return parse(value)
        except ValueError:
            raise BadValue(f"{where}: expected {expected}, got {_kind(value)}") from None

    return read


def _timestamp(text: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:  # the format always says Z; a bare one means UTC too
        return parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def _timestamp_ntz(text: str) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(text)
    if parsed.tzinfo is not None:
        raise ValueError("a zoned timestamp in a TIMESTAMP_NTZ column")
    return parsed


def _base64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def _array_reader(element: Reader, where: str) -> Reader:
    def read(value: Any) -> Any:
        if not isinstance(value, list):
            raise BadValue(f"{where}: expected an array, got {_kind(value)}")
        return [None if v is None else element(v) for v in value]

    return read


def _map_reader(key_type: DataType, value: Reader, where: str) -> Reader:
    if key_type.name == "string":
        key: Callable[[str], Any] = str
    elif key_type.name in _INT_BITS:
        key = int
    else:
        raise BadValue(
            f"column {where!r}: a map with {key_type.simple_string()} keys cannot come from "
            "JSON (its object keys are strings); use map<string, ...> or map<bigint, ...>"
        )

    def read(found: Any) -> Any:
        if not isinstance(found, dict):
            raise BadValue(f"{where}: expected an object, got {_kind(found)}")
        try:
            return [(key(k), None if v is None else value(v)) for k, v in found.items()]
        except ValueError as exc:
            raise BadValue(f"{where}: a key does not fit the map's key type: {exc}") from None

    return read


def _struct_reader(fields: tuple[tuple[str, Reader], ...], where: str) -> Reader:
    def read(value: Any) -> Any:
        if not isinstance(value, dict):
            raise BadValue(f"{where}: expected an object, got {_kind(value)}")
        return {
            name: None if value.get(name) is None else read_field(value[name])
            for name, read_field in fields
        }

    return read


def write_key_value(value: Any, dtype: DataType) -> Any:
    """A key column's value (as PySpark holds it) as the format writes it in JSON."""
    name = dtype.name
    if value is None or name in ("string", "boolean") or name in _INT_BITS:
        return value
    if name in ("double", "float"):
        if math.isnan(value):
            return "NaN"
        return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if name == "decimal":
        return format(value, "f")
    if name == "date":
        return value.isoformat()
    if name == "timestamp":
        return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if name == "timestamp_ntz":
        return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
    if name == "binary":
        return base64.b64encode(bytes(value)).decode()
    raise BadValue(f"a key of type {dtype.simple_string()} has no JSON form")
