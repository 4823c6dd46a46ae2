"""Binding a prepared statement's parameters (one Arrow row) into its text as SQL literals.

A Flight SQL client binds parameters by sending them to ``DoPut`` as record batches whose
columns are the ``?`` markers in order. The SQL engine takes statement text (its plans and
limits work on text: a bound statement is planned like one typed with the values), so each
``?`` outside string literals, quoted identifiers and comments is replaced by a literal of
its value's Arrow type: ``NULL``, ``TRUE``/``FALSE``, a number, a quoted string (quotes
doubled), or a typed literal (``DATE '...'``, ``TIMESTAMP '...'``, ``'...'::DECIMAL(p,s)``,
``'\\x..'::BLOB``). The bound text is checked against ``SqlLimits.max_statement_chars`` by
the engine like any statement.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import re
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from sparkiq.schema.arrowrows import arrow_type
from sparkiq.schema.types import TableSchema
from sparkiq.server.pg.statements import LIMIT, code_segments, parameter_uses
from sparkiq.sql.errors import SqlError

__all__ = ["bind", "markers", "parameter_schema"]

_BYTE_ESCAPES = [f"\\x{b:02x}" for b in range(256)]  # a BLOB literal's byte escapes


def markers(text: str) -> list[int]:
    """The offsets of the ``?`` parameter markers of ``text`` (in code, not in literals,
    quoted identifiers or comments)."""
    found: list[int] = []
    for kind, start, end in code_segments(text):
        if kind == "code":
            found.extend(start + i for i, c in enumerate(text[start:end]) if c == "?")
    return found


def parameter_schema(
    text: str, tables: Iterable[str], schema_of: Callable[[str], TableSchema]
) -> pa.Schema:
    """The types a client should bind ``text``'s markers with (JDBC binds by them): a
    marker compared with a column of one of ``tables`` named in the text (``col = ?``,
    ``? < col``, ``col IN (?, ?)``, ``col BETWEEN ? AND ?``) has that column's type, a
    ``LIMIT``/``OFFSET`` one int64, any other a string (a SQL string literal, which DuckDB
    casts where another type is needed). Values of other types are bound as they come."""
    places = markers(text)
    if not places:
        return pa.schema([])
    numbered = []
    last = 0
    for number, place in enumerate(places, start=1):
        numbered.append(f"{text[last:place]}${number}")
        last = place + 1
    numbered.append(text[last:])
    uses = parameter_uses("".join(numbered))
    by_column: dict[str, pa.DataType | None] = {}
    for table in tables:
        if re.search(rf"\b{re.escape(table)}\b", text, re.I):
            for field in schema_of(table).fields:
                kind = arrow_type(field.type)
                name = field.name.lower()
                by_column[name] = kind if by_column.get(name, kind) == kind else None
    fields = []
    for number in range(1, len(places) + 1):
        _, column = uses.get(number, ("", ""))
        kind = pa.int64() if column == LIMIT else by_column.get(column.lower()) or pa.string()
        fields.append(pa.field(f"${number}", kind))
    return pa.schema(fields)


def bind(text: str, parameters: pa.Table | None) -> str:
    """``text`` with its markers replaced by the values of ``parameters``' one row (column
    ``i`` for marker ``i``). Raises :class:`~sparkiq.sql.errors.SqlError` when the counts
    differ or a value has no SQL literal."""
    places = markers(text)
    if not places and (parameters is None or parameters.num_columns == 0):
        return text
    if parameters is None:
        raise SqlError(
            f"the statement has {len(places)} parameter markers (?) and no values were "
            "bound: bind one row of parameters before executing it"
        )
    if parameters.num_rows != 1:
        raise SqlError(
            f"{parameters.num_rows} rows of parameters were bound: this endpoint runs a "
            "prepared query with one row of parameters at a time"
        )
    if parameters.num_columns != len(places):
        raise SqlError(
            f"the statement has {len(places)} parameter markers (?) but "
            f"{parameters.num_columns} values were bound"
        )
    out = []
    last = 0
    for index, place in enumerate(places):
        column = parameters.column(index)
        out.append(text[last:place])
        out.append(_literal(column[0].as_py(), column.type, index + 1))
        last = place + 1
    out.append(text[last:])
    return "".join(out)


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _literal(value: Any, kind: pa.DataType, number: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return f"{_quote(str(value))}::DOUBLE"
        return f"{value!r}::DOUBLE"
    if isinstance(value, decimal.Decimal):
        return f"{_quote(format(value, 'f'))}::DECIMAL({kind.precision},{kind.scale})"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bytes):
        escaped = "".join(_BYTE_ESCAPES[b] for b in value)
        return f"{_quote(escaped)}::BLOB"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:  # an instant: as the node's local time, as Spark shows it
            value = value.astimezone().replace(tzinfo=None)
        return f"TIMESTAMP {_quote(value.isoformat(sep=' '))}"
    if isinstance(value, dt.date):
        return f"DATE {_quote(value.isoformat())}"
    if isinstance(value, dt.time):
        return f"TIME {_quote(value.isoformat())}"
    raise SqlError(
        f"parameter {number} has Arrow type {kind}, which this endpoint cannot bind: bind "
        "strings, numbers, booleans, dates, times or timestamps"
    )
