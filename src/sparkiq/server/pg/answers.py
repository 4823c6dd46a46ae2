"""What a statement on the Postgres endpoint is answered with.

- **Session statements** clients send on connect or around queries (``SET``, ``RESET``,
  ``SHOW``, ``BEGIN``/``COMMIT``/``ROLLBACK``, ``DISCARD``, ``DEALLOCATE``) are answered
  here: ``SET`` only records the value (``SHOW`` returns it), nothing changes how sparkiq
  answers.
- **Catalog queries** (any statement naming ``pg_catalog``, ``information_schema``, a
  ``pg_*`` relation or function, or ``version()``/``current_schema()``-style functions) are
  translated (:mod:`~sparkiq.server.pg.translate`) and run on the emulated catalog
  (:mod:`~sparkiq.server.pg.pgcatalog`), a small in-memory DuckDB rebuilt when the node's
  tables change. It describes the served tables and nothing else: never the node's rows,
  nor DuckDB's own catalog, files or settings. A catalog relation or column sparkiq has no
  such object for gets an empty answer.
- **Everything else** is a pull query: :meth:`ServedNode.sql`, with the same planner,
  limits and sandbox as ``POST /query``.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import duckdb
import pyarrow as pa
import sqlglot

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import UnknownStoreError
from sparkiq.principals import readable
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import TableSchema
from sparkiq.server.pg.bounds import check_setting, session_bound
from sparkiq.server.pg.catalog_schema import OWNER
from sparkiq.server.pg.copy import CopyOut, parse_copy
from sparkiq.server.pg.parameters import BINARY_PARAMETER_OIDS
from sparkiq.server.pg.pgcatalog import build_catalog, catalog_cursor, column_type_name
from sparkiq.server.pg.statements import LIMIT, code_only, parameter_uses
from sparkiq.server.pg.translate import Session, Walls, translate
from sparkiq.server.pg.types import PgColumn, describe_columns, text_column
from sparkiq.server.served import ServedNode
from sparkiq.sql import SqlLimits, SqlResult
from sparkiq.sql.errors import (
    SqlError,
    SqlLimitError,
    SqlSyntaxError,
    SqlUnsupportedError,
)

__all__ = ["Answer", "Answers", "server_parameters"]

log = logging.getLogger("sparkiq.server.pg")

#: Catalog databases kept at once, one per set of visible tables (about one per principal).
_CATALOGS_KEPT = 8
#: Result schemas whose Postgres columns are kept (a few per prepared statement shape).
_DESCRIBED_KEPT = 256

#: The Postgres version the endpoint reports. Clients pick their catalog queries by it;
#: psql 15's, DBeaver's, Grafana's and asyncpg's for 14 are the ones tested.
PG_VERSION = "14.0"
PG_VERSION_NUM = "140000"

_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
# Catalog relations are named qualified or by their pg_ names; catalog functions by a call.
_CATALOG = re.compile(
    r"\b(?:pg_catalog|information_schema)\s*\.|"
    r"\bpg_(?:class|namespace|attribute|type|database|settings|roles|user|proc|index|"
    r"constraint|description|am|tables|views|matviews|extension|inherits|attrdef|collation|"
    r"tablespace|trigger|enum|range|depend|indexes|sequences?|policy|publication)\b|"
    r"\b(?:pg_[a-z_]+|version|current_schemas?|current_database|current_setting|"
    r"has_[a-z_]+_privilege|obj_description|col_description|format_type|quote_ident|"
    r"parse_ident)\s*\(|"
    r"\b(?:current_user|session_user|current_catalog|current_schema)\b",
    re.IGNORECASE,
)
# Settings current_setting() and SHOW know besides the reported parameters.
_EXTRA_SETTINGS = {
    "server_version_num": PG_VERSION_NUM,
    "search_path": "public",
    "transaction_isolation": "read committed",
    "max_identifier_length": "63",
}


@dataclass(frozen=True, slots=True)
class Answer:
    """What a statement returns: ``columns`` (None: a command without rows), the rows (one
    dict per row, by column name), the command tag (``SELECT 3``, ``SET``...) and the tables
    it read (for the audit log); ``copy`` when they go out as ``COPY`` data."""

    columns: list[PgColumn] | None
    rows: list[dict[str, Any]]
    tag: str
    tables: tuple[str, ...] = ()
    copy: CopyOut | None = None  # rows to send as COPY data (COPY ... TO STDOUT)


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


class Answers:
    """Answers statements for every connection of one endpoint (thread-safe)."""

    def __init__(
        self,
        node: ServedNode,
        parameters: Mapping[str, str],
        limits: SqlLimits,
        max_statements: int = 32,
    ) -> None:
        self.node = node
        self.parameters = dict(parameters)
        self.limits = limits  # the node's sql_limits: catalog queries are statements too
        # Each connection thread gets its own DuckDB from the engine: bounding how many run
        # at once bounds their memory as the REST API's 32 SQL threads bound its own.
        self._running = threading.BoundedSemaphore(max_statements)
        # Guards _dbs: per set of tables a user may see (its principal's grants), the
        # catalog database, its walls and the schemas it describes, rebuilt when those
        # tables change. Held to rebuild and to open a cursor, never while a query runs:
        # each query has a cursor of its own (a connection to the same in-memory database),
        # so one connection's long catalog query never holds up another's (psql's \d, a
        # driver's type lookups at connect).
        # Result schemas seen lately and their Postgres columns (see _columns).
        self._described: dict[int, tuple[pa.Schema, list[PgColumn]]] = {}
        self._lock = threading.Lock()
        self._dbs: OrderedDict[
            frozenset[str], tuple[duckdb.DuckDBPyConnection, Walls, dict[str, TableSchema]]
        ] = OrderedDict()

    def answer(self, text: str, settings: dict[str, str], user: str = "") -> Answer:
        """The answer to one statement; ``settings`` are the connection's ``SET`` values,
        ``user`` the user name it logged in with."""
        self.limits.check_statement(text)  # before any regex reads it
        words = _WORDS.findall(text[:64])
        first = words[0].lower() if words else ""
        session = _SESSION.get(first)
        if session is not None:
            return session(self, text, words, settings)
        copy = parse_copy(text) if first == "copy" else None
        if copy is not None:
            answer = self.answer(copy.query, settings, user)
            return replace(answer, tag=f"COPY {len(answer.rows)}", copy=copy)
        if _CATALOG.search(code_only(text)):  # 'pg_class' in a literal is just a string
            return self._catalog_query(text, settings, user)
        return self.pull(text, settings)

    def is_pull(self, text: str) -> bool:
        """Whether :meth:`answer` answers ``text`` with :meth:`pull`: true of a prepared
        statement's text (its ``$n`` unbound) exactly when it is of the statement once
        bound, as a parameter becomes a literal, a number or a keyword-led literal, none of
        which make a statement a session, COPY or catalog one."""
        if not text.lstrip()[:1].isalpha():  # a comment or parameter first: not sure
            return False
        words = _WORDS.findall(text[:64])
        first = words[0].lower()
        return (
            first not in _SESSION and first != "copy" and _CATALOG.search(code_only(text)) is None
        )

    def pull(self, text: str, settings: Mapping[str, str], *, tables: bool = True) -> Answer:
        """The answer to a pull query (:meth:`is_pull`), with the tables it read when
        ``tables`` (for the audit log): :meth:`pull_here`'s when at hand, else through
        :meth:`Node.sql`, at most ``max_statements`` at once."""
        answer = self.pull_here(text, settings, tables=tables)
        if answer is not None:
            return answer
        with self._running:
            result = self.node.sql(text, bound=session_bound(settings))
        return self._answer_of(result, tables)

    def pull_here(
        self, text: str, settings: Mapping[str, str], *, tables: bool = True
    ) -> Answer | None:
        """:meth:`pull`'s answer if at hand without blocking, else None: a key lookup
        from a cached plan at the newest batch (:meth:`Node.sql_here`: no DuckDB)."""
        self.limits.check_statement(text)
        if session_bound(settings) is not None:
            return None
        result = self.node.sql_here(text)
        return None if result is None else self._answer_of(result, tables)

    def _answer_of(self, result: SqlResult, tables: bool) -> Answer:
        read: tuple[str, ...] = ()
        if tables:
            visible = set(readable(self.node.tables))
            read = tuple(t for t in result.position.to_map() if t in visible)
        return Answer(self._columns(result), result.rows, f"SELECT {len(result.rows)}", read)

    def _columns(self, result: SqlResult) -> list[PgColumn]:
        """The Postgres columns of ``result``, the same list for every result of one
        schema object (a cached lookup plan's), so a session can tell it has seen them."""
        schema = result.schema
        if schema is None:
            return describe_columns(None, result.columns)
        held = self._described.get(id(schema))
        if held is not None and held[0] is schema:
            return held[1]
        columns = describe_columns(schema, result.columns)
        if len(self._described) >= _DESCRIBED_KEPT:
            self._described.clear()
        # keyed by id: the entry holds the schema, so its id names no other object meanwhile
        self._described[id(schema)] = (schema, columns)
        return columns

    def parameter_types(self, text: str, oids: Sequence[int]) -> list[int]:
        """``oids`` (a statement's parameter types, 0 = unspecified) with each unspecified
        one compared with a column of a served table typed as that column (one the
        endpoint reads in the binary format), a LIMIT/OFFSET one as int8, others text."""
        if all(oids):
            return list(oids)
        uses = parameter_uses(text)
        visible = readable(self.node.tables)
        named = [t for t in visible if re.search(rf"\b{re.escape(t)}\b", text, re.I)]
        by_column: dict[str, int | None] = {}
        for table in named:
            for f in self.node.schema(table).fields:
                kind = KINDS.get(f.type.name)
                oid = kind.pg_oid if kind is not None else 0
                name = f.name.lower()
                by_column[name] = oid if by_column.get(name, oid) == oid else None
        out = []
        for number, oid in enumerate(oids, start=1):
            _, column = uses.get(number, ("", ""))
            if not oid:
                oid = 20 if column == LIMIT else by_column.get(column.lower()) or 25
                oid = oid if oid in BINARY_PARAMETER_OIDS else 25
            out.append(oid)
        return out

    def close(self) -> None:
        with self._lock:
            for db, _, _ in self._dbs.values():
                db.close()
            self._dbs.clear()

    # -- the generated catalog ---------------------------------------------------------------

    def describe(self, table: str | None) -> Answer:
        """``SHOW TABLES`` (``table`` None: the tables the user may read) or ``DESCRIBE
        table`` / ``SHOW COLUMNS FROM table``: each column, its Postgres type, whether it
        may be null and whether it is part of the key."""
        tables = readable(self.node.tables)
        if table is None:
            rows: list[dict[str, Any]] = [{"name": t} for t in sorted(tables)]
            return Answer([text_column("name")], rows, f"SELECT {len(rows)}")
        if table not in tables:
            raise UnknownStoreError(
                f'relation "{table}" does not exist; SHOW TABLES lists the tables you may read'
            )
        schema = self.node.schema(table)
        keys = set(schema.key_columns)
        rows = [
            {
                "column_name": column.name,
                "data_type": column_type_name(column.type),
                "is_nullable": "NO" if column.name in keys else "YES",
                "key": "PRI" if column.name in keys else "",
            }
            for column in schema.fields
        ]
        names = ["column_name", "data_type", "is_nullable", "key"]
        return Answer([text_column(n) for n in names], rows, f"SELECT {len(rows)}")

    def _catalog_query(self, text: str, settings: Mapping[str, str], user: str) -> Answer:
        values = {k.lower(): v for k, v in self.parameters.items()}
        values.update(_EXTRA_SETTINGS)
        values.update(settings)
        version = self.parameters.get("server_version", PG_VERSION)
        text, renames = translate(text, Session(user or OWNER, f"PostgreSQL {version}", values))
        with self._lock:
            # db stays referenced until the query ends: a rebuild meanwhile only drops
            # this object's reference, and the database goes with its last cursor.
            db, walls = self._catalog_db()
            cursor = catalog_cursor(db)
        try:
            walls.check(text, cursor)
            # The catalog is small, but a query over it may not be (a cross join of
            # pg_attribute with itself...): it gets the SQL limits of any statement.
            timer = threading.Timer(self.limits.timeout_seconds, cursor.interrupt)
            timer.start()
            try:
                cursor.execute(text)
                if cursor.description is None:
                    return Answer(None, [], "SELECT 0")
                fetched = _fetch_arrow(cursor, self.limits.max_result_rows + 1)
            except duckdb.InterruptException:
                raise SqlLimitError(
                    "the catalog query ran out of time (SqlLimits.timeout_seconds)",
                    code=ErrorCode.TIMEOUT,
                ) from None
            except duckdb.ParserException as exc:
                raise SqlSyntaxError(f"catalog query: {exc}") from None
            except (duckdb.CatalogException, duckdb.BinderException) as exc:
                # A catalog relation or column the emulated catalog lacks (statistics,
                # row security policies...): sparkiq has none of those objects.
                log.debug("empty answer to a catalog query DuckDB cannot bind: %s", exc)
                return Answer([text_column(n) for n in _select_names(text)], [], "SELECT 0")
            except duckdb.Error as exc:
                raise SqlUnsupportedError(
                    f"this catalog query is not supported by sparkiq's Postgres endpoint: {exc}",
                    code=ErrorCode.CATALOG,
                ) from None
            finally:
                timer.cancel()
            if fetched.num_rows > self.limits.max_result_rows:
                raise SqlLimitError(
                    f"the catalog query returns more than SqlLimits.max_result_rows="
                    f"{self.limits.max_result_rows} rows",
                    code=ErrorCode.RESULT_ROWS,
                )
            names = _unique([renames.get(d[0], d[0]) for d in cursor.description])
            lists = [column.to_pylist() for column in fetched.columns]
            rows = [dict(zip(names, r, strict=True)) for r in zip(*lists, strict=True)]
        finally:
            cursor.close()
        schema = pa.schema([f.with_name(n) for f, n in zip(fetched.schema, names, strict=True)])
        return Answer(describe_columns(schema), rows, f"SELECT {len(rows)}")

    def _catalog_db(self) -> tuple[duckdb.DuckDBPyConnection, Walls]:
        """The catalog database of the tables the current principal may see, rebuilt when
        those tables or their schemas changed."""
        current = {t: self.node.schema(t) for t in readable(self.node.tables)}
        visible = frozenset(current)
        held = self._dbs.get(visible)
        if held is not None and all(current[t] is held[2][t] for t in current):
            self._dbs.move_to_end(visible)
            return held[0], held[1]
        # An old database is not closed here: queries may still run on its cursors.
        db = build_catalog(current, self.parameters)
        self._dbs[visible] = (db, Walls(db), current)
        while len(self._dbs) > _CATALOGS_KEPT:
            self._dbs.popitem(last=False)
        return db, self._dbs[visible][1]


def _fetch_arrow(cursor: duckdb.DuckDBPyConnection, max_rows: int) -> pa.Table:
    """At most ``max_rows`` rows of the result ``cursor`` holds, typed as DuckDB types
    them (catalog values are numbers, text, booleans and lists of those, which Arrow
    gives back to Python exactly as DuckDB would)."""
    reader = cursor.to_arrow_reader(1024)
    assert reader is not None  # the statement had a result (its description was read)
    batches = []
    held = 0
    for batch in reader:
        batches.append(batch)
        held += batch.num_rows
        if held >= max_rows:
            break
    return pa.Table.from_batches(batches, schema=reader.schema).slice(0, max_rows)


def _select_names(text: str) -> list[str]:
    """The output column names of a SELECT, as far as sqlglot reads them (none otherwise)."""
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.SqlglotError:
        return []
    return _unique(list(getattr(tree, "named_selects", [])))


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


def _set(answers: Answers, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    match = _SET.match(text)
    if match is not None:
        value = match.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        name = match.group(1).lower()
        check_setting(name, value)  # a typo fails here, not in a later statement
        settings[name] = value
    elif not (len(words) > 1 and words[1].lower() in ("transaction", "session", "names")):
        raise SqlSyntaxError(f"cannot read this SET statement: {text.strip()[:80]!r}")
    return Answer(None, [], "SET")


# Settings Postgres names in several words (SHOW TIME ZONE), by the name they stand for.
_SHOW_ALIASES = {
    "time zone": "timezone",
    "transaction isolation level": "transaction_isolation",
    "session authorization": "session_authorization",
}
_SHOW = re.compile(r"^\s*SHOW\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)
_SHOW_COLUMNS = re.compile(r"^columns\s+(?:from|in)\s+(.+)$", re.IGNORECASE)
_DESCRIBE = re.compile(r"^\s*DESC(?:RIBE)?\s+(.+?)\s*;?\s*$", re.IGNORECASE | re.DOTALL)


def _show(answers: Answers, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    match = _SHOW.match(text)
    if match is None:
        raise SqlSyntaxError("SHOW needs a setting name (or TABLES, or COLUMNS FROM a table)")
    name = " ".join(match.group(1).split()).lower()
    if name == "tables":
        return answers.describe(None)
    columns = _SHOW_COLUMNS.match(name)
    if columns is not None:
        return answers.describe(_table_name(match.group(1).split()[-1]))
    name = _SHOW_ALIASES.get(name, name)
    lowered = {k.lower(): v for k, v in answers.parameters.items()}
    lowered.update(_EXTRA_SETTINGS)
    lowered.update(settings)
    if name == "all":
        rows = [{"name": k, "setting": v} for k, v in sorted(lowered.items())]
        return Answer([text_column("name"), text_column("setting")], rows, "SHOW")
    value = lowered.get(name)
    if value is None:
        raise SqlError(
            f'unrecognized configuration parameter "{name}"', code=ErrorCode.UNKNOWN_SETTING
        )
    return Answer([text_column(name)], [{name: value}], "SHOW")


def _describe(answers: Answers, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    match = _DESCRIBE.match(text)
    if match is None:
        raise SqlSyntaxError("DESCRIBE needs a table name: DESCRIBE <table>")
    return answers.describe(_table_name(match.group(1)))


def _table_name(text: str) -> str:
    """A table named in DESCRIBE or SHOW COLUMNS: unquoted, and without ``public.``."""
    name = text.strip().rstrip(";").strip()
    if name.lower().startswith("public."):
        name = name[len("public.") :]
    if len(name) >= 2 and name[0] == name[-1] == '"':
        name = name[1:-1].replace('""', '"')
    return name


_Handler = Callable[["Answers", str, list[str], dict[str, str]], Answer]


def _tag(tag: str) -> _Handler:
    def answer(answers: Answers, text: str, words: list[str], settings: dict[str, str]) -> Answer:
        return Answer(None, [], tag)

    return answer


_RESET = re.compile(r"^\s*RESET\s+([A-Za-z_.]+)", re.IGNORECASE)


def _reset(answers: Answers, text: str, words: list[str], settings: dict[str, str]) -> Answer:
    match = _RESET.match(text)
    if match is not None and match.group(1).lower() != "all":
        settings.pop(match.group(1).lower(), None)  # dotted: sparkiq.after
    else:
        settings.clear()
    return Answer(None, [], "RESET")


_SESSION: dict[str, _Handler] = {
    "set": _set,
    "show": _show,
    "describe": _describe,
    "desc": _describe,
    "reset": _reset,
    "begin": _tag("BEGIN"),
    "start": _tag("BEGIN"),
    "commit": _tag("COMMIT"),
    "end": _tag("COMMIT"),
    "rollback": _tag("ROLLBACK"),
    "abort": _tag("ROLLBACK"),
    "savepoint": _tag("SAVEPOINT"),  # psycopg's nested transaction() blocks (SQLAlchemy)
    "release": _tag("RELEASE"),
    "discard": _tag("DISCARD ALL"),
    "deallocate": _tag("DEALLOCATE"),
    "unlisten": _tag("UNLISTEN"),
}
