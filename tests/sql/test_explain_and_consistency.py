"""EXPLAIN shows the path; answers carry positions; failed partitions refuse the statement."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from sparkiq import FailureReason, Node, Position, PositionBound, StateQueryRequest
from sparkiq.sql import SqlEngine, SqlFragmentQuery, SqlPartitionError, SqlUnsupportedError
from sparkiq.wire.protocol import decode_request, encode_request
from tests.changelog.helpers import make_table, write_batch


def explain(node: Node, sql: str) -> dict:  # type: ignore[type-arg]
    result = node.sql(f"EXPLAIN {sql}")
    assert result.columns == ["property", "value"]
    assert {"property": "tier", "value": str(result.explain["tier"])} in result.rows  # type: ignore[index]
    assert result.explain is not None
    return result.explain


def test_a_key_lookup_is_tier_0_on_one_partition_in_python(node: Node) -> None:
    plan = explain(node, "SELECT * FROM t WHERE k = 'k001'")
    assert (plan["tier"], plan["path"], plan["duckdb"]) == (0, "python", False)
    table = plan["tables"][0]
    assert table["access"] == "key_lookup"
    assert table["partitions"] == [node.partition_for_key("t", "k001")]
    assert plan["final_sql"] is None and table["fragment_sql"] is None
    expression = explain(node, "SELECT n + 1 FROM t WHERE k = 'k001'")
    assert (expression["tier"], expression["path"]) == (0, "duckdb")


def test_ranges_and_key_sets_are_tier_1_with_pushed_bounds(node: Node) -> None:
    pure = explain(node, "SELECT * FROM t WHERE k >= 'k010' AND k < 'k020'")
    assert (pure["tier"], pure["path"]) == (1, "python")
    assert pure["tables"][0]["access"] == "range_query"  # RangeQuery, exclusive end re-checked
    plan = explain(node, "SELECT * FROM t WHERE k >= 'k010' AND k < 'k020' AND n > 3")
    table = plan["tables"][0]
    assert plan["tier"] == 1 and table["access"] == "key_range"
    assert table["key_range"]["lower"] and table["key_range"]["upper_exclusive"]
    assert "k >= 'k010'" in table["pushed_predicate"]
    assert "__sq_part" in table["fragment_sql"] and "WHERE" in table["fragment_sql"]
    multi = explain(node, "SELECT * FROM ck WHERE region IN ('eu', 'us') AND id = 3")
    assert multi["tier"] == 1 and multi["path"] == "python"
    assert multi["tables"][0]["keys"] == ["('eu', 3)", "('us', 3)"]
    prefix = explain(node, "SELECT * FROM ck WHERE region = 'eu'")
    assert prefix["tables"][0]["access"] == "key_range"
    window = explain(node, "SELECT k FROM win WHERE WINDOWSTART >= '2024-03-01 10:00:00'")
    assert window["tier"] == 1 and window["tables"][0]["window_start"]["from"] is not None


def test_scans_aggregates_and_joins_say_what_runs_where(node: Node) -> None:
    scan = explain(node, "SELECT k FROM w WHERE tag = 'red' ORDER BY price DESC LIMIT 3")
    assert scan["tier"] == 2 and scan["tables"][0]["access"] == "full_scan"
    assert scan["tables"][0]["top_n_pushed"] and "LIMIT 3" in scan["tables"][0]["fragment_sql"]
    assert scan["tables"][0]["columns"] == ["k", "tag", "price"]
    agg = explain(node, "SELECT tag, avg(price) FROM w GROUP BY tag")
    assert (agg["tier"], agg["aggregation"]) == (3, "partial")
    assert "SUM(price)" in agg["tables"][0]["fragment_sql"]
    assert "COUNT(price)" in agg["tables"][0]["fragment_sql"]
    distinct = explain(node, "SELECT count(DISTINCT tag) FROM w")
    assert distinct["aggregation"] == "rows"
    join = explain(node, "SELECT t.k FROM t JOIN ik ON t.n = ik.key WHERE ik.key < 5")
    assert join["tier"] == 4 and join["duckdb"]
    assert join["tables"][1]["access"] == "key_range"
    assert join["tables"][0]["pushed_predicate"] is None


def test_answers_carry_the_merged_position_of_the_partitions_read(node: Node) -> None:
    lookup = node.sql("SELECT * FROM t WHERE k = 'k001'")
    direct = node.query(
        StateQueryRequest.in_store("t").with_query(__import__("sparkiq").KeyQuery.with_key("k001"))
    ).position
    assert lookup.position == direct
    scan = node.sql("SELECT count(*) FROM t")
    assert scan.position == node.position("t")
    assert set(scan.position.partition_offsets("t")) == {0, 1, 2, 3}


def test_a_partition_behind_the_bound_refuses_the_statement(node: Node) -> None:
    ahead = PositionBound.at(Position.from_map({"t": {0: 99}}))
    with pytest.raises(SqlPartitionError) as caught:
        node.sql("SELECT count(*) FROM t", bound=ahead)
    assert caught.value.reason == FailureReason.NOT_UP_TO_BOUND.name
    assert caught.value.partition is not None and caught.value.store == "t"
    assert "NOT_UP_TO_BOUND" in caught.value.message
    with pytest.raises(SqlPartitionError):
        node.sql("SELECT * FROM t WHERE k = 'k001'", bound=ahead)
    current = PositionBound.at(node.position("t"))
    assert node.sql("SELECT count(*) AS c FROM t", bound=current).rows == [{"c": 172}]


def test_read_your_writes_with_a_position_bound(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1, "b": 2})
    with Node(str(tmp_path), store="memory", poll_interval=60) as node:
        node.poll_once()
        first = node.sql("SELECT sum(n) AS s FROM t")
        assert first.rows == [{"s": 3}]
        write_batch(changelog, 1, {"a": 10})
        wanted = PositionBound.at(Position.from_map({"t": {0: 1}}))
        with pytest.raises(SqlPartitionError):
            node.sql("SELECT sum(n) AS s FROM t", bound=wanted)
        node.poll_once()
        after = node.sql("SELECT sum(n) AS s FROM t", bound=wanted)
        assert after.rows == [{"s": 12}] and after.position.dominates(first.position)


def test_a_partition_not_hosted_is_an_error_not_missing_rows(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=4)
    write_batch(changelog, 0, {f"k{i}": i for i in range(40)})
    with Node(str(tmp_path), store="memory", partitions={"t": [0, 1]}) as node:
        node.poll_once()
        with pytest.raises(SqlPartitionError) as caught:
            node.sql("SELECT count(*) FROM t")
        assert caught.value.reason == "NOT_PRESENT" and caught.value.partition in (2, 3)
        hosted = next(f"k{i}" for i in range(40) if node.partition_for_key("t", f"k{i}") < 2)
        assert node.sql(f"SELECT n FROM t WHERE k = '{hosted}'").rows == [{"n": int(hosted[1:])}]


def test_fragments_travel_on_the_wire_and_answer_arrow(node: Node) -> None:
    query = SqlFragmentQuery(("k", "n"), "SELECT k FROM __sq_part WHERE n > 100", None, None)
    request = StateQueryRequest.in_store("t").with_query(query)
    decoded, _ = decode_request(encode_request(request))
    assert decoded.query == query
    result = node.query(decoded)
    tables = [r.result for r in result.partition_results.values()]
    assert all(isinstance(t, pa.Table) for t in tables)
    total = sum(t.num_rows for t in tables)
    assert total == node.sql("SELECT count(*) AS c FROM t WHERE n > 100").rows[0]["c"]
    assert result.position == node.position("t")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t",
        "SELECT * FROM read_csv('/etc/passwd')",
        "COPY (SELECT 1) TO '/tmp/x.csv'",
        "SELECT * FROM __sq_part, w",
    ],
)
def test_a_node_never_trusts_fragment_sql(node: Node, sql: str) -> None:
    query = SqlFragmentQuery(("k", "n"), sql)
    with pytest.raises(SqlUnsupportedError):
        node.query(StateQueryRequest.in_store("t").with_query(query))


def test_engines_are_independent_and_reusable(node: Node) -> None:
    engine = SqlEngine(node)
    for _ in range(3):
        assert engine.execute("SELECT k FROM t WHERE k = 'new'").rows == [{"k": "new"}]
    assert engine.execute("SELECT k FROM t WHERE k = 'k003'").rows == [{"k": "k003"}]


def test_comments_and_statements_without_tables(node: Node) -> None:
    plan = node.sql("-- the plan, please\n/* twice */ EXPLAIN SELECT * FROM t WHERE k = 'k001'")
    assert plan.explain is not None and plan.explain["tier"] == 0
    assert node.sql("SELECT 1 AS one, 2 + 3 AS five").rows == [{"one": 1, "five": 5}]
    bare = node.sql("EXPLAIN SELECT 1").explain
    assert bare is not None and bare["tables"] == []
    assert bare["final_sql"] == 'SELECT 1 AS "?column?"'  # Postgres' name (sparkiq.sql.names)
