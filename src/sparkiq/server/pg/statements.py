"""Reading statement text the way the endpoint needs it: splitting a simple query into
statements, finding its ``$n`` parameters and what they are compared with.

Each scans the text once, skipping string literals, quoted identifiers and comments, so a
``;`` or ``$1`` inside them is left alone (:mod:`~sparkiq.server.pg.parameters` binds the
values with the same scan).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import sqlglot
from sqlglot import exp

__all__ = [
    "LIMIT",
    "code_only",
    "code_segments",
    "is_blank",
    "parameter_count",
    "parameter_uses",
    "split_statements",
]

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
