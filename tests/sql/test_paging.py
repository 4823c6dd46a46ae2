"""Paging: key-ordered pages never repeat or skip a key; other statements page by offset;
every page is at least as fresh as the one before."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import duckdb
import pytest

from sparkiq import Node, PositionBound
from sparkiq.sql import SqlEngine, SqlError, SqlLimits, SqlResult
from tests.changelog.helpers import make_table, write_batch
from tests.sql.compare import normalize, reference


def all_pages(node: Node, sql: str, size: int, **options: Any) -> list[SqlResult]:
    pages = [node.sql(sql, page_size=size, **options)]
    while pages[-1].next_page_token is not None:
        pages.append(node.sql(sql, page_size=size, page_token=pages[-1].next_page_token))
        assert len(pages) < 1000
    return pages


def rows_of(pages: list[SqlResult]) -> list[tuple[Any, ...]]:
    return [tuple(normalize(r[c]) for c in p.columns) for p in pages for r in p.rows]


@pytest.mark.parametrize(
    ("sql", "ordered_like"),
    [
        ("SELECT * FROM t", "SELECT * FROM t ORDER BY k"),
        (
            "SELECT k, n * 2 AS d FROM t WHERE n > 20",
            "SELECT k, n * 2 AS d FROM t WHERE n > 20 ORDER BY k",
        ),
        (
            "SELECT k FROM t WHERE n > 20 LIMIT 50 OFFSET 5",
            "SELECT k FROM t WHERE n > 20 ORDER BY k LIMIT 50 OFFSET 5",
        ),
        ("SELECT * FROM ck", "SELECT * FROM ck ORDER BY region, id"),
        (
            "SELECT * FROM ck WHERE region = 'eu' AND id >= 0",
            "SELECT * FROM ck WHERE region = 'eu' AND id >= 0 ORDER BY id",
        ),
        ("SELECT * FROM ik WHERE key > -20", "SELECT * FROM ik WHERE key > -20 ORDER BY key"),
        ("SELECT * FROM xk", "SELECT * FROM xk ORDER BY key"),
        (
            "SELECT k, WINDOWSTART, clicks FROM win",
            "SELECT k, WINDOWSTART, clicks FROM win ORDER BY k, WINDOWSTART",
        ),
    ],
)
def test_key_ordered_pages_cover_the_result_once_in_key_order(
    node: Node, ground: duckdb.DuckDBPyConnection, sql: str, ordered_like: str
) -> None:
    _, want = reference(ground, ordered_like)
    pages = all_pages(node, sql, 7)
    assert all(len(p.rows) <= 7 for p in pages)
    assert all(p.next_page_token for p in pages[:-1]) and pages[-1].next_page_token is None
    assert rows_of(pages) == [tuple(normalize(v) for v in r) for r in want]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT tag, count(*) AS c FROM w GROUP BY tag ORDER BY tag NULLS FIRST",
        "SELECT k, n FROM t ORDER BY n DESC, k",
        "SELECT t.k, w.tag FROM t JOIN w ON t.n = w.n ORDER BY t.k",
        "SELECT * FROM t WHERE k IN ('k001', 'k002', 'k004', 'k005', 'new')",
    ],
)
def test_other_statements_page_by_offset(
    node: Node, ground: duckdb.DuckDBPyConnection, sql: str
) -> None:
    pages = all_pages(node, sql, 2)
    whole = node.sql(sql)
    assert rows_of(pages) == rows_of([whole])
    _, want = reference(ground, sql)
    assert sorted(rows_of(pages), key=repr) == sorted(
        (tuple(normalize(v) for v in r) for r in want), key=repr
    )


def test_a_token_belongs_to_its_statement(node: Node) -> None:
    first = node.sql("SELECT * FROM t", page_size=5)
    assert first.next_page_token is not None
    with pytest.raises(SqlError) as caught:
        node.sql("SELECT k FROM t", page_token=first.next_page_token)
    assert caught.value.code == "bad_page_token" and caught.value.field == "page_token"
    with pytest.raises(SqlError):
        node.sql("SELECT * FROM t", page_token="sq1.garbage")
    # without page_size, a token pages with the default size
    second = node.sql("SELECT * FROM t", page_token=first.next_page_token)
    assert second.rows[0]["k"] > first.rows[-1]["k"]


def test_pages_stay_exact_while_the_table_changes(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=3)
    write_batch(changelog, 0, {f"k{i:02d}": i for i in range(40)})
    with Node(str(tmp_path), store="memory") as node:
        node.poll_once()
        engine = SqlEngine(node)
        first = engine.execute("SELECT k, n FROM t", page_size=10)
        assert [r["k"] for r in first.rows] == [f"k{i:02d}" for i in range(10)]
        # between pages: update before and after the cursor, delete and add after it
        write_batch(changelog, 1, {"k02": 200, "k15": 1500, "k20": None, "k10x": 7})
        node.poll_once()
        seen = list(first.rows)
        token = first.next_page_token
        positions = [first.position]
        while token is not None:
            page = engine.execute("SELECT k, n FROM t", page_size=10, page_token=token)
            seen += page.rows
            positions.append(page.position)
            token = page.next_page_token
        keys = [r["k"] for r in seen]
        assert len(keys) == len(set(keys))  # nothing twice
        for i in range(40):  # every key present throughout appears
            if i != 20:
                assert f"k{i:02d}" in keys
        assert "k20" not in keys and "k10x" in keys
        assert {r["k"]: r["n"] for r in seen}["k15"] == 1500  # read after the change
        assert {r["k"]: r["n"] for r in seen}["k02"] == 2  # already returned before it
        assert keys == sorted(keys)
        for earlier, later in itertools.pairwise(positions):
            assert later.dominates(earlier)


def test_each_page_honours_the_bound(node: Node) -> None:
    first = node.sql("SELECT * FROM t", page_size=50)
    again = node.sql(
        "SELECT * FROM t",
        page_size=50,
        page_token=first.next_page_token,
        bound=PositionBound.at(first.position),
    )
    assert again.position.dominates(first.position)


def test_key_pages_through_partition_fragments(
    node: Node, ground: duckdb.DuckDBPyConnection
) -> None:
    """Each partition returns its first rows after the cursor (ORDER BY __sq_key LIMIT)."""
    engine = SqlEngine(node, SqlLimits(fragment_min_rows=0))
    sql = "SELECT k, n FROM t WHERE n > 20 LIMIT 60 OFFSET 3"
    pages = [engine.execute(sql, page_size=9)]
    while pages[-1].next_page_token is not None:
        pages.append(engine.execute(sql, page_size=9, page_token=pages[-1].next_page_token))
    _, want = reference(ground, "SELECT k, n FROM t WHERE n > 20 ORDER BY k LIMIT 60 OFFSET 3")
    assert rows_of(pages) == [tuple(normalize(v) for v in r) for r in want]
    assert len(pages) == 7


def test_statements_of_one_shape_do_not_share_tokens(node: Node) -> None:
    engine = SqlEngine(node)
    first = engine.execute("SELECT k FROM t WHERE k IN ('k001', 'k002', 'k004')", page_size=1)
    other = engine.execute("SELECT k FROM t WHERE k IN ('k005', 'k008', 'k010')", page_size=1)
    assert first.next_page_token and other.next_page_token
    with pytest.raises(SqlError) as caught:
        engine.execute(
            "SELECT k FROM t WHERE k IN ('k005', 'k008', 'k010')",
            page_size=1,
            page_token=first.next_page_token,
        )
    assert caught.value.code == "bad_page_token"
    second = engine.execute(
        "SELECT k FROM t WHERE k IN ('k005', 'k008', 'k010')",
        page_size=1,
        page_token=other.next_page_token,
    )
    assert second.rows == [{"k": "k008"}]
