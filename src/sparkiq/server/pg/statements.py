"""Reading statement text the way the endpoint needs it: splitting a simple query into
statements and binding ``$n`` parameters as SQL literals.

Both scan the text once, skipping string literals, quoted identifiers and comments, so a
``;`` or ``$1`` inside them is left alone.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal

import sqlglot
from sqlglot import exp

from sparkiq.sql.errors import SqlUnsupportedError

__all__ = [
    "BINARY_PARAMETER_OIDS",
    "LIMIT",
    "bind_parameters",
    "code_only",
    "code_segments",
    "is_blank",
    "parameter_count",
    "parameter_uses",
    "split_statements",
]

_NUMERIC_OIDS = frozenset({20, 21, 23, 26, 700, 701, 1700})
_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_DAYS = dt.date(2000, 1, 1).toordinal()


def _numeric(data: bytes) -> str:
    """Postgres' binary numeric (base-10000 digits, weight, sign, display scale)."""
    count, weight, sign, scale = struct.unpack("!hhHH", data[:8])
    if sign == 0xC000:
        return "'NaN'::DOUBLE"
    digits = struct.unpack(f"!{count}H", data[8 : 8 + 2 * count])
    with decimal.localcontext() as context:
        context.prec = 4 * (abs(weight) + count + 1) + scale  # exact: every digit fits
        value = sum((Decimal(d).scaleb(4 * (weight - i)) for i, d in enumerate(digits)), Decimal(0))
        value = value.quantize(Decimal(1).scaleb(-scale))
    return format(-value if sign == 0x4000 else value, "f")


def _timestamp(micros: int) -> dt.datetime:
    return _PG_EPOCH + dt.timedelta(microseconds=micros)


def _timestamptz(data: bytes) -> str:
    # An instant, as the naive local time PySpark's timestamp values hold (types.py sends
    # them the other way).
    instant = _timestamp(struct.unpack("!q", data)[0]).replace(tzinfo=dt.UTC)
    return f"TIMESTAMP '{instant.astimezone().replace(tzinfo=None).isoformat(sep=' ')}'"


_BINARY_DECODERS: dict[int, Callable[[bytes], str]] = {
    16: lambda b: "TRUE" if b != b"\x00" else "FALSE",
    20: lambda b: str(struct.unpack("!q", b)[0]),
    21: lambda b: str(struct.unpack("!h", b)[0]),
    23: lambda b: str(struct.unpack("!i", b)[0]),
    700: lambda b: repr(struct.unpack("!f", b)[0]),
    701: lambda b: repr(struct.unpack("!d", b)[0]),
    1700: _numeric,
    1082: lambda b: (
        f"DATE '{dt.date.fromordinal(_PG_EPOCH_DAYS + struct.unpack('!i', b)[0]).isoformat()}'"
    ),
    1114: lambda b: f"TIMESTAMP '{_timestamp(struct.unpack('!q', b)[0]).isoformat(sep=' ')}'",
    1184: _timestamptz,
}
_TEXT_OIDS = frozenset({0, 18, 19, 25, 705, 1042, 1043})
#: Parameter types the endpoint reads in the binary format (and so may describe a
#: parameter as: clients that ask, asyncpg, then send values in that format).
BINARY_PARAMETER_OIDS = frozenset(_BINARY_DECODERS) | {25}
#: :func:`parameter_uses`' name for a parameter used as a LIMIT or OFFSET.
LIMIT = "limit"
_PARAM = re.compile(r"\$(\d+)")


def code_segments(text: str) -> Iterator[tuple[str, int, int]]:
    """``(kind, start, end)`` pieces of ``text`` in order, ``kind`` one of ``"code"``,
    ``"literal"`` (a '...' string), ``"quoted"`` (a "..." identifier) or ``"comment"``."""
    i, n, start = 0, len(text), 0
    while i < n:
        c = text[i]
        end = -1
        kind = "comment"
        if c in "'\"":
            kind = "literal" if c == "'" else "quoted"
            j = i + 1
            while j < n:
                if text[j] == c:
                    if j + 1 < n and text[j + 1] == c:  # '' or "" escapes the quote
                        j += 2
                        continue
                    break
                j += 1
            end = min(j + 1, n)
        elif text.startswith("--", i):
            newline = text.find("\n", i)
            end = n if newline < 0 else newline
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            end = n if close < 0 else close + 2
        if end < 0:
            i += 1
            continue
        if start < i:
            yield "code", start, i
        yield kind, i, end
        start = i = end
    if start < n:
        yield "code", start, n


def _segments(text: str) -> Iterator[tuple[bool, int, int]]:
    """``(is_code, start, end)`` pieces of ``text``: code, or a literal/identifier/comment."""
    for kind, start, end in code_segments(text):
        yield kind == "code", start, end


def code_only(text: str) -> str:
    """``text`` with its string literals emptied (``''``) and comments dropped: what to
    search for names that decide how a statement is answered."""
    out = []
    for kind, start, end in code_segments(text):
        if kind == "literal":
            out.append("''")
        elif kind != "comment":
            out.append(text[start:end])
        else:
            out.append(" ")
    return "".join(out)


def is_blank(text: str) -> bool:
    """Whether ``text`` holds nothing but whitespace and comments (Postgres answers such a
    query with EmptyQueryResponse: ``-- ping`` is how pgx pings)."""
    return all(
        kind == "comment" or not text[start:end].strip() for kind, start, end in code_segments(text)
    )


def split_statements(text: str) -> list[str]:
    """The statements of a simple query, stripped, in order (empty ones kept as ``""``
    only when the whole text is empty)."""
    parts: list[str] = []
    current: list[str] = []
    for is_code, start, end in _segments(text):
        piece = text[start:end]
        if not is_code:
            current.append(piece)
            continue
        pieces = piece.split(";")
        current.append(pieces[0])
        for more in pieces[1:]:
            parts.append("".join(current).strip())
            current = [more]
    parts.append("".join(current).strip())
    statements = [p for p in parts if p]
    return statements or [""]


def parameter_count(text: str) -> int:
    """The highest ``$n`` in the code of ``text`` (0 when there is none)."""
    highest = 0
    for is_code, start, end in _segments(text):
        if is_code:
            for match in _PARAM.finditer(text, start, end):
                highest = max(highest, int(match.group(1)))
    return highest


def parameter_uses(text: str) -> dict[int, tuple[str, str]]:
    """What each ``$n`` of ``text`` is compared with, as far as its shape says: ``n ->
    (qualifier, column)`` for ``column <op> $n``, ``$n <op> column``, ``column [NOT] IN
    (.., $n, ..)`` and ``column BETWEEN $n AND $m`` (qualifier ``""`` when the column is
    not qualified), ``n -> ("", LIMIT)`` for ``LIMIT $n``/``OFFSET $n``. A parameter used
    otherwise, or a text sqlglot cannot read, has no entry."""
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.SqlglotError:
        return {}
    uses: dict[int, tuple[str, str]] = {}
    for node in tree.find_all(exp.Parameter):
        try:
            number = int(node.name)
        except ValueError:
            continue
        parent = node.parent
        other: exp.Expression | None = None
        if isinstance(parent, exp.Limit | exp.Offset):
            uses[number] = ("", LIMIT)
            continue
        if isinstance(parent, exp.Binary) and not isinstance(parent, exp.Connector):
            other = parent.expression if node.arg_key == "this" else parent.this
        elif isinstance(parent, exp.In | exp.Between) and node.arg_key != "this":
            other = parent.this
        if isinstance(other, exp.Column):
            uses[number] = (other.table, other.name)
    return uses


def bind_parameters(
    text: str,
    values: Sequence[bytes | None],
    formats: Sequence[int],
    oids: Sequence[int],
) -> str:
    """``text`` with each ``$n`` replaced by the SQL literal of the n-th value (Bind's
    values, format codes and the statement's parameter type OIDs; 0 = unspecified)."""
    if not values:
        return text
    literals = [
        _literal(value, _format_of(formats, i), oids[i] if i < len(oids) else 0)
        for i, value in enumerate(values)
    ]
    out: list[str] = []
    for is_code, start, end in _segments(text):
        if not is_code:
            out.append(text[start:end])
            continue

        def replace(match: re.Match[str]) -> str:
            index = int(match.group(1)) - 1
            if not 0 <= index < len(literals):
                raise SqlUnsupportedError(
                    f"parameter ${index + 1} has no value ({len(literals)} were bound)",
                    code="parameters",
                )
            return literals[index]

        out.append(_PARAM.sub(replace, text[start:end]))
    return "".join(out)


def _format_of(formats: Sequence[int], index: int) -> int:
    if not formats:
        return 0
    return formats[0] if len(formats) == 1 else formats[index]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _literal(value: bytes | None, fmt: int, oid: int) -> str:
    if value is None:
        return "NULL"
    if fmt == 1:
        if oid in _BINARY_DECODERS:
            return _BINARY_DECODERS[oid](value)
        if oid in _TEXT_OIDS:
            return _quote(value.decode())
        raise SqlUnsupportedError(
            f"binary parameters of type OID {oid} are not supported; send it as text",
            code="parameters",
        )
    text = value.decode()
    if oid in _NUMERIC_OIDS:
        try:
            Decimal(text)
        except ArithmeticError:
            raise SqlUnsupportedError(
                f"parameter {text!r} is not a number", code="parameters"
            ) from None
        return text
    if oid == 16:
        return "TRUE" if text.lower() in ("t", "true", "1", "yes", "on") else "FALSE"
    return _quote(text)
