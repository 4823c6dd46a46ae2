"""The watchdog of running DuckDB statements: one daemon thread that interrupts a statement
past its deadline, one during which the process grew beyond its memory budget (read from
``/proc/self/statm`` every :data:`RSS_POLL` seconds), and one whose caller left
(:mod:`sparkiq.cancel`). :func:`sparkiq.sql.duck.run` arms a :class:`Statement` for each
statement it runs and disarms it when DuckDB has returned; ``/metrics`` reads the counts.
"""

from __future__ import annotations

import os
import threading
import time

import duckdb

from sparkiq.cancel import cancel_signal

__all__ = ["WATCHDOG", "RSS_POLL", "Statement", "Watchdog", "statement_counts"]

RSS_POLL = 0.025  # seconds between checks while statements run


class Statement:
    """One running statement the watchdog may interrupt, and why it did."""

    __slots__ = ("budget", "canceled", "con", "deadline", "reason", "start_rss")

    def __init__(self, deadline: float, con: duckdb.DuckDBPyConnection, budget: int) -> None:
        self.deadline, self.con, self.budget = deadline, con, budget
        self.canceled = cancel_signal()  # set when the caller is gone (sparkiq.cancel)
        self.reason: str | None = None
        # measured per statement: a node busy for hours never has an idle moment to
        # measure a baseline at, and grows for other reasons meanwhile (replicas, caches)
        self.start_rss = _rss()


class Watchdog:
    """One daemon thread interrupting statements whose deadline passed or whose caller left,
    or all of them when the process grew past their memory budget (started on first use; a
    timer thread per statement would cost more than a key lookup)."""

    def __init__(self) -> None:
        # _cond guards _armed, _running, _interrupted and _thread
        self._cond = threading.Condition()
        self._armed: dict[int, Statement] = {}
        self._running = 0  # armed or interrupted, until DuckDB has returned
        self._interrupted: dict[str, int] = {"timeout": 0, "memory": 0, "canceled": 0}
        self._next = 0
        self._thread: threading.Thread | None = None

    def counts(self) -> tuple[int, dict[str, int]]:
        """Statements running now, and those interrupted since start by reason."""
        with self._cond:
            return self._running, dict(self._interrupted)

    def arm(self, statement: Statement) -> int:
        with self._cond:
            self._running += 1
            self._next += 1
            self._armed[self._next] = statement
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="sparkiq-sql-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()
            return self._next

    def disarm(self, token: int) -> None:
        """The statement of ``token`` has ended (DuckDB returned)."""
        with self._cond:
            self._running -= 1
            self._armed.pop(token, None)

    def _run(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                self._interrupt_due(now)
                waiting = (s.deadline for s in self._armed.values() if s.reason is None)
                soonest = min(waiting, default=now + 60)
                if self._armed:
                    soonest = min(soonest, now + RSS_POLL)
                self._cond.wait(max(0.001, soonest - time.monotonic()))

    def _interrupt_due(self, now: float) -> None:
        """Interrupt statements past their deadline or budget, or whose caller left (a
        function of its own: the waiting loop must hold no reference to a statement, hence
        none to a connection).

        An interrupted statement is interrupted again at every poll until it ends (its
        ``run`` disarms it): DuckDB clears the interrupt when a query starts, so one that
        arrived while ``run`` was still registering the tables was lost, and the statement
        ran on with no deadline watched (a Postgres cancel right after a statement began
        did that)."""
        rss = _rss() if self._armed else 0
        for statement in self._armed.values():
            if statement.reason is None:
                if statement.deadline <= now:
                    statement.reason = "timeout"
                elif statement.canceled is not None and statement.canceled.is_set():
                    statement.reason = "canceled"
                elif rss - statement.start_rss > statement.budget:
                    statement.reason = "memory"
                else:
                    continue
                self._interrupted[statement.reason] += 1
            statement.con.interrupt()


def statement_counts() -> tuple[int, dict[str, int]]:
    """DuckDB statements running in this process now (every pool), and how many were
    interrupted since it started, by reason (``timeout``, ``memory``, ``canceled``)."""
    return WATCHDOG.counts()


def _rss() -> int:
    """This process's resident bytes (Linux; 0 elsewhere, which disables the check)."""
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
WATCHDOG = Watchdog()
