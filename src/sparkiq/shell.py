"""``sparkiq shell``: an interactive SQL shell against a node, in the manner of psql.

A statement may span lines and runs when a line ends with ``;``. Pull queries print a table
and the position read at; push queries (``... EMIT CHANGES``) print changes as they commit
until Ctrl-C, which returns to the prompt. A pull query running longer than a second shows a
spinner with the elapsed time (as ``sparkiq query`` does); Ctrl-C cancels it on the node and
returns to the prompt. Tab completes SQL keywords and the node's table and column names (read
from ``GET /stores`` at start and by ``\\d``). History is kept in ``$SPARKIQ_HISTORY``
(default ``~/.sparkiq/history``). ``\\q`` or Ctrl-D leaves.

Meta-commands, as psql spells them: ``\\d`` (or ``\\dt``) lists the tables, ``\\d TABLE``
describes one (columns, types, key, window), ``\\x`` toggles expanded display (one
``column | value`` block per row), ``\\timing`` toggles printing each statement's time,
``\\pset format aligned|csv|json`` picks the output format, ``\\?`` shows help. Any other
backslash word is answered ``invalid command`` (as psql does), never run as SQL.

Errors are printed as the node gives them (a SQL error with its line, column and caret
snippet) and the shell goes on; only a node that cannot be reached at start, or refuses the
token, ends it (exit code 2, as every command that talks to a node).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from rich.console import Console
from rich.text import Text

from sparkiq.client import Client
from sparkiq.errors import SparkiqError
from sparkiq.output import (
    ChangePrinter,
    Elapsed,
    Format,
    failure_message,
    print_rows,
    text_of,
)
from sparkiq.sql.errors import closest
from sparkiq.sql.statement import is_push_query

__all__ = ["FORMATS", "KEYWORDS", "SqlCompleter", "history_path", "run_shell"]

#: What Tab offers besides names: the words of the statements a node runs.
KEYWORDS = (
    "SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "LIKE",
    "AS", "DISTINCT", "GROUP", "BY", "HAVING", "ORDER", "ASC", "DESC", "LIMIT", "OFFSET",
    "JOIN", "LEFT", "INNER", "ON", "COUNT", "SUM", "MIN", "MAX", "AVG", "CASE", "WHEN",
    "THEN", "ELSE", "END", "CAST", "EMIT", "CHANGES", "EXPLAIN", "CREATE", "DROP", "TABLE",
    "WINDOWSTART", "WINDOWEND", "TRUE", "FALSE",
)  # fmt: skip

_HELP = """\
  SQL statements end with ';' and may span lines. Tab completes keywords, tables, columns.
  \\d, \\dt                 list the tables (and refresh completion)
  \\d TABLE                 describe a table: columns, types, key, window
  \\x [on|off]              toggle expanded display (one block per row)
  \\timing [on|off]         toggle printing each statement's time
  \\pset format FORMAT      output format: aligned (a table), csv or json (a line per row)
  \\?                       this help
  \\q, Ctrl-D               leave
  Ctrl-C                   cancel the line, a running query, or stop a push query"""

#: ``\\pset format`` names (psql's) and how :func:`~sparkiq.output.print_rows` calls them.
FORMATS: dict[str, Format] = {"aligned": "table", "csv": "csv", "json": "json"}

_PROMPT = "sparkiq> "
_CONTINUATION = "      -> "


def history_path() -> Path:
    """Where the shell keeps its history: ``$SPARKIQ_HISTORY``, else ``~/.sparkiq/history``."""
    given = os.environ.get("SPARKIQ_HISTORY")
    return Path(given) if given else Path.home() / ".sparkiq" / "history"


class SqlCompleter(Completer):
    """Completes the word before the cursor from table names, column names and
    :data:`KEYWORDS`; after ``FROM`` or ``JOIN`` only table names are offered."""

    def __init__(self) -> None:
        self.tables: dict[str, list[str]] = {}

    def learn(self, stores: Iterable[dict[str, Any]]) -> None:
        """Take table and column names from ``GET /stores``' entries."""
        tables = {}
        for store in stores:
            schema = store.get("schema")
            doc = json.loads(schema) if isinstance(schema, str) else schema or {}
            tables[store["name"]] = [field["name"] for field in doc.get("fields", ())]
        self.tables = tables

    def get_completions(
        self, document: Document, complete_event: CompleteEvent
    ) -> Iterator[Completion]:
        word = document.get_word_before_cursor()
        if not word or not (word[0].isalpha() or word[0] == "_"):
            return
        before = document.text_before_cursor[: -len(word)].split()
        previous = before[-1].upper() if before else ""
        names: list[str] = list(self.tables)
        if previous not in ("FROM", "JOIN"):
            columns = sorted({c for cols in self.tables.values() for c in cols})
            names = columns + names + list(KEYWORDS)
        seen = set()
        lower = word.lower()
        for name in names:
            if name.lower().startswith(lower) and name not in seen:
                seen.add(name)
                yield Completion(name, start_position=-len(word))


def _bindings() -> KeyBindings:
    bindings = KeyBindings()

    @bindings.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        # Enter runs a statement once it ends with ';' (or is a backslash command or empty);
        # before that it starts a new line of the same statement.
        buffer = event.current_buffer
        text = buffer.text.strip()
        if not text or text.endswith(";") or text.startswith("\\"):
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    return bindings


class _Shell:
    def __init__(self, client: Client, url: str, token: str | None) -> None:
        self.client, self.url, self.token = client, url, token
        self.console = Console()
        self.completer = SqlCompleter()
        self.expanded = False  # \\x
        self.timing = False  # \\timing
        self.format: Format = "table"  # \\pset format

    def refresh(self) -> list[dict[str, Any]]:
        stores = self.client.stores()
        self.completer.learn(stores)
        return stores

    def error(self, exc: SparkiqError) -> None:
        text = failure_message(exc, self.url, self.token) or str(exc)
        # a Text, not markup: error messages quote brackets and names verbatim
        self.console.print(Text("ERROR ", style="bold red") + Text(text), highlight=False)

    def say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def run(self, statement: str) -> None:
        if statement.startswith("\\"):
            self.meta(statement)
            return
        sql = statement.rstrip().rstrip(";").rstrip()
        if is_push_query(sql):
            printer = ChangePrinter(sys.stdout, self.format)
            with self.client.stream(sql) as changes:
                # said once the node answered, i.e. subscribed: from here no batch is missed
                self.console.print("[dim]streaming changes; Ctrl-C stops[/dim]")
                try:
                    for change in changes:
                        printer(change)
                except KeyboardInterrupt:
                    pass
            return
        started = time.perf_counter()
        try:
            with Elapsed(sys.stderr, "running query"):
                answer = self.client.sql(sql)
        except KeyboardInterrupt:
            # The request's connection closes with the interrupt: the node sees its caller
            # leave and stops the statement (sparkiq.cancel). The shell stays.
            self.console.print("[dim]canceled[/dim]", highlight=False)
            return
        elapsed = time.perf_counter() - started
        self.show(answer.columns, answer.rows)
        noun = "row" if len(answer.rows) == 1 else "rows"
        self.console.print(
            f"[dim]{len(answer.rows)} {noun} at position {answer.position.to_token()}[/dim]",
            highlight=False,
        )
        if self.timing:
            self.say(f"Time: {elapsed * 1000:.3f} ms")

    def show(self, columns: list[str], rows: list[dict[str, Any]]) -> None:
        """Rows in the chosen format; expanded display applies to the aligned one (psql's
        rule: csv and json are for programs, which want one line per row)."""
        if self.expanded and self.format == "table":
            _print_expanded(self.console, columns, rows)
        else:
            print_rows(sys.stdout, columns, rows, self.format, console=self.console)

    def meta(self, statement: str) -> None:
        """A backslash command (see the module doc)."""
        words = statement.rstrip(";").split()
        command, args = words[0], words[1:]
        if command in ("\\d", "\\dt", "\\d+", "\\dt+") and not args:
            self.list_tables()
        elif command in ("\\d", "\\d+") and len(args) == 1:
            self.describe(args[0])
        elif command == "\\x" and len(args) <= 1:
            self.expanded = self.toggle(self.expanded, args, "Expanded display")
        elif command == "\\timing" and len(args) <= 1:
            self.timing = self.toggle(self.timing, args, "Timing")
        elif command == "\\pset" and args and args[0] == "format" and len(args) <= 2:
            self.pset_format(args[1:])
        elif command in ("\\?", "\\h", "\\help"):
            self.say(_HELP)
        else:
            self.say(f"invalid command {statement}\nTry \\? for help.")

    def toggle(self, current: bool, args: list[str], what: str) -> bool:
        value = not current
        if args:
            word = args[0].lower()
            if word not in ("on", "off"):
                self.say(f'unrecognized value "{args[0]}" for {what.lower()}: on or off')
                return current
            value = word == "on"
        self.say(f"{what} is {'on' if value else 'off'}.")
        return value

    def pset_format(self, args: list[str]) -> None:
        shown = {v: k for k, v in FORMATS.items()}
        if args:
            chosen = FORMATS.get(args[0].lower())
            if chosen is None:
                self.say(f"\\pset: allowed formats are {', '.join(FORMATS)}")
                return
            self.format = chosen
        self.say(f"Output format is {shown[self.format]}.")

    def list_tables(self) -> None:
        rows = [
            {
                "table": s["name"],
                "key": ", ".join(s["key_columns"]),
                "window": s.get("window_column") or "",
                "partitions": s["partitions"],
            }
            for s in self.refresh()
        ]
        self.show(["table", "key", "window", "partitions"], rows)

    def describe(self, name: str) -> None:
        stores = {s["name"]: s for s in self.refresh()}
        store = stores.get(name.strip('"'))
        if store is None:
            near = closest(name, stores)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            self.console.print(
                Text("ERROR ", style="bold red")
                + Text(f"no table named {name!r}{hint} (\\d lists the tables)"),
                highlight=False,
            )
            return
        schema = store.get("schema")
        doc = json.loads(schema) if isinstance(schema, str) else schema or {}
        keys = list(store["key_columns"])
        rows = [
            {
                "column": field["name"],
                "type": _type_text(field["type"]),
                "key": "key" if field["name"] in keys else "",
                "window": "window" if field["name"] == store.get("window_column") else "",
            }
            for field in doc.get("fields", ())
        ]
        self.say(f'Table "{store["name"]}"')
        self.show(["column", "type", "key", "window"], rows)
        footer = f"Key: ({', '.join(keys)}); {store['partitions']} partitions"
        if store.get("window_column"):
            footer += f"; windowed by {store['window_column']} (WINDOWSTART, WINDOWEND)"
        self.say(footer)


def _type_text(spark_type: Any) -> str:
    """A Spark JSON schema type as Spark's simple string (``struct<a:int,tags:array<string>>``)."""
    if isinstance(spark_type, str):
        return spark_type
    kind = spark_type.get("type")
    if kind == "struct":
        inner = ",".join(f"{f['name']}:{_type_text(f['type'])}" for f in spark_type["fields"])
        return f"struct<{inner}>"
    if kind == "array":
        return f"array<{_type_text(spark_type['elementType'])}>"
    if kind == "map":
        key, value = _type_text(spark_type["keyType"]), _type_text(spark_type["valueType"])
        return f"map<{key},{value}>"
    return str(kind)


def _print_expanded(console: Console, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """psql's expanded display: a ``-[ RECORD n ]`` rule, then ``column | value`` lines."""
    width = max((len(c) for c in columns), default=0)
    for number, row in enumerate(rows, 1):
        console.print(f"-[ RECORD {number} ]" + "-" * max(4, width), highlight=False, markup=False)
        for column in columns:
            console.print(
                f"{column.ljust(width)} | {text_of(row.get(column))}", highlight=False, markup=False
            )


def run_shell(url: str, token: str | None, ca: str | None = None) -> int:
    """The shell's loop, until ``\\q`` or end of input; the process exit code."""
    with Client(url, token=token, ca=ca) as client:
        shell = _Shell(client, url, token)
        try:
            shell.refresh()
        except SparkiqError as exc:
            hint = failure_message(exc, url, token)
            print(f"sparkiq shell: {hint or exc}", file=sys.stderr)
            return 2 if hint else 1
        path = history_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        session: PromptSession[str] = PromptSession(
            history=FileHistory(str(path)),
            completer=shell.completer,
            multiline=True,
            key_bindings=_bindings(),
            prompt_continuation=_CONTINUATION,
            complete_while_typing=False,
        )
        print(f"connected to {url}; {len(shell.completer.tables)} tables. \\? for help.")
        while True:
            try:
                statement = session.prompt(_PROMPT).strip()
            except KeyboardInterrupt:
                continue  # Ctrl-C drops the line being typed
            except EOFError:
                break
            if statement in ("\\q", "quit", "exit"):
                break
            if not statement or statement == ";":
                continue
            try:
                shell.run(statement)
            except SparkiqError as exc:
                shell.error(exc)
    return 0
