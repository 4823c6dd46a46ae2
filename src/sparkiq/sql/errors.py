"""Errors of the SQL engine: every one says where the problem is and what to write instead.

Hierarchy (all under :class:`~sparkiq.errors.InvalidQueryError`, so callers that already
catch invalid queries catch these too)::

    SqlError                    code, message, line, column, snippet, field, candidates
    ├── SqlSyntaxError          the text does not parse (line, column and a caret snippet)
    ├── SqlUnsupportedError     valid SQL that pull queries refuse (DDL, COPY, table functions,
    │                           several statements...); the message says what is supported
    ├── SqlUnknownNameError     a table or column that does not exist; ``candidates`` holds
    │                           the closest names
    ├── SqlLimitError           a :class:`~sparkiq.sql.SqlLimits` bound was exceeded
    └── SqlPartitionError       a partition could not answer (``reason`` is the
                                :class:`~sparkiq.query.FailureReason`): the query is refused
                                rather than answered with rows missing

``code`` is the error's :class:`~sparkiq.error_codes.ErrorCode` (``"syntax"``,
``"unknown_column"``...: its row in the table says the HTTP status and SQLSTATE); ``message``
is for people.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Self

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import InvalidQueryError

__all__ = [
    "SqlError",
    "SqlLimitError",
    "SqlPartitionError",
    "SqlSyntaxError",
    "SqlUnknownNameError",
    "SqlUnsupportedError",
    "closest",
    "locate",
    "push_query_error",
    "snippet_at",
]


class SqlError(InvalidQueryError):
    """A SQL statement was refused; the attributes locate the problem.

    ``line`` and ``column`` are 1-based (None when unknown); ``snippet`` is the offending
    line with a caret under the column; ``field`` names the identifier concerned and
    ``candidates`` the closest valid names.
    """

    code = ErrorCode.SQL_ERROR

    def __init__(
        self,
        message: str,
        *,
        code: ErrorCode | None = None,
        line: int | None = None,
        column: int | None = None,
        snippet: str | None = None,
        field: str | None = None,
        candidates: Iterable[str] = (),
        store: str | None = None,
        partition: int | None = None,
        position: Any = None,
    ) -> None:
        super().__init__(
            message, code=code, field=field, store=store, partition=partition, position=position
        )
        self.line = line
        self.column = column
        self.snippet = snippet
        self.candidates = tuple(candidates)

    def __str__(self) -> str:
        text = self.message
        if self.line is not None:
            text += f" (line {self.line}, column {self.column})"
        if self.snippet:
            text += "\n" + self.snippet
        return text

    @classmethod
    def from_answer(cls, code: ErrorCode, doc: Mapping[str, Any], status: int) -> Self:
        """The error of an answer, keeping where the problem is (the caret snippet)."""
        error = super().from_answer(code, doc, status)
        error.line, error.column = doc.get("line"), doc.get("column")
        error.snippet = doc.get("snippet")
        error.candidates = tuple(doc.get("candidates") or ())
        return error

    def to_dict(self) -> dict[str, Any]:
        """The error as plain data (for JSON answers)."""
        return {
            "code": self.code.wire,
            "message": self.message,
            "line": self.line,
            "column": self.column,
            "snippet": self.snippet,
            "field": self.field,
            "candidates": list(self.candidates),
        }


class SqlSyntaxError(SqlError):
    """The statement does not parse."""

    code = ErrorCode.SYNTAX


class SqlUnsupportedError(SqlError):
    """Valid SQL that a pull query does not allow or support."""

    code = ErrorCode.UNSUPPORTED


class SqlUnknownNameError(SqlError):
    """A table or column name that does not exist (``candidates`` lists close ones)."""

    code = ErrorCode.UNKNOWN_NAME


class SqlLimitError(SqlError):
    """A configured limit (statement size, result rows, time, page size) was exceeded."""

    code = ErrorCode.LIMIT


class SqlPartitionError(SqlError):
    """A partition failed to answer; ``reason`` is its FailureReason name."""

    code = ErrorCode.PARTITION_FAILED

    def __init__(self, message: str, *, reason: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.reason = reason


def push_query_error() -> SqlUnsupportedError:
    """The error of ``sql()`` given a push query: the same from ``Node.sql`` and
    ``Client.sql`` (which refuses it before contacting the node, whose ``POST /query``
    would answer it with a stream of changes that never ends)."""
    return SqlUnsupportedError(
        "EMIT CHANGES makes a push query: run it with stream() (App.stream, "
        "Client.stream); sql() runs pull queries, which answer once",
        code=ErrorCode.PUSH_QUERY,
    )


def snippet_at(text: str, line: int | None, column: int | None) -> str | None:
    """The ``line``-th line of ``text`` with a caret under ``column`` (both 1-based)."""
    if line is None or column is None:
        return None
    lines = text.splitlines() or [""]
    if not 1 <= line <= len(lines):
        return None
    source = lines[line - 1]
    return f"{source}\n{' ' * max(0, column - 1)}^"


def locate(error: SqlError, parsed: Any) -> SqlError:
    """``error`` with line, column and snippet of the first identifier named ``field`` in
    the parsed statement (for errors DuckDB reports about the rewritten query)."""
    if error.line is not None or not error.field:
        return error
    from sqlglot import exp

    wanted = error.field.lower()
    for node in parsed.tree.walk():
        name = None
        if isinstance(node, exp.Identifier | exp.Anonymous):
            name = node.name
        if name is not None and name.lower() == wanted:
            ident = node if isinstance(node, exp.Identifier) else None
            meta = ident.meta if ident is not None else {}
            line, col = meta.get("line"), meta.get("col")
            if ident is not None and line is None:
                continue  # not in the text: an alias the engine gave (sparkiq.sql.names)
            if ident is None:
                offset = parsed.text.lower().find(wanted + "(")
                if offset >= 0:
                    line = parsed.text.count("\n", 0, offset) + 1
                    col = offset - (parsed.text.rfind("\n", 0, offset) + 1) + 1
            elif isinstance(col, int):
                col = col - len(name) + 1
            error.line, error.column = line, col
            error.snippet = snippet_at(parsed.text, line, col)
            return error
    # a function sqlglot knows by name (upper, sum...): its call in the text
    offset = parsed.text.lower().find(wanted + "(")
    if offset >= 0 and (offset == 0 or not parsed.text[offset - 1].isalnum()):
        error.line = parsed.text.count("\n", 0, offset) + 1
        error.column = offset - (parsed.text.rfind("\n", 0, offset) + 1) + 1
        error.snippet = snippet_at(parsed.text, error.line, error.column)
    return error


def closest(name: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The names closest to ``name`` (case-insensitive), best first; may be empty."""
    pool = list(dict.fromkeys(names))
    lowered = {c.lower(): c for c in pool}
    found = difflib.get_close_matches(name.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[f] for f in found]
