"""A client's catalog query as a query on the emulated catalog
(:mod:`~sparkiq.server.pg.pgcatalog`), and the walls around it.

**Rewrites** (on the statement's code, never inside its string literals or comments):

- Postgres array literals (``'{r,v}'::text[]``, ``ANY('{r,v}')``) are DuckDB lists
  (:mod:`~sparkiq.server.pg.arrays`).

- ``pg_catalog.`` and ``information_schema.`` name the emulated schemas; a
  ``pg_catalog.``-qualified function (or ``information_schema._pg_*``) loses its
  qualifier (the macros are in ``public``).
- The session's values replace what DuckDB would answer about itself: ``version()``,
  ``current_database()``, ``current_schema()``, ``current_schemas(...)``,
  ``current_user``/``session_user``/``user``, ``current_setting('name')`` (the session's
  ``SET`` value or the server's parameter; NULL for others).
- ``'pg_class'::regclass`` is that relation's OID; ``column::regtype`` is
  ``format_type(column, NULL)`` (the type's name, as Postgres shows a regtype); other
  casts to Postgres' reg* types, ``name`` and ``oid`` become casts to DuckDB's
  ``VARCHAR``/``BIGINT``;
  ``OPERATOR(pg_catalog.~)`` is ``~``; ``COLLATE pg_catalog.default`` is dropped;
  ``CAST(x AS regclass)`` and ``CAST(x AS oid)`` are cast as ``::regclass`` and ``::oid`` are;
  ``json_build_object`` is DuckDB's ``json_object``; ``pg_type``'s function columns
  (``typreceive``...) compared with ``0`` are compared with ``'-'``, how Postgres shows
  "no function".
- Grafana's expansion of ``search_path`` (a scalar function in ``FROM``, which DuckDB
  has no such thing as) is spelled as a DuckDB subquery.

**Walls**: the statement must be one ``SELECT`` (DuckDB's own parser says so), and no
identifier in its code may name DuckDB's own catalog or settings: its databases
(``system``, ``temp``, ``memory``), its ``pg_catalog``/``information_schema`` (a quoted
spelling the rewrites leave alone), its ``duckdb_*``/``pragma_*``/``sqlite_*`` views, its
table functions other than ``generate_series``/``range``/``unnest`` (and the catalog's
``pg_get_keywords``), and
``current_setting``/``getvariable``/``getenv``/``which_secret``. Such a statement is
refused with :class:`~sparkiq.sql.errors.SqlUnsupportedError` (SQLSTATE 42501). The
catalog database also runs with ``enable_external_access=false`` and a locked
configuration, so no file, network or setting is reachable whatever passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import duckdb

from sparkiq.error_codes import ErrorCode
from sparkiq.server.pg.arrays import list_literals
from sparkiq.server.pg.catalog_schema import (
    CATALOG_RELATIONS,
    DATABASE,
    INFORMATION_SCHEMA,
    PG_CATALOG,
)
from sparkiq.server.pg.pgextras import TABLE_MACROS
from sparkiq.server.pg.statements import code_segments
from sparkiq.sql.errors import SqlUnsupportedError

__all__ = ["Session", "Walls", "translate"]


@dataclass(frozen=True, slots=True)
class Session:
    """What the rewrites need to know about the connection asking."""

    user: str
    version: str  # what version() answers
    settings: Mapping[str, str]  # SET values and server parameters, by lowercase name


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_Sub = Callable[[re.Match[str], Session], str]

# Applied to the whole text first: they read a string literal next to code.
_LITERAL_REWRITES: tuple[tuple[re.Pattern[str], _Sub], ...] = (
    (
        re.compile(r"'([A-Za-z0-9_.]{1,128})'\s*::\s*(?:pg_catalog\s*\.\s*)?regclass\b", re.I),
        lambda m, s: str(CATALOG_RELATIONS.get(m.group(1).lower().rpartition(".")[2], 0)),
    ),
    (
        re.compile(
            r"\bcurrent_setting\s*\(\s*'([A-Za-z0-9_.]{1,128})'\s*(?:,\s*(?:true|false)\s*)?\)",
            re.I,
        ),
        lambda m, s: (
            "NULL::VARCHAR"
            if (value := s.settings.get(m.group(1).lower())) is None
            else _quote(value)
        ),
    ),
    (
        # Grafana's search_path expansion (after current_setting became a literal).
        re.compile(
            r"generate_series\s*\(\s*array_lower\s*\(\s*string_to_array\s*\(\s*('[^']*')\s*,"
            r"\s*('[^']*')\s*\)\s*,\s*1\s*\)\s*,\s*array_upper\s*\(\s*string_to_array\s*\("
            r"\s*'[^']*'\s*,\s*'[^']*'\s*\)\s*,\s*1\s*\)\s*\)\s*as\s+i\s*,\s*"
            r"string_to_array\s*\(\s*'[^']*'\s*,\s*'[^']*'\s*\)\s+s\b",
            re.I,
        ),
        lambda m, s: (
            f"(SELECT g.i AS i, string_to_array({m.group(1)}, {m.group(2)}) AS s "
            f"FROM generate_series(1, len(string_to_array({m.group(1)}, {m.group(2)}))) "
            "AS g(i)) AS search_path_parts"
        ),
    ),
)

# Applied to code only.
_CODE_REWRITES: tuple[tuple[re.Pattern[str], _Sub], ...] = (
    (re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!=<>]+)\s*\)", re.I), lambda m, s: m[1]),
    (re.compile(r"\bCOLLATE\s+pg_catalog\s*\.\s*default\b", re.I), lambda m, s: ""),
    (  # a type OID column cast to regtype reads as the type's name (pgcli's columns)
        re.compile(
            r"(?<![\w.'\"])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)\s*::\s*(?:pg_catalog\s*\.\s*)?"
            r"regtype\b(?!\s*\[)",
            re.I,
        ),
        lambda m, s: f"format_type({m[1]}, NULL)",
    ),
    (
        re.compile(
            r"::\s*(?:pg_catalog\s*\.\s*)?"
            r"(regclass|regtype|regnamespace|regproc|regprocedure|regrole|regoper|name|text)\b",
            re.I,
        ),
        lambda m, s: "::VARCHAR",
    ),
    (re.compile(r"::\s*(?:pg_catalog\s*\.\s*)?oid\b", re.I), lambda m, s: "::BIGINT"),
    (  # the same casts spelled CAST(x AS regclass) (SQLAlchemy's), never an alias "AS name"
        re.compile(
            r"\bAS\s+(?:pg_catalog\s*\.\s*)?"
            r"(?:regclass|regtype|regnamespace|regproc|regprocedure|regrole|regoper)\s*\)",
            re.I,
        ),
        lambda m, s: "AS VARCHAR)",
    ),
    (re.compile(r"\bAS\s+(?:pg_catalog\s*\.\s*)?oid\s*\)", re.I), lambda m, s: "AS BIGINT)"),
    (re.compile(r"\bjson_build_object\s*\(", re.I), lambda m, s: "json_object("),
    (  # a regproc column compared with 0 (ADBC's type query): Postgres shows "no function" '-'
        re.compile(
            r"\b(typreceive|typsend|typinput|typoutput|typmodin|typmodout|typanalyze)"
            r"\s*(!=|<>|=)\s*0\b",
            re.I,
        ),
        lambda m, s: f"{m[1]} {m[2]} '-'",
    ),
    (re.compile(r"\bpg_catalog\s*\.\s*(\w+)\s*\(", re.I), lambda m, s: f"{m[1]}("),
    (re.compile(r"\bpg_catalog\s*\.", re.I), lambda m, s: f"{PG_CATALOG}."),
    (  # information_schema's functions (_pg_expandarray) are macros in public too
        re.compile(r"\binformation_schema\s*\.\s*(_pg_\w+)\s*\(", re.I),
        lambda m, s: f"{m[1]}(",
    ),
    (re.compile(r"\binformation_schema\s*\.", re.I), lambda m, s: f"{INFORMATION_SCHEMA}."),
    (re.compile(r"\bversion\s*\(\s*\)", re.I), lambda m, s: _quote(s.version)),
    (re.compile(r"\bcurrent_database\s*\(\s*\)", re.I), lambda m, s: _quote(DATABASE)),
    (
        re.compile(r"\bcurrent_schemas\s*\(\s*(?:true|false)\s*\)", re.I),
        lambda m, s: "['pg_catalog', 'public']",
    ),
    (re.compile(r"\bcurrent_schema\b\s*(?:\(\s*\))?", re.I), lambda m, s: "'public'"),
    (re.compile(r"\bcurrent_catalog\b", re.I), lambda m, s: _quote(DATABASE)),
    (
        # A bare user keyword (not a column reference t.user, not a function user()).
        re.compile(r"(?<![.\w])(?:current_user|session_user|user)\b(?!\s*[.(])", re.I),
        lambda m, s: _quote(s.user),
    ),
)

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_FUNCTION_NAME = re.compile(r"[a-z_]+", re.I)
_ALLOWED_TABLE_FUNCTIONS = frozenset({"generate_series", "range", "unnest"}) | TABLE_MACROS
_DENIED_PREFIXES = ("duckdb_", "pragma_", "sqlite_")
_DENIED_WORDS = frozenset(
    {
        "system",
        "temp",
        "memory",
        "pg_catalog",
        "information_schema",
        "current_setting",
        "getvariable",
        "getenv",
        "which_secret",
    }
)


class Walls:
    """The identifiers a catalog query may not use, read once from the catalog database
    (its table functions change with DuckDB's version)."""

    def __init__(self, db: duckdb.DuckDBPyConnection) -> None:
        rows = db.execute(
            "SELECT DISTINCT function_name FROM duckdb_functions() "
            "WHERE function_type IN ('table', 'table_macro')"
        ).fetchall()
        self.denied = _DENIED_WORDS | {
            str(name).lower() for (name,) in rows if name not in _ALLOWED_TABLE_FUNCTIONS
        }

    def check(self, text: str, db: duckdb.DuckDBPyConnection) -> None:
        """Raise unless ``text`` (translated) is one SELECT on the emulated catalog only."""
        for word in _identifiers(text):
            lowered = word.lower()
            if lowered in self.denied or lowered.startswith(_DENIED_PREFIXES):
                raise SqlUnsupportedError(
                    f"catalog queries read only the emulated pg_catalog and "
                    f"information_schema; {word!r} is not part of them",
                    code=ErrorCode.FORBIDDEN_TABLE,
                    field=word,
                )
        try:
            statements = db.extract_statements(text)
        except duckdb.Error:
            return  # not parseable: running it gives the syntax error
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise SqlUnsupportedError(
                "only SELECT statements are answered on the catalog",
                code=ErrorCode.FORBIDDEN_STATEMENT,
            )


def _identifiers(text: str) -> Iterable[str]:
    """Every bare or double-quoted identifier in the code of ``text``."""
    for kind, start, end in code_segments(text):
        if kind == "code":
            yield from _WORD.findall(text, start, end)
        elif kind == "quoted":
            yield text[start + 1 : end - 1].replace('""', '"')


def translate(text: str, session: Session) -> tuple[str, dict[str, str]]:
    """``text`` with the rewrites of the module docstring applied, and the names Postgres
    gives the columns a rewrite turned into an unnamed literal (DuckDB names such a column
    by the literal: ``'sparkiq'`` is ``current_database``)."""
    text = list_literals(text)
    for pattern, sub in _LITERAL_REWRITES:
        text = pattern.sub(lambda m, sub=sub: sub(m, session), text)  # type: ignore[misc]
    out = []
    renames: dict[str, str] = {}

    def rewrite(match: re.Match[str], sub: _Sub) -> str:
        replacement = sub(match, session)
        name = _FUNCTION_NAME.match(match.group(0))
        if replacement.startswith("'") and name is not None:
            renames[replacement] = name.group(0).lower()
        return replacement

    for kind, start, end in code_segments(text):
        piece = text[start:end]
        if kind == "code":
            for pattern, sub in _CODE_REWRITES:
                piece = pattern.sub(lambda m, sub=sub: rewrite(m, sub), piece)  # type: ignore[misc]
        out.append(piece)
    return "".join(out), renames
