"""Parsing: statement text to a checked sqlglot tree, and statement *shapes* for plan caching.

Only one ``SELECT`` (or ``EXPLAIN SELECT``) is accepted. Everything else is refused here,
before any data is read or DuckDB runs: DDL and DML, ``COPY``, ``ATTACH``, ``PRAGMA``,
``SET``, ``INSTALL``/``LOAD``, ``SELECT ... INTO``, several statements, table functions in
``FROM`` (``read_csv``, ``glob``, ``query``...), functions that reach files, settings or the
environment anywhere, parameters (``?``, ``$1``) and qualified names (``db.table``).

A statement's *shape* is its text with every string and number literal replaced by a
placeholder ``:sqN`` (see :func:`shape_of`); statements of one shape share a plan.

``FROM t AS OF 12`` and ``FROM t AS OF TIMESTAMP '...'`` read a table at a past batch; they
are spelled ``FOR SYSTEM_TIME AS OF`` (SQL:2011, which sqlglot reads) before parsing, and the
analyzer reads the batch or time from the table's ``version``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from sparkiq.error_codes import ErrorCode
from sparkiq.sql.errors import (
    SqlLimitError,
    SqlSyntaxError,
    SqlUnsupportedError,
    push_query_error,
    snippet_at,
)
from sparkiq.sql.names import name_outputs
from sparkiq.sql.statement import first_word, is_push_query

__all__ = ["MAX_NESTING", "Parsed", "check_nesting", "check_tree", "parse", "shape_of"]

DIALECT = "duckdb"

#: Deepest nesting of parentheses and ``CASE ... END`` a statement may have. sqlglot's
#: parser recurses about 25 Python frames per level and fails near 40 levels; the limit is
#: checked on the text, in linear time, before sqlglot reads it.
MAX_NESTING = 32
# What counts: ( ) CASE END outside string literals, quoted identifiers and comments (an
# open one runs to the end). Each alternative is linear: no nested quantifiers.
_NESTING = re.compile(
    r"""'[^']*'? | "[^"]*"? | --[^\n]* | /\*.*?(?:\*/|\Z)
      | (?P<open>\(|\bcase\b) | (?P<close>\)|\bend\b)""",
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)
_SLOW_CHARS = re.compile(r"''|\"|--|/\*|[?$:]")
_DIGIT = re.compile(r"(?<![\w$])\d")
_MAX_NUMBER_CHARS = 80  # beyond DECIMAL(38) with an exponent; far below int()'s limit
_MISSING = re.compile(r"^Required keyword: '\w+' missing for ")
_TOKENS = re.compile(
    r"""(?P<str>'(?:[^']|'')*')
      | (?P<qid>"(?:[^"]|"")*")
      | (?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))  # an open comment runs to the end
      | (?P<num>(?<![\w$])\d+(?:\.\d*)?(?:[eE][+-]?\d+)?(?![\w$]))
      | (?P<param>[?$:])
    """,
    re.VERBOSE | re.DOTALL,
)

# ``AS OF <number | TIMESTAMP | placeholder>`` outside strings, quoted names and comments,
# and the SQL:2011 spelling (kept as is). Linear: no nested quantifiers.
_AS_OF = re.compile(
    r"""'(?:[^']|'')*'? | "(?:[^"]|"")*"? | --[^\n]* | /\*.*?(?:\*/|\Z)
      | \bFOR\s+SYSTEM_TIME\s+AS\s+OF\b
      | (?P<short>\bAS\s+OF)(?=\s+(?:\d|TIMESTAMP\b|:sq\d))
    """,
    re.IGNORECASE | re.DOTALL | re.VERBOSE,
)
_OF = re.compile(r"\bof\b", re.IGNORECASE)
# Words outside literals, quoted names and comments (for locating a misspelled keyword)
_WORD = re.compile(r"(?<![\w'\"$.])[A-Za-z_]\w*(?![\w'\"(.])")
#: Clause keywords a misspelling is matched against
_KEYWORDS = (
    "SELECT", "FROM", "WHERE", "GROUP", "ORDER", "HAVING", "LIMIT", "OFFSET", "JOIN", "LEFT",
    "RIGHT", "INNER", "OUTER", "CROSS", "UNION", "INTERSECT", "EXCEPT", "DISTINCT", "BETWEEN",
    "WITH", "EXPLAIN", "VALUES", "WINDOW", "QUALIFY", "LATERAL", "NATURAL", "USING", "FULL",
    "BY", "ON", "AS", "AND", "OR", "NOT", "IN", "IS", "NULL", "LIKE", "ILIKE", "CASE", "WHEN",
    "THEN", "ELSE", "END", "ASC", "DESC", "ALL", "ANY", "EXISTS", "OVER", "PARTITION", "EMIT",
    "CHANGES", "TRUE", "FALSE", "CAST", "INTERVAL", "FILTER",
)  # fmt: skip
# What a statement may start with (refused ones included: they get their own message)
_STATEMENT_STARTS = frozenset((
    "SELECT", "WITH", "EXPLAIN", "VALUES", "FROM", "TABLE", "INSERT", "UPDATE", "DELETE",
    "CREATE", "DROP", "ALTER", "COPY", "ATTACH", "DETACH", "PRAGMA", "SET", "RESET", "USE",
    "DESCRIBE", "DESC", "SHOW", "SUMMARIZE", "INSTALL", "LOAD", "CALL", "EXPORT", "IMPORT",
    "BEGIN", "COMMIT", "ROLLBACK", "VACUUM", "CHECKPOINT", "TRUNCATE", "MERGE", "GRANT",
    "REVOKE", "PIVOT", "UNPIVOT", "ANALYZE", "PREPARE", "EXECUTE", "DEALLOCATE", "START",
    "END", "ABORT",
))  # fmt: skip


def check_numbers(text: str) -> None:
    """Refuse a numeric literal longer than :data:`_MAX_NUMBER_CHARS`, before anything
    converts it: whether Python or DuckDB would meet it first (and how each fails) depends on
    the plan, so the answer would too."""
    for match in _TOKENS.finditer(text):
        if match.lastgroup == "num" and len(match.group()) > _MAX_NUMBER_CHARS:
            raise SqlSyntaxError(
                f"a number of {len(match.group())} characters at offset {match.start()}: "
                f"numeric literals are limited to {_MAX_NUMBER_CHARS} characters (DECIMAL "
                "holds 38 digits); write a larger double with an exponent, e.g. 1e300"
            )


def spell_as_of(text: str) -> str:
    """``text`` with each ``AS OF`` of a table written ``FOR SYSTEM_TIME AS OF``."""
    if _OF.search(text) is None:
        return text
    return _AS_OF.sub(lambda m: "FOR SYSTEM_TIME AS OF" if m.group("short") else m.group(0), text)


# Functions that read files, the network, settings, the catalog or run nested SQL. DuckDB's
# own lock refuses file and network access too; naming them here gives a clear error.
_DENIED = re.compile(
    r"^(read_\w*|glob|getenv|query|query_table|sniff_csv|parquet_\w*|\w*_scan|duckdb_\w*|"
    r"pragma_\w*|current_setting|which_secret|load_extension|iceberg_\w*|delta_\w*|"
    r"sqlite_\w*|postgres_\w*|mysql_\w*|json_execute_serialized_sql|"
    r"(json_)?deserialize_sql|\w*_metadata|\w*_schema|\w*_settings|\w*_extensions|"
    r"test_all_types|enable_\w*|disable_\w*|checkpoint|force_checkpoint|\w*_functions|"
    r"\w*_tables|\w*_columns|\w*_views|\w*_databases|\w*_secrets)$",
    re.IGNORECASE,
)

_STATEMENT_NODES: tuple[type[exp.Expr], ...] = tuple(
    getattr(exp, name)
    for name in (
        "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Copy", "Command",
        "Pragma", "Set", "Use", "Describe", "Attach", "Detach", "Install", "Load",
        "Into", "TruncateTable", "Grant", "Revoke", "Transaction", "Commit", "Rollback",
        "Export", "Summarize", "Show",
    )
    if hasattr(exp, name)
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Parsed:
    """A checked statement: its tree (a query) and whether it was ``EXPLAIN``-ed."""

    tree: exp.Query
    explain: bool
    text: str


def parse(text: str, *, placeholders: bool = False) -> Parsed:
    """Parse and check one statement; raise :class:`SqlSyntaxError` or
    :class:`SqlUnsupportedError` with the position of the problem.

    ``placeholders=True`` parses a shape (``:sqN`` placeholders allowed)."""
    explain = False
    body = text
    if is_push_query(text):
        raise push_query_error()
    first = first_word(text)
    if first is not None and first[0] == "EXPLAIN":
        explain = True
        body = " " * first[1] + text[first[1] :]  # keep line/column positions
        following = first_word(body)
        if following is not None and following[0] in ("ANALYZE", "ANALYSE"):
            raise SqlUnsupportedError(
                "EXPLAIN ANALYZE is not supported; use EXPLAIN SELECT ... to see the plan",
                code=ErrorCode.UNSUPPORTED_STATEMENT,
            )
    check_nesting(body)
    check_numbers(body)
    body = spell_as_of(body)
    try:
        statements = [s for s in sqlglot.parse(body, read=DIALECT) if s is not None]
    except ParseError as exc:
        raise _syntax_error(text, exc) from None
    except TokenError as exc:
        raise SqlSyntaxError(f"the statement cannot be tokenized: {exc}") from None
    except RecursionError:  # deep without parentheses (NOT NOT NOT ...): same answer
        raise too_deep() from None
    if not statements:
        raise SqlSyntaxError(
            "the statement is empty; write a SELECT over a table, e.g. SELECT * FROM orders"
        )
    if len(statements) > 1:
        raise SqlUnsupportedError(
            f"found {len(statements)} statements; send one SELECT per call",
            code=ErrorCode.MULTIPLE_STATEMENTS,
        )
    tree = statements[0]
    try:
        check_tree(tree, text, placeholders=placeholders)
    except RecursionError:
        raise too_deep() from None
    assert isinstance(tree, exp.Query)
    name_outputs(tree)  # Postgres' names for unnamed items (sparkiq.sql.names)
    return Parsed(tree, explain, text)


def check_nesting(text: str) -> None:
    """Refuse a statement nested deeper than :data:`MAX_NESTING` (see there)."""
    if "(" not in text and "case" not in text.lower():
        return
    depth = 0
    for match in _NESTING.finditer(text):
        if match.lastgroup == "open":
            depth += 1
            if depth > MAX_NESTING:
                line = text.count("\n", 0, match.start()) + 1
                column = match.start() - (text.rfind("\n", 0, match.start()) + 1) + 1
                raise too_deep(line, column, snippet_at(text, line, column))
        elif match.lastgroup == "close":
            depth = max(depth - 1, 0)


def too_deep(
    line: int | None = None, column: int | None = None, snippet: str | None = None
) -> SqlLimitError:
    """The error for a statement nested too deeply (by the count, or for the parser)."""
    return SqlLimitError(
        f"the statement nests parentheses, subqueries or CASE deeper than {MAX_NESTING} "
        "levels; flatten it (e.g. a CTE per level, or IN (...) instead of nested ORs)",
        code=ErrorCode.NESTING_TOO_DEEP,
        line=line,
        column=column,
        snippet=snippet,
    )


def _syntax_error(text: str, exc: ParseError) -> SqlSyntaxError:
    detail = exc.errors[0] if exc.errors else {}
    line, column = detail.get("line"), detail.get("col")
    description = str(detail.get("description") or exc)
    highlight = detail.get("highlight")
    if _MISSING.match(description):
        description = "an operand or clause is missing here"
    elif description.startswith("Invalid expression / Unexpected token"):
        description = "unexpected here"
    if isinstance(column, int) and isinstance(highlight, str) and highlight:
        column = max(1, column - len(highlight) + 1)  # sqlglot points at the token's end
    misspelled = _misspelled(text, line, column)
    if misspelled is not None:  # the caret goes to the offending word, not what follows it
        return misspelled
    near = f" near {highlight!r}" if highlight else ""
    return SqlSyntaxError(
        f"syntax error{near}: {description}",
        line=line,
        column=column,
        snippet=snippet_at(text, line, column),
        field=highlight,
    )


def _misspelled(text: str, line: Any, column: Any) -> SqlSyntaxError | None:
    """The error for a misspelled keyword where parsing failed: the statement's first word
    when no statement starts so (``SELCT * FROM t``: the parser stops at ``FROM``), else
    the word at or just before where it stopped (``SELECT * FORM t`` stops at ``t``)."""
    words = [(m.group(), m.start()) for m in _WORD.finditer(text)]
    if not words:
        return None
    suspects = [words[0]] if words[0][0].upper() not in _STATEMENT_STARTS else []
    if isinstance(line, int) and isinstance(column, int):
        lines = text.split("\n")
        offset = sum(len(x) + 1 for x in lines[: line - 1]) + column - 1
        before = [w for w in words if w[1] <= offset]
        suspects += [w for w in before[-2:][::-1] if w[0].upper() not in _KEYWORDS]
    for word, start in suspects:
        near = difflib.get_close_matches(word.upper(), _KEYWORDS, n=1, cutoff=0.74)
        first = (word, start) == words[0]
        if near or first:
            at_line = text.count("\n", 0, start) + 1
            at_column = start - (text.rfind("\n", 0, start) + 1) + 1
            hint = f"did you mean {near[0]}?" if near else "a statement starts with SELECT"
            return SqlSyntaxError(
                f"syntax error at {word!r}: {hint}",
                line=at_line,
                column=at_column,
                snippet=snippet_at(text, at_line, at_column),
                field=word,
            )
    return None


def _where(text: str, node: exp.Expr) -> dict[str, Any]:
    meta = node.meta if isinstance(node, exp.Identifier) else {}
    if not meta:
        ident = node.find(exp.Identifier)
        meta = ident.meta if ident is not None else {}
    line, column = meta.get("line"), meta.get("col")
    if isinstance(column, int) and isinstance(node, exp.Identifier):
        column = column - len(node.name) + 1
    return {"line": line, "column": column, "snippet": snippet_at(text, line, column)}


def check_tree(tree: exp.Expr, text: str, *, placeholders: bool = False) -> None:
    """Refuse anything but a read-only query over plain table names (see module doc)."""
    if not isinstance(tree, (*_STATEMENT_NODES, exp.Query)):  # an expression: "foo bar"
        raise _misspelled(text, None, None) or SqlSyntaxError(
            "not a statement: write a SELECT over a table, e.g. SELECT * FROM orders"
        )
    if not isinstance(tree, exp.Query):
        kind = tree.key.upper() if not isinstance(tree, exp.Command) else str(tree.this).upper()
        raise SqlUnsupportedError(
            f"{kind} statements are not allowed: queries here only read. Write a SELECT over "
            "a table (e.g. SELECT * FROM orders WHERE id = 7), or EXPLAIN SELECT to see its "
            "plan; tables change only through the streaming query that writes them",
            code=ErrorCode.FORBIDDEN_STATEMENT,
            field=kind,
        )
    for node in tree.walk():
        if isinstance(node, _STATEMENT_NODES):
            raise SqlUnsupportedError(
                f"{node.key.upper()} is not allowed inside a query; pull queries only read",
                code=ErrorCode.FORBIDDEN_STATEMENT,
                field=node.key.upper(),
                **_where(text, node),
            )
        if isinstance(node, exp.Table):
            _check_table(node, text)
        elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            # system.main.repeat(...) would reach the function the value guards shadow
            # (sparkiq.sql.duck); x.f() is the same call written as a method
            raise SqlUnsupportedError(
                f"call {node.expression.sql(dialect=DIALECT)} by its bare name, not "
                "qualified by a schema or as a method (x.f())",
                code=ErrorCode.QUALIFIED_FUNCTION,
                **_where(text, node),
            )
        elif isinstance(node, exp.Func):
            name = node.name if isinstance(node, exp.Anonymous) else node.sql_name()
            if _DENIED.match(name or ""):
                raise SqlUnsupportedError(
                    f"function {name.lower()}() is not allowed: pull queries read only "
                    "materialized tables, never files, settings or the catalog",
                    code=ErrorCode.FORBIDDEN_FUNCTION,
                    field=name.lower(),
                    **_where(text, node),
                )
        elif isinstance(node, exp.Placeholder | exp.Parameter):
            if placeholders and isinstance(node, exp.Placeholder) and _is_slot(node):
                continue
            raise SqlUnsupportedError(
                "query parameters (?, $1, :name) are not supported; write the values as literals",
                code=ErrorCode.PARAMETERS,
            )


def _is_slot(node: exp.Placeholder) -> bool:
    name = node.name or ""
    return name.startswith("sq") and name[2:].isdigit()


def _check_table(node: exp.Table, text: str) -> None:
    if not isinstance(node.this, exp.Identifier):
        inner = node.this
        name = inner.name if isinstance(inner, exp.Anonymous) else getattr(inner, "key", "")
        if isinstance(inner, exp.Func) and not isinstance(inner, exp.Anonymous):
            name = inner.sql_name()
        raise SqlUnsupportedError(
            f"table function {str(name).lower()}() is not allowed in FROM; query a "
            "materialized table by its name",
            code=ErrorCode.FORBIDDEN_FUNCTION,
            field=str(name).lower(),
            **_where(text, node),
        )
    if node.args.get("db") or node.args.get("catalog"):
        raise SqlUnsupportedError(
            f"qualified table name {node.sql(dialect=DIALECT)} is not supported; use the bare "
            "table name",
            code=ErrorCode.QUALIFIED_TABLE,
            field=node.name,
            **_where(text, node),
        )


def shape_of(text: str) -> tuple[str, tuple[Any, ...]] | None:
    """``(shape text, literal values)``, or None when the text has parameters of its own or
    a number longer than any SQL type holds (Python refuses to convert such digit strings).

    Strings become ``str``; numbers ``int``, or ``Decimal`` when they have a point or an
    exponent. Quoted identifiers and comments are kept as they are.
    """
    if not _SLOW_CHARS.search(text):  # the common lookup: string literals only
        pieces = text.split("'")
        if len(pieces) % 2 and not any(_DIGIT.search(p) for p in pieces[::2]):
            shaped = [pieces[0]]
            for i, rest in enumerate(pieces[2::2]):
                shaped.append(f":sq{i}")
                shaped.append(rest)
            return "".join(shaped), tuple(pieces[1::2])
    parts: list[str] = []
    values: list[Any] = []
    last = 0
    for match in _TOKENS.finditer(text):
        kind = match.lastgroup
        if kind == "param":
            return None
        if kind not in ("str", "num"):
            continue
        token = match.group()
        if kind == "num" and len(token) > _MAX_NUMBER_CHARS:
            return None
        parts.append(text[last : match.start()])
        parts.append(f":sq{len(values)}")
        if kind == "str":
            values.append(token[1:-1].replace("''", "'"))
        elif token.isdigit():
            values.append(int(token))
        else:
            values.append(Decimal(token))
        last = match.end()
    parts.append(text[last:])
    return "".join(parts), tuple(values)
