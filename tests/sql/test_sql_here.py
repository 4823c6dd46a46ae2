"""``Node.sql_here``: the answer of a SQL key lookup at hand, without blocking.

It answers only what it can give at once -- a statement whose plan is cached (by text or
shape) and runs in Python as key lookups of partitions this node reads itself -- and then
exactly what :meth:`Node.sql` answers; anything else is None, for the caller to run
:meth:`Node.sql` on a thread (the REST API does that on its event loop).
"""

from __future__ import annotations

import contextlib

import pytest

from sparkiq import Node
from sparkiq.sql import SqlError, SqlResult


def _same(here: SqlResult | None, there: SqlResult) -> None:
    assert here is not None
    assert here.columns == there.columns
    assert here.rows == there.rows
    assert here.position == there.position
    assert here.schema == there.schema
    assert here.next_page_token == there.next_page_token


def test_a_cached_key_lookup_answers_as_sql_does(node: Node) -> None:
    first = "SELECT k, n FROM t WHERE k = 'k005'"
    assert node.sql_here("SELECT n, k FROM t WHERE k = 'k006'") is None  # never planned
    node.sql(first)  # plans the shape
    for key in ("k005", "k006", "k150", "absent"):
        text = f"SELECT k, n FROM t WHERE k = '{key}'"
        _same(node.sql_here(text), node.sql(text))
    many = "SELECT * FROM t WHERE k IN ('k001', 'k002', 'k199', 'nope')"
    node.sql(many)
    _same(node.sql_here(many), node.sql(many))
    _same(node.sql_here(many, page_size=2), node.sql(many, page_size=2))


@pytest.mark.parametrize(
    "text",
    [
        "SELECT * FROM t WHERE k >= 'k190'",  # a range: RangeQuery on every partition
        "SELECT k, n + 1 AS m FROM t WHERE k = 'k003'",  # an expression: DuckDB
        "SELECT count(*) AS c FROM t WHERE k IN ('k001', 'k002')",  # an aggregate
        "SELECT * FROM win WHERE k = 'a'",  # a windowed table: a key has many rows
        "EXPLAIN SELECT * FROM t WHERE k = 'k001'",
        "SELECT * FROM t WHERE k = 'k001' AND k = ",  # an error: sql() raises it, located
    ],
)
def test_what_may_block_or_fail_is_left_to_sql(node: Node, text: str) -> None:
    with contextlib.suppress(SqlError):  # the refusal is sql()'s to give
        node.sql(text)  # planned (or refused) once: sql_here still declines
    assert node.sql_here(text) is None
