"""Tables defined in SQL, on the writer: ``CREATE TABLE ... AS SELECT`` and its companions.

Grammar (keywords in any case; one statement, optionally ending in ``;``)::

    CREATE TABLE [IF NOT EXISTS] name
        WITH (KEY = 'col' | 'col, col' | (col, col)
              [, PARTITIONS = n] [, WINDOW = 'col'] [, TOMBSTONE = 'col']
              [, OUTPUT_MODE = 'update' | 'complete' | 'append']
              [, KAFKA_TOPIC = 'topic' [, KEY_FORMAT = 'json' | 'kafka']])
        AS select [EMIT CHANGES]
    DROP TABLE [IF EXISTS] name [DELETE CHANGELOG]
    SHOW TABLES
    DESCRIBE [TABLE] name                       (or DESC)

``select`` is Spark SQL over the streams registered with
:meth:`~sparkiq.spark.app.App.register_stream`. It is handed to ``spark.sql`` exactly as
written (sliced from the statement's text), after each stream it reads has been made a
temporary view of its name; only the FROM names are checked here first, so that a typo names
the registered streams instead of raising a Spark analysis error. The resulting streaming
DataFrame is materialized by :meth:`~sparkiq.spark.app.App.materialize` with the options as
its arguments. ``EMIT CHANGES`` is accepted and ignored: a table's query runs continuously
anyway (as ksqlDB's KLIP-8 makes it implicit for persistent queries). ``KAFKA_TOPIC`` and
``KEY_FORMAT`` are ``materialize``'s ``kafka_topic`` and ``kafka_key_format`` (docs/kafka.md).

These statements change what the writer runs, so only :meth:`App.sql` executes them: no
node, router or REST route can reach this module (the package layering forbids it, and nodes
never write the changelog). Anything else, such as ``SELECT`` or ``EXPLAIN``, is a pull
query: :func:`parse` returns None for it and the App hands it to its local node.

Results are :class:`~sparkiq.sql.SqlResult`, as for pull queries, with ``columns``, ``rows``
(a list of dicts) and ``position`` (always empty: DDL reads no replica).

This module parses; :mod:`sparkiq.spark.ddl_run` runs what it parsed on the writer. Neither
sees the App itself: :func:`~sparkiq.spark.ddl_run.execute` gets a
:class:`~sparkiq.spark.ddl_run.Writer`, the App's tables and streams and the two things DDL
may do to it (materialize a table, drop one), so imports go one way (the App imports both).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokenizer_core import Token, TokenType

from sparkiq.changelog.manifest import OUTPUT_MODES
from sparkiq.errors import ConfigError
from sparkiq.sql.statement import emit_changes_at, first_word

__all__ = [
    "CreateTable",
    "DescribeTable",
    "DropTable",
    "IDENTIFIER",
    "ShowTables",
    "Statement",
    "parse",
    "stream_references",
]

SUPPORTED = (
    "App.sql() runs CREATE TABLE name WITH (KEY = ...) AS SELECT ..., DROP TABLE name "
    "[DELETE CHANGELOG], SHOW TABLES and DESCRIBE name here, and pull queries (SELECT, "
    "EXPLAIN) on the local node"
)
OPTIONS = ("KEY", "PARTITIONS", "WINDOW", "OUTPUT_MODE", "TOMBSTONE", "KAFKA_TOPIC", "KEY_FORMAT")
_GRAMMAR = {
    "CREATE": "CREATE TABLE [IF NOT EXISTS] name WITH (KEY = 'column', PARTITIONS = n) "
    "AS SELECT ...",
    "DROP": "DROP TABLE [IF EXISTS] name [DELETE CHANGELOG]",
    "SHOW": "SHOW TABLES",
    "DESCRIBE": "DESCRIBE [TABLE] name",
    "DESC": "DESCRIBE [TABLE] name",
}
_DDL_WORDS = frozenset({"CREATE", "DROP", "SHOW", "DESCRIBE", "DESC"})
# Statements that would write a table some other way than by its Spark query.
_REFUSED_WORDS = frozenset(
    {"ALTER", "INSERT", "UPDATE", "DELETE", "MERGE", "TRUNCATE", "REPLACE", "UPSERT", "RENAME"}
)
# An open comment runs to the end (as in sparkiq.sql.statement): each match then ends at
# the first "*/" or at the end, so many "/*" without "*/" cost one pass, not one per "/*".
_COMMENT = re.compile(r"--[^\n]*|/\*.*?(?:\*/|\Z)", re.DOTALL)
#: A name Spark and DuckDB take unquoted: what a table and its key and window columns must be.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NOT_WORDS = frozenset({TokenType.STRING, TokenType.IDENTIFIER, TokenType.NUMBER})


@dataclass(frozen=True)
class CreateTable:
    name: str
    select: str  # Spark SQL, exactly as written in the statement
    key: tuple[str, ...]
    partitions: int | None = None  # None: materialize()'s default
    window: str | None = None
    output_mode: str | None = None
    tombstone: str | None = None
    kafka_topic: str | None = None
    key_format: str = "json"
    if_not_exists: bool = False
    text: str = ""


@dataclass(frozen=True)
class DropTable:
    name: str
    if_exists: bool = False
    delete_changelog: bool = False


@dataclass(frozen=True)
class ShowTables:
    pass


@dataclass(frozen=True)
class DescribeTable:
    name: str


Statement = CreateTable | DropTable | ShowTables | DescribeTable


# -- parsing -----------------------------------------------------------------------------------


def parse(text: str) -> Statement | None:
    """The DDL statement ``text`` holds, or None when it is not DDL (a pull query).

    Raises :class:`ConfigError` for malformed DDL and for statements that would write a
    table another way (INSERT, UPDATE...), naming the problem and what is supported.
    """
    if not isinstance(text, str):
        raise ConfigError(f"sql() needs a SQL string, got {type(text).__name__}")
    first = first_word(text)
    word = first[0] if first else ""
    if word in _REFUSED_WORDS:
        raise _unsupported(word, "a sparkiq table is written only by its Spark query")
    if word not in _DDL_WORDS:
        return None
    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except TokenError as exc:
        raise ConfigError(
            f"cannot read the {word} statement ({exc}): is a quote or string unterminated? "
            f"Expected {_GRAMMAR[word]}"
        ) from None
    return _Parser(text, tokens).statement()


class _Parser:
    """Recursive descent over sqlglot's Spark tokens; errors quote line and column."""

    def __init__(self, text: str, tokens: list[Token]) -> None:
        self.text = text
        self.tokens = tokens
        self.i = 0
        self.grammar = _GRAMMAR[tokens[0].text.upper()]

    # token helpers

    def peek(self, ahead: int = 0) -> Token | None:
        j = self.i + ahead
        return self.tokens[j] if j < len(self.tokens) else None

    def next(self, what: str) -> Token:
        token = self.peek()
        if token is None:
            raise self.error(f"expected {what}, but the statement ended")
        self.i += 1
        return token

    def is_word(self, word: str, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return (
            token is not None and token.token_type not in _NOT_WORDS and token.text.upper() == word
        )

    def accept(self, *words: str) -> bool:
        """Consume ``words`` if the next tokens are exactly these words."""
        if all(self.is_word(w, n) for n, w in enumerate(words)):
            self.i += len(words)
            return True
        return False

    def expect(self, *words: str, hint: str = "") -> None:
        if not self.accept(*words):
            raise self.error(f"expected {' '.join(words)}{hint}")

    def word_after(self) -> str:
        token = self.peek()
        return token.text.upper() if token is not None else "..."

    def error(self, message: str, token: Token | None = None) -> ConfigError:
        """A syntax error at ``token`` (default: the next one), with the statement's form."""
        token = token if token is not None else self.peek()
        where = ""
        if token is not None:
            column = token.start - self.text.rfind("\n", 0, token.start)
            found = repr(token.text)
            if token.token_type == TokenType.STRING:
                found = f"the string {found}"
            where = f" at line {token.line}, column {column}, found {found}"
        return ConfigError(f"{message}{where}. Expected {self.grammar}")

    def identifier(self, what: str) -> str:
        token = self.next(what)
        if token.token_type == TokenType.IDENTIFIER or (
            token.token_type not in _NOT_WORDS and IDENTIFIER.match(token.text)
        ):
            return token.text
        raise self.error(f"expected {what} (quote other names with backticks: `name`)", token)

    def end(self) -> None:
        self.accept_semicolon()
        if self.peek() is not None:
            raise self.error("unexpected text after the statement")

    def accept_semicolon(self) -> None:
        token = self.peek()
        if token is not None and token.token_type == TokenType.SEMICOLON:
            self.i += 1

    # statements

    def statement(self) -> Statement:
        word = self.next("a statement").text.upper()
        if word == "CREATE":
            return self.create()
        if word == "DROP":
            return self.drop()
        if word == "SHOW":
            return self.show()
        return self.describe()

    def create(self) -> CreateTable:
        if self.accept("OR", "REPLACE"):
            raise _unsupported("CREATE OR REPLACE", "DROP TABLE the table, then CREATE it again")
        if not self.is_word("TABLE"):
            raise _unsupported(f"CREATE {self.word_after()}")
        self.i += 1
        if_not_exists = self.accept("IF", "NOT", "EXISTS")
        name = self.identifier("a table name after CREATE TABLE")
        token = self.peek()
        if token is not None and token.token_type == TokenType.L_PAREN:
            raise self.error(
                f"column definitions are not supported: the columns of {name!r} are its "
                "SELECT's output (CREATE TABLE name WITH (KEY = ...) AS SELECT ...)"
            )
        options: dict[str, Any] = {}
        if self.accept("WITH"):
            options = self.options()
        as_token = self.peek()
        self.expect("AS", hint=" SELECT ... after the table name and its WITH (...) options")
        assert as_token is not None
        select = self.select_text(as_token)
        return self.create_table(name, options, select, if_not_exists)

    def select_text(self, as_token: Token) -> str:
        """The statement's text after AS, without a trailing ``EMIT CHANGES`` or ``;``."""
        stop = emit_changes_at(self.text)
        if stop is None:
            last = self.tokens[-1]
            semicolon = last.token_type == TokenType.SEMICOLON
            stop = last.start if semicolon else len(self.text)
        select = self.text[as_token.end + 1 : stop].strip()
        if not select:
            raise self.error("expected a SELECT after AS")
        return select

    def options(self) -> dict[str, Any]:
        token = self.next("( after WITH")
        if token.token_type != TokenType.L_PAREN:
            raise self.error("expected ( after WITH", token)
        options: dict[str, Any] = {}
        while True:
            name_token = self.peek()
            name = self.identifier("an option name").upper()
            if name not in OPTIONS:
                raise self.error(
                    f"unknown option {name}; the options are {', '.join(OPTIONS)}", name_token
                )
            if name in options:
                raise self.error(f"option {name} is given twice", name_token)
            equals = self.next(f"= after {name}")
            if equals.token_type != TokenType.EQ:
                raise self.error(f"expected = after {name}", equals)
            options[name] = self.value(name)
            separator = self.next(", or ) in WITH (...)")
            if separator.token_type == TokenType.R_PAREN:
                return options
            if separator.token_type != TokenType.COMMA:
                raise self.error("expected , or ) in WITH (...)", separator)

    def value(self, option: str) -> Any:
        """A string, a number, a bare word or a parenthesized list of names."""
        token = self.next(f"a value for {option}")
        kind = token.token_type
        if kind == TokenType.STRING:
            return token.text
        after = self.peek()
        if kind == TokenType.DASH and after is not None and after.token_type == TokenType.NUMBER:
            self.i += 1
            return _number("-" + after.text)
        if kind == TokenType.NUMBER:
            return _number(token.text)
        if kind == TokenType.L_PAREN:
            items = []
            while True:
                item = self.next(f"a column name in {option} = (...)")
                if item.token_type == TokenType.STRING:
                    items.append(item.text)
                else:
                    self.i -= 1
                    items.append(self.identifier(f"a column name in {option} = (...)"))
                separator = self.next(f", or ) in {option} = (...)")
                if separator.token_type == TokenType.R_PAREN:
                    return items
                if separator.token_type != TokenType.COMMA:
                    raise self.error(f"expected , or ) in {option} = (...)", separator)
        if kind == TokenType.IDENTIFIER or (
            kind not in _NOT_WORDS and IDENTIFIER.match(token.text)
        ):
            return _Word(token.text)
        raise self.error(f"expected a value for {option}", token)

    def create_table(
        self, name: str, options: dict[str, Any], select: str, if_not_exists: bool
    ) -> CreateTable:
        example = f"CREATE TABLE {name} WITH (KEY = 'column', PARTITIONS = 8) AS SELECT ..."
        if "KEY" not in options:
            raise ConfigError(
                f"CREATE TABLE {name} needs a KEY naming the column(s) that identify a row: "
                f"{example}; for a composite key, KEY = (col1, col2)",
                store=name,
            )
        key = _names(options["KEY"], "KEY", name)
        partitions = options.get("PARTITIONS")
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise ConfigError(
                f"PARTITIONS must be a positive integer (PARTITIONS = 8), got {_show(partitions)}",
                store=name,
            )
        output_mode = options.get("OUTPUT_MODE")
        if output_mode is not None:
            output_mode = _string(output_mode, "OUTPUT_MODE", name).lower()
            if output_mode not in OUTPUT_MODES:
                raise ConfigError(
                    f"OUTPUT_MODE must be one of {list(OUTPUT_MODES)}, got {output_mode!r}",
                    store=name,
                )
        window = options.get("WINDOW")
        tombstone = options.get("TOMBSTONE")
        topic, key_format = options.get("KAFKA_TOPIC"), options.get("KEY_FORMAT", "json")
        return CreateTable(
            name=name,
            select=select,
            key=key,
            partitions=partitions,
            window=None if window is None else _string(window, "WINDOW", name),
            output_mode=output_mode,
            tombstone=None if tombstone is None else _string(tombstone, "TOMBSTONE", name),
            kafka_topic=None if topic is None else _string(topic, "KAFKA_TOPIC", name),
            key_format=_string(key_format, "KEY_FORMAT", name).lower(),
            if_not_exists=if_not_exists,
            text=self.text.strip(),
        )

    def drop(self) -> DropTable:
        if not self.is_word("TABLE"):
            raise _unsupported(f"DROP {self.word_after()}")
        self.i += 1
        if_exists = self.accept("IF", "EXISTS")
        name = self.identifier("a table name after DROP TABLE")
        delete = self.accept("DELETE", "CHANGELOG")
        if not delete and self.is_word("DELETE"):
            raise self.error("expected DELETE CHANGELOG")
        self.end()
        return DropTable(name, if_exists, delete)

    def show(self) -> ShowTables:
        # sqlglot's tokenizer keeps everything after SHOW as one string token.
        rest = self.text[self.tokens[0].end + 1 :]
        words = _COMMENT.sub(" ", rest).replace(";", " ").split()
        if [w.upper() for w in words] != ["TABLES"]:
            shown = " ".join(words[:8])
            raise _unsupported(f"SHOW {shown if len(shown) <= 60 else shown[:57] + '...'}")
        return ShowTables()

    def describe(self) -> DescribeTable:
        self.accept("TABLE")
        name = self.identifier("a table name after DESCRIBE")
        self.end()
        return DescribeTable(name)


def _unsupported(statement: str, instead: str = "") -> ConfigError:
    return ConfigError(
        f"{statement} is not supported{': ' + instead if instead else ''}. {SUPPORTED}"
    )


@dataclass(frozen=True)
class _Word:
    """An unquoted word as an option value (``KEY = user``)."""

    text: str


def _number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _show(value: Any) -> str:
    return value.text if isinstance(value, _Word) else repr(value)


def _string(value: Any, option: str, table: str) -> str:
    if isinstance(value, _Word):
        return value.text
    if isinstance(value, str) and value:
        return value
    raise ConfigError(
        f"{option} must be a column name such as {option} = 'name', got {_show(value)}",
        store=table,
    )


def _names(value: Any, option: str, table: str) -> tuple[str, ...]:
    if isinstance(value, _Word):
        names = [value.text]
    elif isinstance(value, str):
        names = [n.strip() for n in value.split(",")]
    elif isinstance(value, list):
        names = value
    else:
        names = []
    if not names or not all(names):
        raise ConfigError(
            f"{option} must name one or more columns: {option} = 'col', {option} = 'col1, "
            f"col2' or {option} = (col1, col2); got {_show(value)}",
            store=table,
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"{option} lists a column twice: {names}", store=table)
    return tuple(names)


def stream_references(select: str) -> set[str] | None:
    """The relation names ``select`` reads (CTE names excluded), or None when sqlglot cannot
    parse it (Spark then judges the SQL itself). Table functions are not relations."""
    try:
        tree = sqlglot.parse_one(select, read="spark")
    except (ParseError, TokenError):
        return None
    if not isinstance(tree, exp.Query):
        raise ConfigError(
            f"CREATE TABLE ... AS needs a SELECT, got {tree.key.upper()}: {SUPPORTED}"
        )
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    names = set()
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue
        if table.db or table.catalog:
            names.add(".".join(p for p in (table.catalog, table.db, table.name) if p))
        elif table.name.lower() not in ctes:
            names.add(table.name)
    return names
