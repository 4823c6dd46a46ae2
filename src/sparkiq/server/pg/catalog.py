"""What a statement on the Postgres endpoint is answered with.

- **Session statements** clients send on connect or around queries (``SET``, ``RESET``,
  ``SHOW``, ``BEGIN``/``COMMIT``/``ROLLBACK``, ``DISCARD``, ``DEALLOCATE``) are answered
  here: ``SET`` only records the value (``SHOW`` returns it), nothing changes how sparkiq
  answers.
- **Catalog queries** (any statement naming ``pg_catalog``, ``information_schema``, a
  ``pg_*`` relation or function, or ``version()``/``current_schema()``-style functions) run
  in a small in-memory DuckDB that holds only a generated catalog: one *empty* table per
  served table, with the columns and the Postgres types of :data:`~sparkiq.schema.kinds.KINDS`.
  DuckDB's own ``pg_catalog`` and ``information_schema`` then describe them, which is what
  psql's ``\\dt`` and ``\\d`` and the introspection of GUI tools read. The node's data is
  never in that database, and the SQL engine's sandbox, which refuses catalog access, is
  not involved. A few spellings psql uses that DuckDB lacks are rewritten first.
- **Everything else** is a pull query: :meth:`ServedNode.sql`, with the same planner,
  limits and sandbox as ``POST /query``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import duckdb
import sqlglot

from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import TableSchema
from sparkiq.server.pg.types import PgColumn, describe_columns, text_column
from sparkiq.server.served import ServedNode
from sparkiq.sql.errors import SqlError, SqlSyntaxError, SqlUnsupportedError

__all__ = ["Answer", "Catalog", "server_parameters"]

log = logging.getLogger("sparkiq.server.pg")

#: The Postgres version the endpoint reports. Clients pick their catalog queries by it;
#: psql's queries for 14 are the ones the rewrites below are tested with.
PG_VERSION = "14.0"

_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
# Catalog relations are named qualified or by their pg_ names; catalog functions by a call.
_CATALOG = re.compile(
    r"\b(?:pg_catalog|information_schema)\s*\.|"
    r"\bpg_(?:class|namespace|attribute|type|database|settings|roles|user|proc|index|"
    r"constraint|description|am|tables|views|matviews|extension|inherits|attrdef|collation|"
    r"tablespace|trigger|enum|range)\b|"
    r"\b(?:pg_[a-z_]+|version|current_schemas?|current_database|current_setting|"
    r"has_[a-z_]+_privilege|obj_description|col_description|format_type|quote_ident)\s*\(|"
    r"\b(?:current_user|session_user|current_catalog)\b",
    re.IGNORECASE,
)
# psql's spellings DuckDB does not parse, and what they mean there.
_REWRITES = (
    (re.compile(r"\bpg_catalog\.(\w+)\s*\(", re.IGNORECASE), r"\1("),
    (re.compile(r"\bversion\s*\(\s*\)", re.IGNORECASE), "sparkiq_version()"),
    (re.compile(r"\bformat_type\s*\(", re.IGNORECASE), "sparkiq_format_type("),
    (re.compile(r"\bpg_catalog\.(pg_class)\b", re.IGNORECASE), r"\1"),
    (re.compile(r"OPERATOR\(pg_catalog\.([~!=<>]+)\)", re.IGNORECASE), r"\1"),
    (re.compile(r"COLLATE\s+pg_catalog\.default", re.IGNORECASE), ""),
    (re.compile(r"::\s*pg_catalog\.regclass", re.IGNORECASE), "::VARCHAR"),
    (re.compile(r"::\s*pg_catalog\.text", re.IGNORECASE), "::VARCHAR"),
    (re.compile(r"::\s*pg_catalog\.regtype", re.IGNORECASE), "::VARCHAR"),
)
_MACROS = (
    "CREATE MACRO pg_get_userbyid(id) AS 'sparkiq'",
    "CREATE MACRO pg_encoding_to_char(id) AS 'UTF8'",
    "CREATE MACRO array_to_string(a, sep) AS NULL::VARCHAR",
    "CREATE MACRO pg_relation_size(id) AS 0",
    "CREATE MACRO pg_table_size(id) AS 0",
    "CREATE MACRO pg_total_relation_size(id) AS 0",
    "CREATE MACRO pg_get_expr(expr, rel, pretty) AS NULL::VARCHAR",
    # DuckDB spells Postgres' text "varchar"; the endpoint describes string columns as text.
    "CREATE MACRO sparkiq_format_type(t, m) AS "
    "CASE WHEN pg_catalog.format_type(t, m) = 'varchar' THEN 'text' "
    "ELSE pg_catalog.format_type(t, m) END",
    # Columns psql's \\d reads that DuckDB's pg_class lacks (unqualified names resolve here).
    "CREATE VIEW pg_class AS SELECT *, false AS relforcerowsecurity FROM pg_catalog.pg_class",
)


_RENAMES = {"sparkiq_version()": "version"}


@dataclass(frozen=True, slots=True)
class Answer:
    """What a statement returns: ``columns`` (None: a command without rows), the rows (one
    dict per row, by column name) and the command tag (``SELECT 3``, ``SET``...)."""

    columns: list[PgColumn] | None
    rows: list[dict[str, Any]]
    tag: str


def server_parameters(version_text: str) -> dict[str, str]:
    """The ``ParameterStatus`` values sent after authentication (and ``SHOW``'s defaults)."""
    return {
        "server_version": f"{PG_VERSION} (sparkiq {version_text})",
        "server_encoding": "UTF8",
        "client_encoding": "UTF8",
        "DateStyle": "ISO, MDY",
        "IntervalStyle": "postgres",
        "TimeZone": "UTC",
        "integer_datetimes": "on",
        "standard_conforming_strings": "on",
        "is_superuser": "off",
        "application_name": "",
        "default_transaction_read_only": "on",
        "in_hot_standby": "off",
    }


class Catalog:
    """Answers statements for every connection of one endpoint (thread-safe)."""

    def __init__(
        self, node: ServedNode, parameters: Mapping[str, str], max_statements: int = 32
    ) -> None:
        self.node = node
        self.parameters = dict(parameters)
        # Each connection thread gets its own DuckDB from the engine: bounding how many run
        # at once bounds their memory as the REST API's 32 SQL threads bound its own.
        self._running = threading.BoundedSemaphore(max_statements)
        self._lock = threading.Lock()
        self._db: duckdb.DuckDBPyConnection | None = None
        self._described: dict[str, TableSchema] = {}

    def answer(self, text: str, settings: dict[str, str]) -> Answer:
        """The answer to one statement; ``settings`` are the connection's ``SET`` values."""
        words = _WORDS.findall(text[:64])
        first = words[0].lower() if words else ""
        session = _SESSION.get(first)
        if session is not None:
            return session(self, text, words, settings)
        if _CATALOG.search(text):
            return self._catalog_query(text)
        with self._running:
            result = self.node.sql(text)
        tables = set(self.node.tables)
        named = {w for w in _WORDS.findall(text) if w in tables}
        schemas = [self.node.schema(t) for t in sorted(named)]
        columns = describe_columns(result.columns, result.rows, schemas)
        return Answer(columns, result.rows, f"SELECT {len(result.rows)}")

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- the generated catalog ---------------------------------------------------------------

    def _catalog_query(self, text: str) -> Answer:
        for pattern, replacement in _REWRITES:
            text = pattern.sub(replacement, text)
        with self._lock:
            db = self._catalog_db()
            try:
                cursor = db.execute(text)
            except duckdb.ParserException as exc:
                raise SqlSyntaxError(f"catalog query: {exc}") from None
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                # A catalog relation or column the generated catalog lacks (row security
                # policies, statistics, publications...): sparkiq has none of those objects.
                log.debug("empty answer to a catalog query DuckDB cannot bind: %s", exc)
                return Answer([text_column(n) for n in _select_names(text)], [], "SELECT 0")
            except duckdb.Error as exc:
                raise SqlUnsupportedError(
                    f"this catalog query is not supported by sparkiq's Postgres endpoint: {exc}",
                    code="catalog",
                ) from None
            if cursor.description is None:
                return Answer(None, [], "SELECT 0")
            names = _unique([_RENAMES.get(d[0], d[0]) for d in cursor.description])
            rows = [dict(zip(names, r, strict=True)) for r in cursor.fetchall()]
        columns = describe_columns(names, rows, ())
        return Answer(columns, rows, f"SELECT {len(rows)}")

    def _catalog_db(self) -> duckdb.DuckDBPyConnection:
        """The catalog database, rebuilt when the node's tables or schemas changed."""
        current = {t: self.node.schema(t) for t in self.node.tables}
        same = current.keys() == self._described.keys() and all(
            current[t] is self._described[t] for t in current
        )
        if self._db is not None and same:
            return self._db
        if self._db is not None:
            self._db.close()
        db = duckdb.connect(":memory:", config={"enable_external_access": False})
        for macro in _MACROS:
            db.execute(macro)
        version = self.parameters.get("server_version", PG_VERSION).replace("'", "''")
        db.execute(f"CREATE MACRO sparkiq_version() AS 'PostgreSQL {version}'")
        db.execute("CREATE SCHEMA public")
        db.execute("SET search_path = 'public,main'")
        for table, schema in sorted(current.items()):
            columns = ", ".join(f"{_ident(f.name)} {_duck_type(f.type)}" for f in schema.fields)
            db.execute(f"CREATE TABLE public.{_ident(table)} ({columns})")
        self._db, self._described = db, current
        return db


def _select_names(text: str) -> list[str]:
    """The output column names of a SELECT, as far as sqlglot reads them (none otherwise)."""
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.SqlglotError:
        return []
    return _unique(list(getattr(tree, "named_selects", [])))


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _duck_type(data_type: Any) -> str:
    kind = KINDS.get(data_type.name)
    pg = kind.pg if kind is not None else "text"
    if pg == "numeric":
        return f"numeric({data_type.precision},{data_type.scale})"
    return pg


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        out.append(name if count == 0 else f"{name}_{count}")
    return out


# -- session statements ----------------------------------------------------------------------

_SET = re.compile(
    r"^\s*SET\s+(?:SESSION\s+|LOCAL\s+)?([A-Za-z_.]+)\s*(?:=|\bTO\b)\s*(.*?)\s*;?\s*$",
    re.IGNORECASE | re.DOTALL,
)


def _set(catalog: Catalog, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    match = _SET.match(text)
    if match is not None:
        value = match.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        settings[match.group(1).lower()] = value
    elif not (len(words) > 1 and words[1].lower() in ("transaction", "session", "names")):
        raise SqlSyntaxError(f"cannot read this SET statement: {text.strip()[:80]!r}")
    return Answer(None, [], "SET")


def _show(catalog: Catalog, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    if len(words) < 2:
        raise SqlSyntaxError("SHOW needs a setting name")
    name = ".".join(words[1:]) if len(words) > 1 else ""
    lowered = {k.lower(): v for k, v in catalog.parameters.items()}
    lowered.update({"transaction_isolation": "read committed", "search_path": "public"})
    lowered.update(settings)
    if name.lower() == "all":
        rows = [{"name": k, "setting": v} for k, v in sorted(lowered.items())]
        return Answer([text_column("name"), text_column("setting")], rows, "SHOW")
    value = lowered.get(name.lower())
    if value is None:
        raise SqlError(f'unrecognized configuration parameter "{name}"', code="unknown_setting")
    return Answer([text_column(name.lower())], [{name.lower(): value}], "SHOW")


_Handler = Callable[["Catalog", str, list[str], dict[str, str]], Answer]


def _tag(tag: str) -> _Handler:
    def answer(catalog: Catalog, text: str, words: list[str], settings: dict[str, str]) -> Answer:
        return Answer(None, [], tag)

    return answer


def _reset(catalog: Catalog, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    if len(words) > 1 and words[1].lower() != "all":
        settings.pop(words[1].lower(), None)
    else:
        settings.clear()
    return Answer(None, [], "RESET")


_SESSION: dict[str, _Handler] = {
    "set": _set,
    "show": _show,
    "reset": _reset,
    "begin": _tag("BEGIN"),
    "start": _tag("BEGIN"),
    "commit": _tag("COMMIT"),
    "end": _tag("COMMIT"),
    "rollback": _tag("ROLLBACK"),
    "abort": _tag("ROLLBACK"),
    "discard": _tag("DISCARD ALL"),
    "deallocate": _tag("DEALLOCATE"),
    "unlisten": _tag("UNLISTEN"),
}
