"""Locked-down DuckDB connections, one per thread, and running a statement over Arrow tables.

Every connection is in-memory and configured before first use with
``enable_external_access=false`` (no files, no network, no ATTACH/COPY/INSTALL),
``autoload_known_extensions=false``, ``autoinstall_known_extensions=false``,
``allow_community_extensions=false``, a bounded ``memory_limit`` and ``threads``, then
``lock_configuration=true`` so no statement can change any of it. The analyzer refuses
everything but SELECT before DuckDB sees a statement; this lock is the second wall.

A connection is used by one thread at a time (DuckDB connections are not shared across
threads), so the pool is a ``threading.local`` per settings.
"""

from __future__ import annotations

import atexit
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from sparkiq.sql.errors import SqlError, SqlLimitError, SqlUnknownNameError

__all__ = ["DuckPool", "run"]


class DuckPool:
    """Per-thread locked-down DuckDB connections with one memory and thread budget."""

    def __init__(self, memory_limit: str = "512MB", threads: int = 2) -> None:
        self.memory_limit = memory_limit
        self.threads = threads
        self._local = threading.local()
        self._all: dict[int, tuple[threading.Thread, duckdb.DuckDBPyConnection]] = {}
        self._lock = threading.Lock()

    def connection(self) -> duckdb.DuckDBPyConnection:
        """This thread's connection (created and locked on first use)."""
        con: duckdb.DuckDBPyConnection | None = getattr(self._local, "con", None)
        if con is None:
            con = duckdb.connect(
                ":memory:",
                config={
                    "enable_external_access": False,
                    "autoload_known_extensions": False,
                    "autoinstall_known_extensions": False,
                    "allow_community_extensions": False,
                    "memory_limit": self.memory_limit,
                    "threads": self.threads,
                    "lock_configuration": True,
                },
            )
            self._local.con = con
            with self._lock:
                if not self._all:
                    atexit.register(self.close)
                for ident, (thread, old) in list(self._all.items()):
                    if not thread.is_alive():
                        old.close()
                        del self._all[ident]
                self._all[threading.get_ident()] = (threading.current_thread(), con)
        return con

    def close(self) -> None:
        """Close every connection (at interpreter exit; DuckDB complains otherwise)."""
        with self._lock:
            for _, con in self._all.values():
                con.close()
            self._all.clear()


class _Watchdog:
    """One daemon thread interrupting connections whose deadline passed (started on first
    use; a timer thread per statement would cost more than a key lookup)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, tuple[float, duckdb.DuckDBPyConnection, threading.Event]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, con: duckdb.DuckDBPyConnection, flag: threading.Event) -> int:
        with self._cond:
            self._next += 1
            self._armed[self._next] = (deadline, con, flag)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sparkiq-sql-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
            return self._next

    def disarm(self, token: int) -> None:
        with self._cond:
            self._armed.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                expired = [t for t, (deadline, _, _) in self._armed.items() if deadline <= now]
                for token in expired:
                    _, con, flag = self._armed.pop(token)
                    flag.set()
                    con.interrupt()
                    del con  # this frame outlives the statement: hold no connection
                soonest = min((d for d, _, _ in self._armed.values()), default=now + 60)
                self._cond.wait(max(0.001, soonest - time.monotonic()))


_WATCHDOG = _Watchdog()


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
    ``arrow=True``, or ``(names, DuckDB type names)`` with ``types=True``. DuckDB is
    interrupted after ``timeout`` seconds (:class:`SqlLimitError`); its errors become
    :class:`SqlError`. ``max_rows`` stops fetching after that many rows.
    """
    con = pool.connection()
    timed_out = threading.Event()
    armed = None
    if timeout is not None:
        if timeout <= 0:
            raise SqlLimitError(_timeout_message(), code="timeout")
        armed = _WATCHDOG.arm(time.monotonic() + timeout, con, timed_out)
    try:
        for name, table in relations.items():
            con.register(name, table)
        try:
            if arrow:
                relation = con.sql(sql, params=params)
                assert relation is not None
                table = relation.to_arrow_table()
                assert table is not None
                return list(table.column_names), table
            cursor = con.execute(sql, params)
            names = [d[0] for d in cursor.description or ()]
            if max_rows is None:
                rows = cursor.fetchall()
            else:
                rows = cursor.fetchmany(max_rows)
                if len(rows) == max_rows:
                    cursor.abort()  # DuckDB refuses other work while a result is unfinished
            if types:
                return names, [str(d[1]) for d in cursor.description or ()]
            return names, rows
        finally:
            for name in relations:
                con.unregister(name)
    except duckdb.InterruptException:
        raise SqlLimitError(_timeout_message(), code="timeout") from None
    except duckdb.BinderException as exc:
        raise _binder_error(str(exc), relations) from None
    except duckdb.Error as exc:
        if timed_out.is_set():
            raise SqlLimitError(_timeout_message(), code="timeout") from None
        text = _clean(str(exc))
        function = re.search(r"Function with name (\w+) does not exist", text)
        if function is not None:
            raise SqlUnknownNameError(
                f"unknown function {function.group(1)}(): {text}",
                code="unknown_function",
                field=function.group(1),
                candidates=_did_you_mean(str(exc)),
            ) from None
        raise SqlError(f"the query failed while executing: {text}", code="execution") from None
    finally:
        if armed is not None:
            _WATCHDOG.disarm(armed)


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
        return SqlUnknownNameError(
            f"unknown column: {first}",
            code="unknown_column",
            candidates=_candidates(message),
            field=quoted.group(1) if quoted else None,
        )
    return SqlError(f"the query cannot be bound: {first}", code="binder")


def _did_you_mean(message: str) -> list[str]:
    found = re.search(r'Did you mean "([^"]+)"', message)
    return [found.group(1)] if found else []


def _candidates(message: str) -> list[str]:
    marker = "Candidate bindings:"
    if marker not in message:
        return []
    tail = message.split(marker, 1)[1].splitlines()[0]
    return [c.strip().strip('"') for c in tail.split(",") if c.strip()]
