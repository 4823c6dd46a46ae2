"""Columns given as a Spark DDL string (``"user STRING, total BIGINT, tags ARRAY<STRING>"``).

What ``StructType.fromDDL`` accepts for the types a table can hold: ``STRING`` (``VARCHAR(n)``,
``CHAR(n)``), ``BOOLEAN``, ``TINYINT``/``BYTE``, ``SMALLINT``/``SHORT``, ``INT``/``INTEGER``,
``BIGINT``/``LONG``, ``FLOAT``/``REAL``, ``DOUBLE``, ``DECIMAL(p,s)`` (``DEC``, ``NUMERIC``),
``DATE``, ``TIMESTAMP`` (``TIMESTAMP_LTZ``), ``TIMESTAMP_NTZ``, ``BINARY``, ``ARRAY<t>``,
``MAP<k, v>`` and ``STRUCT<name: t, ...>``, case-insensitive; a column may end with
``NOT NULL``. Names may be quoted with backticks. Pure Python: no Spark needed.
"""

from __future__ import annotations

import re

from sparkiq.errors import ConfigError
from sparkiq.schema.types import DataType, Field

__all__ = ["parse_columns", "parse_ddl_type"]

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][A-Za-z0-9_]*)|(\d+)|([<>(),:]))")
_SIMPLE = {
    "string": "string",
    "varchar": "string",
    "char": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "tinyint": "byte",
    "byte": "byte",
    "smallint": "short",
    "short": "short",
    "int": "integer",
    "integer": "integer",
    "bigint": "long",
    "long": "long",
    "float": "float",
    "real": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
    "binary": "binary",
}


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[str] = []
        pos = 0
        while pos < len(text):
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos:
                if not text[pos:].strip():
                    break
                raise self.error(f"unexpected {text[pos:].strip()[:20]!r}")
            pos = match.end()
            quoted, word, number, punct = match.groups()
            self.items.append(
                quoted[1:-1].replace("``", "`") if quoted else word or number or punct
            )
        self.at = 0

    def error(self, problem: str) -> ConfigError:
        return ConfigError(
            f"cannot read the columns {self.text!r}: {problem}; expected Spark DDL such as "
            "'user STRING, total BIGINT'"
        )

    def peek(self) -> str | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self, expected: str | None = None) -> str:
        found = self.peek()
        if found is None or (expected is not None and found.lower() != expected):
            raise self.error(f"expected {expected or 'more'}, found {found or 'the end'}")
        self.at += 1
        return found

    def number(self) -> int:
        found = self.take()
        if not found.isdigit():
            raise self.error(f"expected a number, found {found!r}")
        return int(found)


def _type(tokens: _Tokens) -> DataType:
    word = tokens.take().lower()
    if word in ("decimal", "dec", "numeric"):
        precision, scale = 10, 0
        if tokens.peek() == "(":
            tokens.take("(")
            precision = tokens.number()
            if tokens.peek() == ",":
                tokens.take(",")
                scale = tokens.number()
            tokens.take(")")
        return DataType("decimal", precision=precision, scale=scale)
    if word == "array":
        tokens.take("<")
        element = _type(tokens)
        tokens.take(">")
        return DataType("array", element=element)
    if word == "map":
        tokens.take("<")
        key = _type(tokens)
        tokens.take(",")
        value = _type(tokens)
        tokens.take(">")
        return DataType("map", key=key, value=value)
    if word == "struct":
        tokens.take("<")
        fields: list[Field] = []
        while tokens.peek() != ">":
            if fields:
                tokens.take(",")
            name = tokens.take()
            if tokens.peek() == ":":
                tokens.take(":")
            fields.append(_field(name, tokens))
        tokens.take(">")
        return DataType("struct", fields=tuple(fields))
    simple = _SIMPLE.get(word)
    if simple is None:
        raise tokens.error(f"unknown type {word!r}")
    if word in ("varchar", "char"):
        tokens.take("(")
        tokens.number()
        tokens.take(")")
    return DataType(simple)


def _field(name: str, tokens: _Tokens) -> Field:
    dtype = _type(tokens)
    nullable = True
    if (tokens.peek() or "").lower() == "not":
        tokens.take()
        tokens.take("null")
        nullable = False
    return Field(name, dtype, nullable)


def parse_columns(text: str) -> tuple[Field, ...]:
    """The columns of a DDL string, in order; :class:`~sparkiq.errors.ConfigError` naming
    the problem when it is not one."""
    tokens = _Tokens(text)
    fields: list[Field] = []
    while tokens.peek() is not None:
        if fields:
            tokens.take(",")
        fields.append(_field(tokens.take(), tokens))
    if not fields:
        raise tokens.error("no columns")
    return tuple(fields)


def parse_ddl_type(text: str) -> DataType:
    """One type in DDL (``"bigint"``, ``"decimal(10,2)"``, ``"array<string>"``)."""
    tokens = _Tokens(text)
    dtype = _type(tokens)
    if tokens.peek() is not None:
        raise tokens.error(f"unexpected {tokens.peek()!r} after the type")
    return dtype
