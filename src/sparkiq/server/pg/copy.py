"""``COPY ... TO STDOUT``: a pull query's rows in Postgres' copy formats.

Bulk readers fetch results this way rather than row by row: connectorx (polars'
``read_database_uri``) and the ADBC PostgreSQL driver send ``COPY (SELECT ...) TO STDOUT``
in the binary format, psql's ``\\copy`` and many scripts in text or CSV. Copying *out* is a
read: the query inside runs as any other statement (read-only, limits, grants, the
session's bound), and its rows are sent as ``CopyData`` in the format asked for. Copying
*in* (``COPY ... FROM``) is a write, and ``COPY ... TO`` a file or a program would touch the
server: both are refused.

Accepted forms: ``COPY (query) TO STDOUT`` or ``COPY table [(columns)] TO STDOUT``, then
either Postgres' option list ``[WITH] (FORMAT text|csv|binary, HEADER [bool], DELIMITER
'c', NULL 'text')`` or the older words ``[WITH] BINARY | CSV [HEADER] | DELIMITER [AS] 'c'
| NULL [AS] 'text'``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sparkiq.error_codes import ErrorCode
from sparkiq.server.pg.statements import code_only
from sparkiq.server.pg.types import PgColumn
from sparkiq.sql.errors import SqlSyntaxError, SqlUnsupportedError

__all__ = ["CopyOut", "copy_rows", "parse_copy"]

_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
_TEXT_ESCAPES = {ord("\\"): "\\\\", ord("\t"): "\\t", ord("\n"): "\\n", ord("\r"): "\\r"}
_TARGET = re.compile(r"\s*TO\s+(STDOUT|PROGRAM\b|'|\"|[A-Za-z_])", re.IGNORECASE)
_NAME = r'(?:[A-Za-z_][\w$]*|"(?:[^"]|"")+")'
_TABLE = re.compile(rf"\s*({_NAME}(?:\s*\.\s*{_NAME})?)\s*(\([^)]*\))?", re.IGNORECASE)
_BOOLEAN = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}


@dataclass(frozen=True, slots=True)
class CopyOut:
    """A ``COPY ... TO STDOUT``: the query whose rows to send, and how to write them."""

    query: str
    format: str = "text"  # text | csv | binary
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"

    @property
    def binary(self) -> bool:
        return self.format == "binary"


def parse_copy(text: str) -> CopyOut:
    """The ``COPY`` statement ``text`` as a :class:`CopyOut`; refuses what is not a copy
    out to the client (:class:`~sparkiq.sql.errors.SqlUnsupportedError`, SQLSTATE 42501
    for writes and files) or cannot be read (:class:`~sparkiq.sql.errors.SqlSyntaxError`)."""
    body = text.strip().rstrip(";").strip()
    if not body[:4].upper() == "COPY":
        raise SqlSyntaxError("expected a COPY statement")
    rest = body[4:]
    if rest.lstrip().startswith("("):
        start = len(rest) - len(rest.lstrip())
        end = _closing(rest, start)
        query = rest[start + 1 : end].strip()
        rest = rest[end + 1 :]
    else:
        table = _TABLE.match(rest)
        if table is None:
            raise SqlSyntaxError(
                "COPY needs (a query) or a table name: COPY (SELECT ...) TO STDOUT"
            )
        columns = table.group(2)
        query = f"SELECT {columns[1:-1] if columns else '*'} FROM {table.group(1)}"
        rest = rest[table.end() :]
    if re.match(r"\s*FROM\b", rest, re.IGNORECASE):
        raise SqlUnsupportedError(
            "COPY ... FROM writes rows; sparkiq serves read-only tables written by Spark: "
            "COPY (SELECT ...) TO STDOUT reads them",
            code=ErrorCode.FORBIDDEN_STATEMENT,
        )
    target = _TARGET.match(rest)
    if target is None:
        raise SqlSyntaxError("expected TO STDOUT after the COPY source")
    if target.group(1).upper() != "STDOUT":
        raise SqlUnsupportedError(
            "COPY ... TO a file or a program would touch the server's files; copy to the "
            "client instead: COPY (SELECT ...) TO STDOUT (psql: \\copy)",
            code=ErrorCode.FORBIDDEN_STATEMENT,
        )
    return _options(query, rest[target.end() :])


def _closing(text: str, start: int) -> int:
    """The index of the parenthesis closing the one at ``start``, outside strings and
    comments (a ')' inside a literal does not close the query)."""
    depth = 0
    code = code_only(text)  # literals and comments blanked, same length
    for index in range(start, len(code)):
        if code[index] == "(":
            depth += 1
        elif code[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    raise SqlSyntaxError("the COPY query's parenthesis is not closed")


def _options(query: str, text: str) -> CopyOut:
    text = text.strip()
    if text[:4].upper() == "WITH":
        text = text[4:].strip()
    settings: dict[str, Any] = {}
    if text.startswith("("):
        if not text.endswith(")"):
            raise SqlSyntaxError(f"cannot read the COPY options {text!r}")
        for item in _split_options(text[1:-1]):
            name, _, value = item.partition(" ")
            _option(settings, name.lower(), value.strip())
    else:
        words = re.findall(r"'(?:[^']|'')*'|\S+", text)
        index = 0
        while index < len(words):
            word = words[index].lower()
            if word in ("binary", "csv"):
                settings["format"] = word
            elif word == "header":
                settings["header"] = True
            elif word in ("delimiter", "null") and index + 1 < len(words):
                index += 1 + (words[index + 1].lower() == "as")
                _option(settings, word, words[min(index, len(words) - 1)])
            else:
                raise SqlUnsupportedError(
                    f"COPY option {words[index]!r} is not supported; sparkiq copies out with "
                    "FORMAT text|csv|binary, HEADER, DELIMITER and NULL",
                    code=ErrorCode.COPY_OPTION,
                )
            index += 1
    fmt = settings.get("format", "text")
    if fmt == "csv":
        settings.setdefault("delimiter", ",")
        settings.setdefault("null", "")
    if fmt == "binary" and ({"delimiter", "null", "header"} & set(settings)):
        raise SqlSyntaxError("COPY in the binary format takes no DELIMITER, NULL or HEADER")
    return CopyOut(query, **settings)


def _split_options(text: str) -> list[str]:
    return [
        part.strip() for part in re.split(r",(?=(?:[^']*'[^']*')*[^']*$)", text) if part.strip()
    ]


def _option(settings: dict[str, Any], name: str, value: str) -> None:
    literal = (
        value[1:-1].replace("''", "'")
        if len(value) >= 2 and value[0] == value[-1] == "'"
        else value
    )
    if name == "format":
        if literal.lower() not in ("text", "csv", "binary"):
            raise SqlUnsupportedError(
                f"COPY FORMAT {literal!r}: sparkiq writes text, csv or binary",
                code=ErrorCode.COPY_OPTION,
            )
        settings["format"] = literal.lower()
    elif name == "header":
        flag = _BOOLEAN.get(literal.lower() or "true")
        if flag is None:
            raise SqlSyntaxError(f"COPY HEADER takes a boolean, got {literal!r}")
        settings["header"] = flag
    elif name == "delimiter":
        if len(literal) != 1 or literal in "\r\n\\":
            raise SqlSyntaxError(f"the COPY delimiter must be one character, got {literal!r}")
        settings["delimiter"] = literal
    elif name == "null":
        settings["null"] = literal
    else:
        raise SqlUnsupportedError(
            f"COPY option {name!r} is not supported; sparkiq copies out with FORMAT "
            "text|csv|binary, HEADER, DELIMITER and NULL",
            code=ErrorCode.COPY_OPTION,
        )


def copy_rows(
    copy: CopyOut, columns: Sequence[PgColumn], rows: Sequence[dict[str, Any]]
) -> Iterator[bytes]:
    """The ``CopyData`` payloads of ``rows``: the binary signature and trailer around the
    tuples, or a header line and one line per row in text and CSV."""
    names = [c.name for c in columns]
    encoders: list[Callable[[Any], bytes]] = [c.encoder(copy.binary) for c in columns]
    if copy.binary:
        # The signature travels with the first tuple (or the trailer), as Postgres sends
        # it: readers that take each CopyData for whole tuples (ADBC's) expect no header
        # message on its own.
        head = _BINARY_SIGNATURE
        count = struct.pack("!h", len(columns))
        for row in rows:
            parts = [head, count]
            head = b""
            for name, encode in zip(names, encoders, strict=True):
                value = row.get(name)
                if value is None:
                    parts.append(b"\xff\xff\xff\xff")
                else:
                    data = encode(value)
                    parts.append(struct.pack("!i", len(data)) + data)
            yield b"".join(parts)
        yield head + b"\xff\xff"
        return
    line: Callable[[CopyOut, Sequence[str | None]], str] = (
        _csv_line if copy.format == "csv" else _text_line
    )
    if copy.header:
        yield line(copy, names).encode()
    for row in rows:
        values = [
            None if (v := row.get(n)) is None else encode(v).decode()
            for n, encode in zip(names, encoders, strict=True)
        ]
        yield line(copy, values).encode()


def _text_line(copy: CopyOut, values: Sequence[str | None]) -> str:
    return (
        copy.delimiter.join(copy.null if v is None else v.translate(_TEXT_ESCAPES) for v in values)
        + "\n"
    )


def _csv_line(copy: CopyOut, values: Sequence[str | None]) -> str:
    out = []
    for value in values:
        if value is None:
            out.append(copy.null)
        elif value == copy.null or any(c in value for c in (copy.delimiter, '"', "\n", "\r")):
            out.append('"' + value.replace('"', '""') + '"')
        else:
            out.append(value)
    return copy.delimiter.join(out) + "\n"
