"""Paging: key-ordered pages never repeat or skip a key; other statements page by offset,
every page cut from the state the first page read; every page is at least as fresh as the
one before."""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

from sparkiq import Node, PositionBound
from sparkiq.sql import SqlEngine, SqlError, SqlLimits, SqlResult
from sparkiq.sql.errors import SqlPartitionError
from sparkiq.stores.history import History
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster
from tests.sql.compare import normalize, reference
from tests.sql.test_as_of import set_history


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


# --- offset pages read one state -------------------------------------------------------------

#: statements that page by offset, each with a total order (the pages' concatenation is exact)
ORDERED = [
    "SELECT k, n FROM t ORDER BY n DESC, k",
    "SELECT n % 13 AS g, count(*) AS c, sum(n) AS s FROM t GROUP BY 1 ORDER BY 1",
    "SELECT a.k, b.k AS prev FROM t a JOIN t b ON a.n = b.n + 1 ORDER BY a.k",
]
FIRST = {f"k{i:02d}": i for i in range(40)}


def model(state: dict[str, int], sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k VARCHAR, n BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?)", list(state.items()))
    return con.execute(sql).fetchall()


def move(changelog: Any, batch_id: int) -> None:
    """Rows jump ahead of any cursor and behind it, one goes, one comes."""
    write_batch(
        changelog,
        batch_id,
        {f"k{batch_id:02d}": 1000 + batch_id, f"k{39 - batch_id:02d}": None, f"new{batch_id}": -1},
    )


def page_while_moving(
    sql: str, changelog: Any, nodes: list[Node], run: Callable[..., SqlResult]
) -> list[SqlResult]:
    pages = [run(sql, page_size=4)]
    while pages[-1].next_page_token is not None:
        move(changelog, len(pages))
        for node in nodes:
            node.poll_once()
        pages.append(run(sql, page_size=4, page_token=pages[-1].next_page_token))
        assert len(pages) < 100
    return pages


@pytest.mark.parametrize("path", ["whole tables", "per partition"])
@pytest.mark.parametrize("sql", ORDERED)
def test_offset_pages_are_the_first_pages_state_while_the_table_moves(
    tmp_path: Path, sql: str, path: str
) -> None:
    changelog = make_table(str(tmp_path), partitions=3)
    write_batch(changelog, 0, FIRST)
    with Node(str(tmp_path), store="memory") as node:
        node.poll_once()
        # node.sql reads whole tables as Arrow where it hosts them; an engine over the Node's
        # public API reads each partition through a fragment
        run = node.sql if path == "whole tables" else SqlEngine(node).execute
        pages = page_while_moving(sql, changelog, [node], run)
        assert len(pages) > 3  # the table moved between every two pages
        got = [tuple(r[c] for c in pages[0].columns) for p in pages for r in p.rows]
        assert got == model(FIRST, sql)  # nothing twice, nothing skipped, batch 0's values
        for page in pages:
            assert set(page.position.to_map()["t"].values()) == {0}
        # the table did move: the statement run afresh reads the newest batch
        fresh = node.sql(sql)
        assert set(fresh.position.to_map()["t"].values()) == {len(pages) - 1}


@pytest.mark.parametrize("sql", ORDERED[::2])
def test_offset_pages_through_partition_fragments_on_other_nodes(tmp_path: Path, sql: str) -> None:
    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, FIRST)
    nodes = start_http_cluster(str(tmp_path), 2, standbys=0)
    try:
        # n1 hosts half the partitions: the other half is read on n0 as fragments
        pages = page_while_moving(sql, changelog, nodes, nodes[1].sql)
        got = [tuple(r[c] for c in pages[0].columns) for p in pages for r in p.rows]
        assert got == model(FIRST, sql)
    finally:
        for node in reversed(nodes):
            node.stop()


def test_an_offset_page_whose_batch_left_the_history_names_the_oldest(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=3)
    set_history(str(tmp_path), History(batches=2))
    write_batch(changelog, 0, FIRST)
    with Node(str(tmp_path), store="memory") as node:
        node.poll_once()
        sql = "SELECT k, n FROM t ORDER BY n DESC, k"
        first = node.sql(sql, page_size=10)
        for batch_id in (1, 2, 3):
            move(changelog, batch_id)
            node.poll_once()
        with pytest.raises(SqlPartitionError, match="oldest batch still readable is 1"):
            node.sql(sql, page_size=10, page_token=first.next_page_token)
        # a token of a node that did not pin (no "b") pages over the newest state
        assert first.next_page_token is not None
        unpinned = without_batches(first.next_page_token)
        rest = node.sql(sql, page_size=100, page_token=unpinned)
        assert set(rest.position.to_map()["t"].values()) == {3}


def without_batches(token: str) -> str:
    """``token`` as a node before pinning wrote it: its fields without ``b``."""
    body = token[len("sq1.") :]
    doc = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert doc.pop("b") == {"t": 0}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return "sq1." + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
