"""A node answering one SQL fragment for several partitions runs its statement once over
all their rows (``SqlFragmentQuery.combine``), and the answer is the same as per partition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from sparkiq import Node, StateQueryRequest
from sparkiq.sql import SqlEngine, SqlLimits
from sparkiq.sql.duck import DuckPool
from sparkiq.sql.fragment import SqlFragmentQuery, _Candidates, _run_over
from sparkiq.testing import temporary_state_dir, write_table

ROWS = [{"k": f"k{i:03d}", "n": i % 7, "total": i * 1.5} for i in range(200)]
COUNT = "SELECT n, count(*) AS c, sum(total) AS s FROM __sq_part GROUP BY n"
# Table "u", three batches: rows, then half of them updated and new ones, then deletes.
# Its versions then hold superseded rows a whole-partition read must leave out.
U_BATCHES: list[tuple[list[dict[str, Any]], list[str]]] = [
    ([{"k": f"u{i:03d}", "n": i % 5, "total": float(i)} for i in range(120)], []),
    ([{"k": f"u{i:03d}", "n": 10 + i % 3, "total": i + 0.5} for i in range(0, 160, 2)], []),
    ([], [f"u{i:03d}" for i in range(0, 120, 3)]),
]

# Table "m": one partition, a new key a batch, enough batches that its chunks are merged
# into one, which then holds rows of batches after any but the newest.
MERGED_BATCHES = 60


def _u_at(batch: int) -> dict[str, dict[str, Any]]:
    """Ground truth: table ``u`` after ``batch``, by key."""
    rows: dict[str, dict[str, Any]] = {}
    for upserts, deletes in U_BATCHES[: batch + 1]:
        rows.update((row["k"], row) for row in upserts)
        for key in deletes:
            rows.pop(key, None)
    return rows


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with temporary_state_dir() as state_dir:
        writer = write_table(state_dir, "t", ROWS[:150], key="k", partitions=4)
        writer.write(ROWS[150:], deletes=["k000", "k001"])  # a second batch, with deletes
        (first, _), *later = U_BATCHES
        u = write_table(state_dir, "u", first, key="k", partitions=4)
        for upserts, deletes in later:
            u.write(upserts, deletes=deletes)
        m = write_table(
            state_dir, "m", [{"k": "m000", "n": 0, "total": 0.0}], key="k", partitions=1
        )
        for batch in range(1, MERGED_BATCHES):  # more chunks than a partition keeps apart
            m.write([{"k": f"m{batch:03d}", "n": batch, "total": float(batch)}])
        node = Node(state_dir, node_id="combine").start()
        try:
            assert node.wait_for("t", 1, timeout=60)
            assert node.wait_for("u", 2, timeout=60)
            assert node.wait_for("m", MERGED_BATCHES - 1, timeout=60)
            yield node
        finally:
            node.stop()


def _answers(
    node: Node, query: SqlFragmentQuery, table: str = "t", batch: int | None = None
) -> dict[int, list[dict[str, object]]]:
    request = StateQueryRequest.in_store(table).with_query(query)
    result = node.query(request if batch is None else request.as_of(batch))
    answers = {}
    for partition, answer in result.partition_results.items():
        assert answer.is_success, answer.failure_message
        answers[partition] = answer.result.to_pylist()
    return answers


def _merged(answers: dict[int, list[dict[str, object]]]) -> dict[object, tuple[int, float]]:
    merged: dict[object, tuple[int, float]] = {}
    for rows in answers.values():
        for row in rows:
            count, total = merged.get(row["n"], (0, 0.0))
            merged[row["n"]] = (count + row["c"], total + row["s"])  # type: ignore[operator]
    return merged


def test_one_run_for_every_partition_of_the_node(node: Node) -> None:
    combined = _answers(node, SqlFragmentQuery(("n", "total"), COUNT, combine=True))
    apart = _answers(node, SqlFragmentQuery(("n", "total"), COUNT))
    assert sorted(combined) == sorted(apart) == [0, 1, 2, 3]
    # combined: the first partition holds the whole partial aggregate, the others no rows
    assert [len(rows) for rows in combined.values()] == [7, 0, 0, 0]
    assert all(len(rows) == 7 for rows in apart.values())
    want: dict[object, tuple[int, float]] = {}
    for row in ROWS[2:]:  # ground truth: the rows left after the second batch
        count, total = want.get(row["n"], (0, 0.0))
        want[row["n"]] = (count + 1, total + row["total"])  # type: ignore[operator]
    assert _merged(combined) == _merged(apart) == want


def test_combined_answer_keeps_each_partitions_position(node: Node) -> None:
    query = SqlFragmentQuery(("n", "total"), COUNT, combine=True)
    result = node.query(StateQueryRequest.in_store("t").with_query(query))
    for partition, answer in result.partition_results.items():
        assert answer.position.to_map()["t"][partition] == 1


class _FragmentsOnly:
    """The node as a plain query source: statements read every partition through
    fragments, as a cluster does for partitions hosted elsewhere."""

    def __init__(self, source: Any) -> None:
        self.tables = source.tables
        self.schema = source.schema
        self.partition_count = source.partition_count
        self.query = source.query


def test_statements_through_fragments_agree(node: Node) -> None:
    engine = SqlEngine(_FragmentsOnly(node._lookup), SqlLimits(fragment_min_rows=0))  # type: ignore[arg-type]
    statement = "SELECT n, count(*) AS c FROM t WHERE total > 30 GROUP BY n ORDER BY n"
    want = [(n, sum(1 for r in ROWS[2:] if r["n"] == n and r["total"] > 30)) for n in range(7)]
    for answer in (engine.execute(statement), node.sql(statement)):
        assert [(r["n"], r["c"]) for r in answer.rows] == want
    top = engine.execute("SELECT k FROM t ORDER BY total DESC LIMIT 3").rows
    assert [r["k"] for r in top] == ["k199", "k198", "k197"]
    assert engine.execute("SELECT count(*) AS c FROM t WHERE n = 3").rows == [
        {"c": sum(1 for r in ROWS[2:] if r["n"] == 3)}
    ]


@pytest.mark.parametrize("batch", [0, 1, 2])
def test_whole_partitions_read_at_a_batch_keep_only_its_rows(node: Node, batch: int) -> None:
    """A whole partition read by a fragment's SQL reads its version's chunks unfiltered,
    which hold every batch's rows: the statement must see those of the batch it reads, as
    the rows-only answer (filtered in Arrow) does."""
    truth = _u_at(batch)
    rows_sql = "SELECT k, n, total FROM __sq_part"
    count = "SELECT n, count(*) AS c, sum(total) AS s FROM __sq_part GROUP BY n"
    want_count: dict[object, tuple[int, float]] = {}
    for row in truth.values():
        c, total = want_count.get(row["n"], (0, 0.0))
        want_count[row["n"]] = (c + 1, total + row["total"])
    columns = ("k", "n", "total")
    for combine in (True, False):
        for sql in (None, rows_sql):
            answers = _answers(node, SqlFragmentQuery(columns, sql, combine=combine), "u", batch)
            got = {row["k"]: row for rows in answers.values() for row in rows}
            assert got == truth, (combine, sql)
        answers = _answers(
            node, SqlFragmentQuery(("n", "total"), count, combine=combine), "u", batch
        )
        assert _merged(answers) == want_count, combine
    top = "SELECT k FROM __sq_part ORDER BY total DESC, k LIMIT 3"
    answers = _answers(node, SqlFragmentQuery(("k", "total"), top, combine=True), "u", batch)
    got_top = sorted(
        (row["k"] for rows in answers.values() for row in rows),
        key=lambda k: (-truth[k]["total"], k),  # type: ignore[index]
    )[:3]
    want_top = sorted(truth, key=lambda k: (-truth[k]["total"], k))[:3]
    assert got_top == want_top


def test_one_run_over_partitions_read_at_different_batches(node: Node) -> None:
    """The combined run over partitions read at different batches (one relation per batch)
    and over rows already filtered (a partition read by key range) answers what running
    the statement over each partition's filtered rows answers."""
    stores = {p: r.store for p, r in node.replica("u").partitions.items()}
    columns = ("k", "n", "total")
    parts = [
        _Candidates(stores[0].version(0).raw(), 0),
        _Candidates(stores[1].version(2).raw(), 2, newest=True),  # only valid_to compared
        _Candidates(stores[2].version(1).raw(), 1),
        stores[3].version(2).table(columns),
    ]
    query = SqlFragmentQuery(
        columns, "SELECT n, count(*) AS c FROM __sq_part GROUP BY n ORDER BY n"
    )
    pool = DuckPool(threads=1)
    try:
        got = _run_over(query, parts, SqlLimits(), pool)
    finally:
        pool.close()
    visible = [p.visible(columns) if isinstance(p, _Candidates) else p for p in parts]
    counts: dict[int, int] = {}
    for n in pa.concat_tables(visible).column("n").to_pylist():
        counts[n] = counts.get(n, 0) + 1
    assert got.to_pylist() == [{"n": n, "c": c} for n, c in sorted(counts.items())]
    # the later versions hold rows of other batches: a filter at a wrong batch counts them
    assert all(v.num_rows < p.raw.num_rows for v, p in zip(visible[1:3], parts[1:3], strict=True))


@pytest.mark.parametrize("batch", [3, 40, MERGED_BATCHES - 1])
def test_merged_chunks_read_at_an_older_batch(node: Node, batch: int) -> None:
    """Merged chunks hold rows of later batches than the one read: those are left out
    (only a read at the newest batch may skip comparing when a row became valid)."""
    (store,) = [r.store for r in node.replica("m").partitions.values()]
    held = store.version(batch).raw().num_rows
    # below the newest batch, the merged chunk holds rows of later batches
    assert held > batch + 1 if batch < MERGED_BATCHES - 1 else held == MERGED_BATCHES
    count = "SELECT count(*) AS c, max(n) AS top FROM __sq_part"
    for combine in (True, False):
        query = SqlFragmentQuery(("n",), count, combine=combine)
        rows = [row for rows in _answers(node, query, "m", batch).values() for row in rows]
        assert sum(row["c"] for row in rows) == batch + 1, combine  # type: ignore[misc]
        assert max(row["top"] for row in rows if row["top"] is not None) == batch  # type: ignore[type-var]
