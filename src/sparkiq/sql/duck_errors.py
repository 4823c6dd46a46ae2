"""DuckDB's errors in the user's words.

DuckDB reports problems in its own vocabulary: physical types (``INT32``, ``INT64``), error
classes (``Conversion Error:``, ``Binder Error:``), the rewritten statement the engine ran
(relations named ``__sq_r0``) and lists of candidate function signatures. A user wrote SQL
over their tables: :func:`translate` turns a DuckDB message into a :class:`SqlError` that
says what went wrong in SQL's type names, names the column, value or function concerned
(``field``, which :func:`~sparkiq.sql.errors.locate` then finds in the statement for the
caret) and what to write instead. DuckDB's own text never reaches the user; it is logged at
debug level (logger ``sparkiq.sql``) for whoever maintains the engine.

Errors of the bounds (memory, time, value sizes) are :mod:`sparkiq.sql.duck`'s; this module
knows only what a statement can get wrong.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from sparkiq.error_codes import ErrorCode
from sparkiq.sql.errors import SqlError, SqlUnknownNameError

__all__ = ["sql_type", "translate"]

_log = logging.getLogger("sparkiq.sql")

# DuckDB's physical type names (its conversion messages use them) as SQL spells them
_PHYSICAL = {
    "INT8": "tinyint", "INT16": "smallint", "INT32": "integer", "INT64": "bigint",
    "INT128": "hugeint", "UINT8": "utinyint", "UINT16": "usmallint", "UINT32": "uinteger",
    "UINT64": "ubigint", "UINT128": "uhugeint", "BOOL": "boolean", "VARCHAR": "string",
    "INTEGER_LITERAL": "integer", "STRING_LITERAL": "string", "FLOAT": "float",
    "DOUBLE": "double",
}  # fmt: skip
_PREFIX = re.compile(r"^[A-Z][A-Za-z ]*Error: ")
_SOURCE = re.compile(r" when casting from source column (\w+)$")
_INTERNAL = re.compile(r"__sq_\w+")


def sql_type(name: str) -> str:
    """A DuckDB type name as the user's SQL spells it (``INT32`` -> ``integer``)."""
    name = name.strip()
    return _PHYSICAL.get(name.upper(), name.lower())


def _types(text: str) -> str:
    """Every type name in a comma-separated list ``text`` in SQL's spelling."""
    return ", ".join(sql_type(t) for t in text.split(","))


def translate(message: str) -> SqlError:
    """The :class:`SqlError` for DuckDB's error ``message`` (the exception's text)."""
    _log.debug("DuckDB error: %s", message)
    first = _INTERNAL.sub("table", (message.splitlines() or [""])[0].strip())
    kind = _PREFIX.match(first)
    body = first[kind.end() :] if kind else first
    column = None
    source = _SOURCE.search(body)
    if source is not None:
        column, body = source.group(1), body[: source.start()]
    for pattern, build in _RULES:
        found = pattern.search(body)
        if found is not None:
            error = build(found, column, message)
            if error.field is None and column is not None:
                error.field = column
            return error
    # Not one we know: DuckDB's words minus its error class, internal names and types
    words = re.sub(r"\b(U?INT(?:8|16|32|64|128))\b", lambda m: sql_type(m.group(1)), body)
    return SqlError(
        f"the query failed: {words.rstrip('!.')}", code=ErrorCode.EXECUTION, field=column
    )


def _conversion(found: re.Match[str], column: str | None, _: str) -> SqlError:
    value, target = found.group("value"), sql_type(found.group("type"))
    if column is not None:  # a value of a column: the column's values do not all convert
        return SqlError(
            f"column {column} holds {value}, which is not {_a(target)}: compare {column} with "
            f"a value of its own type (a quoted string for a string column), or cast with "
            f"TRY_CAST({column} AS {target.upper()}), which gives NULL where a value does not "
            "convert",
            code=ErrorCode.INVALID_VALUE,
        )
    return SqlError(
        f"{value} is not {_a(target)}: write {_a(target)} value (numbers without quotes, "
        f"e.g. 5 rather than '5'), or compare with a column of the value's type",
        code=ErrorCode.INVALID_VALUE,
    )


def _a(word: str) -> str:
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _out_of_range_cast(found: re.Match[str], column: str | None, _: str) -> SqlError:
    source, value, target = sql_type(found.group(1)), found.group(2), sql_type(found.group(3))
    return SqlError(
        f"the {source} value {value} is out of range for {target}: cast to a wider type "
        "(BIGINT, DECIMAL(38, 0) or DOUBLE)",
        code=ErrorCode.OUT_OF_RANGE,
    )


def _impossible_cast(found: re.Match[str], column: str | None, _: str) -> SqlError:
    source, target = sql_type(found.group(1)), sql_type(found.group(2))
    what = f"column {column} ({source})" if column else f"a {source} value"
    return SqlError(
        f"{what} cannot be cast to {target}: SQL has no conversion between these types; "
        "cast to a type the value converts to (a number, string, date or timestamp type), "
        "or select a field of a struct (col.field) or an element of a list (col[1])",
        code=ErrorCode.IMPOSSIBLE_CAST,
    )


def _bad_temporal(found: re.Match[str], column: str | None, _: str) -> SqlError:
    kind, value = found.group(1), found.group(2)
    shape = {"date": "'YYYY-MM-DD'", "time": "'HH:MM:SS'"}.get(kind, "'YYYY-MM-DD HH:MM:SS'")
    where = f"column {column} holds {value}, which" if column else f"'{value.strip(chr(34))}'"
    return SqlError(
        f"{where} is not a valid {kind}: write {kind}s as {shape}",
        code=ErrorCode.INVALID_VALUE,
    )


def _no_function(found: re.Match[str], column: str | None, message: str) -> SqlError:
    name, args = found.group(1), _types(found.group(2))
    if not re.fullmatch(r"\w+", name):
        operator = {"~~": "LIKE", "!~~": "NOT LIKE", "~~*": "ILIKE"}.get(name, name)
        return SqlError(
            f"operator {operator} cannot take ({args}): cast one side so both have one type, "
            "e.g. CAST(x AS BIGINT) or CAST(x AS VARCHAR)",
            code=ErrorCode.TYPE_MISMATCH,
        )
    takes = sorted(
        {_types(m.group(1)) for m in re.finditer(rf"\n\s*{name}\(([^)]*)\)", message)} - {""}
    )
    accepted = f"; it takes ({'), ('.join(_arg_types(t) for t in takes)})" if takes else ""
    return SqlError(
        f"function {name}() cannot take ({args}){accepted}: cast the argument, e.g. "
        f"{name}(CAST(x AS ...))",
        code=ErrorCode.TYPE_MISMATCH,
        field=name,
    )


def _arg_types(signature: str) -> str:
    """``arg decimal, / `` (DuckDB's parameter list) as ``decimal``."""
    parts = [p.strip() for p in signature.split(",") if p.strip() not in ("", "/")]
    return ", ".join(p.split()[-1] for p in parts)


def _compare(found: re.Match[str], column: str | None, _: str) -> SqlError:
    left, right = sql_type(found.group(1)), sql_type(found.group(2))
    return SqlError(
        f"cannot compare {left} values with {right} values: cast one side, e.g. "
        "CAST(x AS VARCHAR), so both have one type",
        code=ErrorCode.TYPE_MISMATCH,
    )


def _overflow(found: re.Match[str], column: str | None, _: str) -> SqlError:
    return SqlError(
        f"{sql_type(found.group(2))} overflow in {found.group(1)} of {found.group(3)}: cast "
        "an operand to a wider type first (BIGINT, DECIMAL(38, 0) or DOUBLE)",
        code=ErrorCode.OUT_OF_RANGE,
    )


def _grouping(found: re.Match[str], column: str | None, _: str) -> SqlError:
    name = found.group(1)
    return SqlError(
        f"column {name} must appear in GROUP BY or be used in an aggregate function "
        f"(e.g. max({name}) or any_value({name}))",
        code=ErrorCode.GROUPING,
        field=name,
    )


def _negative_limit(found: re.Match[str], column: str | None, _: str) -> SqlError:
    return SqlError("LIMIT and OFFSET cannot be negative", code=ErrorCode.INVALID_LIMIT)


def _struct_key(found: re.Match[str], column: str | None, message: str) -> SqlError:
    fields = re.findall(r'"([^"]+)"', message.split("Candidate Entries:", 1)[-1])
    known = f"; its fields: {fields}" if "Candidate Entries:" in message else ""
    return SqlUnknownNameError(
        f"the struct has no field {found.group(1)!r}{known}",
        code=ErrorCode.UNKNOWN_FIELD,
        field=found.group(1),
        candidates=fields,
    )


def _set_columns(found: re.Match[str], column: str | None, _: str) -> SqlError:
    return SqlError(
        "each side of UNION, INTERSECT or EXCEPT must select the same number of columns",
        code=ErrorCode.SET_OPERATION,
    )


_Rule = tuple[re.Pattern[str], Callable[[re.Match[str], str | None, str], SqlError]]
_RULES: list[_Rule] = [
    (re.compile(r"Could not convert string (?P<value>'.*'|\".*\") to (?P<type>.+)$"), _conversion),
    (re.compile(r"Type (\S+) with value (.+) can't be cast because the value is out of range "
                r"for the destination type (\S+)"), _out_of_range_cast),
    (re.compile(r"Type \S+ with value (?P<value>.+) can't be cast to the destination type "
                r"(?P<type>.+)$"), _conversion),
    (re.compile(r"Unimplemented type for cast \((.+) -> (.+)\)"), _impossible_cast),
    (re.compile(r"invalid (date|timestamp|time) field format: (\".*\")"), _bad_temporal),
    (re.compile(r"(date|timestamp|time) field value out of range: (\".*\")"), _bad_temporal),
    (re.compile(r"argument types '(.+?)\((.*)\)'"), _no_function),
    (re.compile(r"Cannot compare values of type (\S+) and (\S+)"), _compare),
    (re.compile(r"Overflow in (\w+) of (\S+) \((.*)\)"), _overflow),
    (re.compile(r'column "([^"]+)" must appear in the GROUP BY clause'), _grouping),
    (re.compile(r"LIMIT/OFFSET cannot be negative"), _negative_limit),
    (re.compile(r'Could not find key "([^"]+)" in struct'), _struct_key),
    (re.compile(r"Set operations can only apply to expressions with the same number"),
     _set_columns),
]  # fmt: skip
