"""Plan a statement on a node without running it, for tests that watch the process's count
of running DuckDB statements (:func:`sparkiq.sql.watchdog.statement_counts`).

The first run of a statement binds it with a DuckDB statement over empty tables
(milliseconds, armed and counted like any other). A test waiting for "one statement running"
to act on a slow statement saw that bind instead, twice in whole runs on a loaded machine:
it read ``/metrics`` after the bind had ended (0 running), or hung up between the bind and
the statement (nothing left to cancel). Planned ahead, the statement runs without a bind.
"""

from __future__ import annotations

from sparkiq import Node


def plan_ahead(node: Node, text: str) -> None:
    """Plan ``text`` on ``node`` (kept by its text) without running it."""
    node.sql("SELECT 1 AS one")  # the node's engine, made on first use
    engine = node._sql
    assert engine is not None
    engine._plan(text)
