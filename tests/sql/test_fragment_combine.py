"""A node answering one SQL fragment for several partitions runs its statement once over
all their rows (``SqlFragmentQuery.combine``), and the answer is the same as per partition."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq import Node, StateQueryRequest
from sparkiq.sql import SqlEngine, SqlLimits
from sparkiq.sql.fragment import SqlFragmentQuery
from sparkiq.testing import temporary_state_dir, write_table

ROWS = [{"k": f"k{i:03d}", "n": i % 7, "total": i * 1.5} for i in range(200)]
COUNT = "SELECT n, count(*) AS c, sum(total) AS s FROM __sq_part GROUP BY n"


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with temporary_state_dir() as state_dir:
        writer = write_table(state_dir, "t", ROWS[:150], key="k", partitions=4)
        writer.write(ROWS[150:], deletes=["k000", "k001"])  # a second batch, with deletes
        node = Node(state_dir, node_id="combine").start()
        try:
            assert node.wait_for("t", 1, timeout=60)
            yield node
        finally:
            node.stop()


def _answers(node: Node, query: SqlFragmentQuery) -> dict[int, list[dict[str, object]]]:
    result = node.query(StateQueryRequest.in_store("t").with_query(query))
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
