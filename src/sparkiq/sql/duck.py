"""Locked-down DuckDB connections, one per thread, and running a statement over Arrow tables
within bounds of time, memory, spill and result size.

Each :class:`DuckPool` is one in-memory DuckDB database, configured before first use with
``enable_external_access=false`` (no files, no network, no ATTACH/COPY/INSTALL),
``autoload_known_extensions=false``, ``autoinstall_known_extensions=false``,
``allow_community_extensions=false``, a bounded ``memory_limit`` and ``threads``, spilling
into a private directory the pool creates (and removes at :meth:`DuckPool.close`) of at most
``max_temp_directory_size``, then ``lock_configuration=true`` so no statement can change any
of it. Threads use cursors of that one database (a DuckDB connection is used by one thread
at a time), so ``memory_limit`` bounds the pool, not each thread. The analyzer refuses
everything but SELECT before DuckDB sees a statement; this lock is the second wall.

DuckDB's ``memory_limit`` covers its buffer manager (sorts, hash tables, spilled data), not
the strings and lists a function builds, so three more bounds hold here:

- **values**: the database shadows the functions that build a value much larger than
  their input (``repeat``, ``lpad``/``rpad``, ``range``/``generate_series``,
  ``list_resize``, ``bar``, ``to_base``, ``bitstring``, ``printf``/``format`` widths,
  ``replace``/``regexp_replace``) and those whose cost is the product of their inputs'
  lengths (``levenshtein`` and kin) with macros that refuse an argument beyond
  ``max_value_bytes`` before the original runs. They are created once, in the database's
  ``main`` schema, which every cursor searches before the built-in functions (as temporary
  macros, one set per cursor, they cost each new thread 15 ms of CPU before its first
  statement). A function cannot be called qualified
  (``system.main.repeat``): the parser refuses dotted calls.
- **process memory**: while statements run, one watchdog thread reads the process's
  resident size every 25 ms (:mod:`sparkiq.sql.watchdog`) and interrupts every running statement
  during which it grew more than twice ``memory_limit`` (over its size when that statement
  started). It also interrupts a statement whose caller left (:mod:`sparkiq.cancel`: an
  HTTP client hung up, a hedged copy lost, psql's Ctrl-C).
- **result bytes**: rows are fetched in chunks and counted (:func:`approx_bytes`); a
  result beyond ``max_result_bytes`` stops fetching and fails. A result with a nested
  column is read as Arrow and counted *before* it becomes Python objects, a large list
  converted in slices (:mod:`sparkiq.sql.pyrows`): one list of millions of strings held
  the GIL for seconds in DuckDB's conversion, stalling every other caller.

Not bounded here (known): a chain of ``||`` over CTEs doubles a value per step within one
chunk, before an interrupt is seen; only a worker process with its own memory limit would
bound that for certain.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import functools
import re
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

import duckdb
import pyarrow as pa

from sparkiq.error_codes import ErrorCode
from sparkiq.limits import parse_size
from sparkiq.sql.duck_errors import translate
from sparkiq.sql.errors import SqlError, SqlLimitError, SqlUnknownNameError
from sparkiq.sql.pyrows import arrow_rows, read_as_arrow
from sparkiq.sql.result_schema import DUCK_TYPE
from sparkiq.sql.watchdog import WATCHDOG, Statement

__all__ = ["DuckPool", "approx_bytes", "run"]

_CLOSE_WAIT = 10.0  # seconds close() waits for interrupted statements to return
_FETCH_ROWS = 1024


class DuckPool:
    """One locked-down DuckDB database with a memory, thread and spill budget, used through
    one cursor per thread.

    ``memory_limit`` and ``spill_limit`` are DuckDB sizes (``"512MB"``); ``max_value_bytes``
    bounds a value a function builds, ``max_result_bytes`` a fetched result (see the
    module docstring). The spill directory is created on first use and removed by
    :meth:`close` (also at interpreter exit)."""

    def __init__(
        self,
        memory_limit: str = "512MB",
        threads: int = 2,
        *,
        spill_limit: str = "1GB",
        max_value_bytes: int = 64 << 10,
        max_result_bytes: int = 64 << 20,
    ) -> None:
        self.memory_limit = memory_limit
        self.memory_bytes = parse_size(memory_limit, "memory_limit")
        self.spill_limit = spill_limit
        parse_size(spill_limit, "spill_limit")
        self.threads = threads
        self.max_value_bytes = max_value_bytes
        self.max_result_bytes = max_result_bytes
        self.spill_dir: str | None = None
        self._local = threading.local()
        # _lock guards _root, _closed, spill_dir, _all and _inside (threads create cursors
        # concurrently); _left is notified, under it, when a thread leaves DuckDB
        self._lock = threading.Lock()
        self._left = threading.Condition(self._lock)
        self._root: duckdb.DuckDBPyConnection | None = None
        self._closed = False
        self._all: dict[int, tuple[threading.Thread, duckdb.DuckDBPyConnection]] = {}
        self._inside = 0  # threads in run() for this pool, until every DuckDB call returned

    @staticmethod
    def for_limits(limits: Any, threads: int | None = None) -> DuckPool:
        """A pool with a :class:`~sparkiq.sql.SqlLimits`' budgets (``threads`` overrides
        its ``threads``)."""
        return DuckPool(
            limits.memory_limit,
            limits.threads if threads is None else threads,
            spill_limit=limits.spill_limit,
            max_value_bytes=limits.max_value_bytes,
            max_result_bytes=limits.max_result_bytes,
        )

    def connection(self) -> duckdb.DuckDBPyConnection:
        """This thread's cursor (created on first use)."""
        con: duckdb.DuckDBPyConnection | None = getattr(self._local, "con", None)
        if con is None:
            with self._lock:
                if self._closed:  # at exit: a new database now would outlive the interpreter
                    raise _closed_error()
                if self._root is None:
                    self._root = self._open()
                    atexit.register(self.close)
                con = self._root.cursor()  # sees the guard macros of _open
                for ident, (thread, old) in list(self._all.items()):
                    if not thread.is_alive():
                        old.close()
                        del self._all[ident]
                self._all[threading.get_ident()] = (threading.current_thread(), con)
            self._local.con = con
        return con

    @contextlib.contextmanager
    def inside(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """This thread's cursor, the thread counted as inside DuckDB for the block (see
        :meth:`close`)."""
        con = self.connection()
        with self._lock:
            if self._closed:  # closed since: its close() has not waited for this thread
                raise _closed_error()
            self._inside += 1
        try:
            yield con
        finally:
            with self._lock:
                self._inside -= 1
                self._left.notify_all()

    def _open(self) -> duckdb.DuckDBPyConnection:
        # run() reads a pending result as Arrow on purpose (sparkiq.sql.pyrows), where
        # DuckDB warns that the copy it makes could be avoided by running a relation:
        # that would run the statement again. Silenced for that call site only.
        warnings.filterwarnings(
            "ignore",
            message="Arrow output on a DB-API result",
            category=UserWarning,
            module=r"sparkiq\.sql\.duck",
        )
        # DuckDB's default spill directory is <cwd>/.tmp, shared and unbounded
        self.spill_dir = tempfile.mkdtemp(prefix="sparkiq-duckdb-")
        root = duckdb.connect(
            ":memory:",
            config={
                "enable_external_access": False,
                "autoload_known_extensions": False,
                "autoinstall_known_extensions": False,
                "allow_community_extensions": False,
                "memory_limit": self.memory_limit,
                "threads": self.threads,
                "temp_directory": self.spill_dir,
                "max_temp_directory_size": self.spill_limit,
                "lock_configuration": True,
            },
        )
        root.execute(_guards(self.max_value_bytes))
        return root

    def close(self) -> None:
        """Close every cursor and the database and remove the spill directory (at
        interpreter exit; DuckDB complains otherwise). A statement still running is
        interrupted until its thread has left DuckDB (at most ``_CLOSE_WAIT`` seconds):
        DuckDB refuses to close a busy cursor, a process exiting with one open aborted in
        DuckDB's destructor, and an interrupt that lands before the query has started is
        dropped (see sparkiq.sql.watchdog). A closed pool
        opens nothing again: a statement's next step after an interrupted one (the engine's
        final query after its fragments) opened a new database during interpreter exit, and
        a daemon thread inside DuckDB then aborted the process ("FATAL: exception not
        rethrown")."""
        with self._lock:
            self._closed = True
            deadline = time.monotonic() + _CLOSE_WAIT
            # Until every thread is back in Python, not merely until DuckDB lets a cursor
            # close: a statement's thread is still in DuckDB's C++ frames after that, waiting
            # for the GIL, and a daemon thread the interpreter's exit then ends there aborts
            # the process (its forced unwind meets DuckDB's catch-all).
            while self._inside and time.monotonic() < deadline:
                for _, con in self._all.values():
                    con.interrupt()
                self._left.wait(0.01)  # releases _lock: run() counts its thread out under it
            for _, con in self._all.values():
                with contextlib.suppress(duckdb.ResourceInUseException):
                    con.close()  # one still busy is left to the process's end: no hung stop
            self._all.clear()
            if self._root is not None:
                self._root.close()
                self._root = None
            if self.spill_dir is not None:
                shutil.rmtree(self.spill_dir, ignore_errors=True)
                self.spill_dir = None
        self._local = threading.local()


def _closed_error() -> SqlError:
    return SqlError("the SQL engine is closed: the process is exiting", code=ErrorCode.CLOSED)


@functools.cache
def _guards(cap: int) -> str:
    """The guard macros as one script: DuckDB parses it in one call per database."""
    return ";\n".join(_guard_macros(cap))


_VALUE_ERROR = "sparkiq: value too large"
_COST_ERROR = "sparkiq: too costly"


def _guard_macros(cap: int) -> list[str]:
    """``CREATE MACRO`` statements shadowing the value-building functions (in the ``main``
    schema: every cursor of the database sees them, before the built-in functions)."""

    def refuse(condition: str, value: str, what: str, kind: str = _VALUE_ERROR) -> str:
        return f"CASE WHEN {condition} THEN error('{kind}: {what}') ELSE {value} END"

    items = cap // 8
    ranges = (
        f"(a) AS system.main.{{f}}({refuse(f'a > {items}', 'a', '{f}')}), "
        f"(a, b) AS system.main.{{f}}(a, {refuse(f'b - a > {items}', 'b', '{f}')}), "
        f"(a, b, c) AS system.main.{{f}}(a, {refuse(f'(b - a) / c > {items}', 'b', '{f}')}, c)"
    )
    fmt = r"regexp_matches(f, '[0-9]{6,}|\*|\{[^}]*\{')"
    args = ["a", "b", "c", "d", "e", "g", "h", "i"]
    formats = ", ".join(
        f"(f{''.join(', ' + a for a in args[:n])}) AS system.main.{{f}}("
        f"{refuse(fmt, 'f', '{f} width')}{''.join(', ' + a for a in args[:n])})"
        for n in range(len(args) + 1)
    )
    quadratic = (
        "(a, b) AS system.main.{f}(a, "
        + refuse("strlen(a)::DOUBLE * strlen(b) > 1e8", "b", "{f} of long strings", _COST_ERROR)
        + ")"
    )
    pad = "(s, n, f) AS system.main.{f}(s, " + refuse(f"n::DOUBLE * 4 > {cap}", "n", "{f}") + ", f)"
    macros = {
        "repeat": "(s, n) AS system.main.repeat(s, "
        + refuse(f"n > 0 AND n::DOUBLE * strlen(CAST(s AS VARCHAR)) > {cap}", "n", "repeat")
        + ")",
        "lpad": pad,
        "rpad": pad,
        "range": ranges,
        "generate_series": ranges,
        "list_resize": "(l, n) AS system.main.list_resize(l, "
        + refuse(f"n > {items}", "n", "list_resize")
        + "), (l, n, v) AS system.main.list_resize(l, "
        + refuse(f"n > {items}", "n", "list_resize")
        + ", v)",
        "to_base": "(n, r, m) AS system.main.to_base(n, r, "
        + refuse(f"m > {cap}", "m", "to_base")
        + ")",
        "bitstring": "(s, n) AS system.main.bitstring(s, "
        + refuse(f"n > {cap * 8}", "n", "bitstring")
        + ")",
        "bar": "(x, lo, hi) AS system.main.bar(x, lo, hi), (x, lo, hi, w) AS "
        + "system.main.bar(x, lo, hi, "
        + refuse(f"w > {cap // 4}", "w", "bar")
        + ")",
        "printf": formats,
        "format": formats,
        "replace": "(s, a, b) AS system.main.replace(s, a, "
        + refuse(
            f"strlen(s)::DOUBLE / greatest(strlen(a), 1) * strlen(b) > greatest({cap}, strlen(s))",
            "b",
            "replace",
        )
        + ")",
        "regexp_replace": "(s, p, r) AS system.main.regexp_replace(s, p, "
        + refuse(f"2.0 * (strlen(s) + 1) * strlen(r) > greatest({cap}, 2 * strlen(s))", "r", "{f}")
        + "), (s, p, r, o) AS system.main.regexp_replace(s, p, "
        + refuse(f"2.0 * (strlen(s) + 1) * strlen(r) > greatest({cap}, 2 * strlen(s))", "r", "{f}")
        + ", o)",
        "levenshtein": quadratic,
        "damerau_levenshtein": quadratic,
        "editdist3": quadratic,
        "jaro_similarity": quadratic,
        "jaro_winkler_similarity": quadratic,
    }
    return [
        f"CREATE OR REPLACE MACRO {name}{body.replace('{f}', name)}"
        for name, body in macros.items()
    ]


_SCALAR = (int, float, bool, Decimal, dt.date, dt.time, dt.datetime, dt.timedelta)


def approx_bytes(value: Any) -> int:
    """About how many bytes ``value`` (a row, a list of rows, a cell) takes once encoded:
    strings and bytes by length, other scalars 8, containers the sum of their items."""
    if isinstance(value, str | bytes | bytearray):
        return len(value) + 2
    if value is None or isinstance(value, _SCALAR):
        return 8
    if isinstance(value, dict):
        return sum(approx_bytes(k) + approx_bytes(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return sum(map(approx_bytes, value)) + 2
    return len(str(value))


def run(
    pool: DuckPool,
    sql: str,
    relations: Mapping[str, pa.Table],
    *,
    timeout: float | None,
    arrow: bool = False,
    types: bool = False,
    max_rows: int | None = None,
    params: Mapping[str, Any] | None = None,
) -> tuple[list[str], Any]:
    """Run ``sql`` with each Arrow table of ``relations`` visible under its name (and the
    named parameters ``$name`` of ``params`` bound).

    Returns ``(column names, rows as tuples)``, or ``(names, pyarrow.Table)`` with
    ``arrow=True`` (each field's :data:`~sparkiq.sql.result_schema.DUCK_TYPE` metadata
    names its DuckDB type), or ``(names, DuckDB type names)`` with ``types=True``. DuckDB is
    interrupted after ``timeout`` seconds or when the process outgrows the pool's memory
    budget, and results are bounded by ``pool.max_result_bytes``
    (:class:`SqlLimitError`); its errors become :class:`SqlError`. ``max_rows`` stops
    fetching after that many rows.
    """
    if timeout is not None and timeout <= 0:
        raise SqlLimitError(_timeout_message(), code=ErrorCode.TIMEOUT)
    with pool.inside() as con:  # counted until every DuckDB call below returned
        statement = Statement(
            time.monotonic() + (timeout if timeout is not None else 1e9), con, 2 * pool.memory_bytes
        )
        armed = WATCHDOG.arm(statement)
        try:
            for name, table in relations.items():
                con.register(name, table)
            try:
                if arrow:
                    return _fetch_arrow(con, sql, params, pool.max_result_bytes)
                cursor = con.execute(sql, params)
                names = [d[0] for d in cursor.description or ()]
                kinds = [d[1] for d in cursor.description or ()]
                if read_as_arrow(kinds):  # sized before conversion (sparkiq.sql.pyrows)
                    reader = cursor.to_arrow_reader(_FETCH_ROWS)
                    assert reader is not None  # a SELECT's result has a reader
                    try:
                        fetched = arrow_rows(reader, max_rows, pool.max_result_bytes)
                    finally:
                        reader.close()
                    if fetched is None:
                        raise _too_large(pool.max_result_bytes)
                    rows = fetched
                else:
                    rows = _fetch_rows(cursor, max_rows, pool.max_result_bytes)
                if types:
                    return names, [str(d[1]) for d in cursor.description or ()]
                return names, rows
            finally:
                for name in relations:
                    con.unregister(name)
        except duckdb.InterruptException:
            raise _interrupted(statement, pool) from None
        except duckdb.BinderException as exc:
            raise _binder_error(str(exc), relations) from None
        except duckdb.OutOfMemoryException as exc:
            raise _out_of_memory(pool, "temp" in str(exc).lower()) from None
        except duckdb.Error as exc:
            if statement.reason is not None:
                raise _interrupted(statement, pool) from None
            text = _clean(str(exc))
            if _VALUE_ERROR in text or _COST_ERROR in text:
                raise _value_error(text, pool) from None
            if "max_temp_directory_size" in text or "temp_directory" in text:
                raise _out_of_memory(pool, True) from None
            function = re.search(r"Function with name (\w+) does not exist", text)
            if function is not None:
                near = _did_you_mean(str(exc))
                hint = f"; did you mean {near[0]}()?" if near else ""
                raise SqlUnknownNameError(
                    f"unknown function {function.group(1)}(){hint}",
                    code=ErrorCode.UNKNOWN_FUNCTION,
                    field=function.group(1),
                    candidates=near,
                ) from None
            raise translate(str(exc)) from None
        finally:
            WATCHDOG.disarm(armed)


def _fetch_rows(cursor: Any, max_rows: int | None, max_bytes: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    size = _sizer([str(d[1]) for d in cursor.description or ()])
    held = 0
    while True:
        want = _FETCH_ROWS if max_rows is None else min(_FETCH_ROWS, max_rows - len(rows))
        if want <= 0:
            cursor.abort()  # DuckDB refuses other work while a result is unfinished
            return rows
        chunk = cursor.fetchmany(want)
        held += size(chunk)
        if held > max_bytes:
            cursor.abort()
            raise _too_large(max_bytes)
        rows += chunk
        if len(chunk) < want:
            return rows


_TEXT_TYPES = ("VARCHAR", "BLOB", "BIT", "JSON")


def _sizer(types: list[str]) -> Any:
    """A function giving about how many bytes a chunk of rows of ``types`` (DuckDB type
    names) takes: 8 per fixed-size value, lengths of strings and blobs, the length of a
    nested value's text (a walk over its items in Python would cost more)."""
    text = [i for i, t in enumerate(types) if t in _TEXT_TYPES]
    nested = [
        i
        for i, t in enumerate(types)
        if i not in text and ("[" in t or t.startswith(("STRUCT", "MAP", "UNION")))
    ]
    per_row = 8 * (len(types) - len(text) - len(nested)) + 2

    def size(chunk: list[tuple[Any, ...]]) -> int:
        total = per_row * len(chunk)
        for i in text:
            total += sum(len(row[i]) for row in chunk if row[i] is not None)
        for i in nested:  # their text is about their size, and repr() runs in C
            total += sum(len(repr(row[i])) for row in chunk)
        return total

    return size


def _fetch_arrow(
    con: Any, sql: str, params: Mapping[str, Any] | None, max_bytes: int
) -> tuple[list[str], pa.Table]:
    relation = con.sql(sql, params=params)
    assert relation is not None
    reader = relation.to_arrow_reader(batch_size=64 * _FETCH_ROWS)
    try:
        batches = []
        held = 0
        for batch in reader:
            held += batch.nbytes
            if held > max_bytes:
                raise _too_large(max_bytes)
            batches.append(batch)
        # Each field names its DuckDB type: Arrow's alone does not tell a HUGEINT from a
        # DECIMAL(38,0) or a UUID from text (sparkiq.sql.result_schema reads it).
        schema = pa.schema(
            [
                field.with_metadata({DUCK_TYPE: str(kind).encode()})
                for field, kind in zip(reader.schema, relation.types, strict=True)
            ]
        )
        table = pa.Table.from_batches(batches, schema=schema)
    finally:
        reader.close()
        relation.close()  # a relation left open keeps its connection alive past close()
    return list(table.column_names), table


def _too_large(max_bytes: int) -> SqlLimitError:
    return SqlLimitError(
        f"the result holds more than SqlLimits.max_result_bytes={max_bytes} bytes; select "
        "fewer or shorter columns, add a LIMIT, or page with page_size=",
        code=ErrorCode.RESULT_TOO_LARGE,
    )


def _interrupted(statement: Statement, pool: DuckPool) -> SqlLimitError:
    if statement.reason == "memory":
        return _out_of_memory(pool)
    if statement.reason == "canceled":  # nobody waits for this answer: the message is for logs
        return SqlLimitError("the statement was canceled: its caller left", code=ErrorCode.CANCELED)
    return SqlLimitError(_timeout_message(), code=ErrorCode.TIMEOUT)


def _out_of_memory(pool: DuckPool, spill: bool = False) -> SqlLimitError:
    budget = f"SqlLimits.memory_limit={pool.memory_limit}"
    if spill:
        budget += f" and SqlLimits.spill_limit={pool.spill_limit}"
    return SqlLimitError(
        f"the query needs more memory than {budget} allow; narrow it with a key predicate "
        "or LIMIT, aggregate before joining, or raise the limit",
        code=ErrorCode.OUT_OF_MEMORY,
    )


def _value_error(text: str, pool: DuckPool) -> SqlLimitError:
    what = text.split(": ")[-1]
    if _COST_ERROR in text:
        return SqlLimitError(
            f"{what}: the inputs are too long for a function whose cost is the product of "
            "their lengths; compare shorter strings",
            code=ErrorCode.TOO_COSTLY,
        )
    return SqlLimitError(
        f"{what} would build a value of more than SqlLimits.max_value_bytes="
        f"{pool.max_value_bytes} bytes; build a smaller value or raise the limit",
        code=ErrorCode.VALUE_TOO_LARGE,
    )


def _timeout_message() -> str:
    return (
        "the query ran out of time (SqlLimits.timeout_seconds); narrow it with a key "
        "predicate or LIMIT, or raise the limit"
    )


def _clean(message: str) -> str:
    for name in ("__sq_part", "__sq_r"):
        message = message.replace(name, "table")
    return message.splitlines()[0] if message else message


def _binder_error(message: str, relations: Sequence[str] | Mapping[str, Any]) -> SqlError:
    first = _clean(message)
    if "not found" in first.lower() and "column" in first.lower():
        quoted = re.search(r'column "([^"]+)"', first)
        name = quoted.group(1) if quoted else None
        candidates = _candidates(message)
        hint = f"; did you mean {candidates[0]}?" if candidates else ""
        return SqlUnknownNameError(
            f"unknown column {name!r}{hint}" if name else "unknown column",
            code=ErrorCode.UNKNOWN_COLUMN,
            candidates=candidates,
            field=name,
        )
    return translate(message)


def _did_you_mean(message: str) -> list[str]:
    found = re.search(r'Did you mean "([^"]+)"', message)
    return [found.group(1)] if found else []


def _candidates(message: str) -> list[str]:
    marker = "Candidate bindings:"
    if marker not in message:
        return []
    tail = message.split(marker, 1)[1].splitlines()[0]
    return [c.strip().strip('"') for c in tail.split(",") if c.strip()]
