"""SQL fragments are routed one sub-request per node, not one per partition: the node asked
runs the fragment once over all of its partitions (``SqlFragmentQuery.combine``), and a node
that fails is replaced partition by partition, as any routed read is."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from sparkiq.testing import start_cluster, write_table

ROWS = [{"k": f"k{i:04d}", "n": i % 11, "total": float(i)} for i in range(1200)]
STATEMENTS = [
    "SELECT n, count(*) AS c, sum(total) AS s FROM t GROUP BY n",
    "SELECT k, total FROM t WHERE n = 3 AND total > 500",
    "SELECT k, total FROM t ORDER BY total DESC LIMIT 5",
]


def _truth(sql: str) -> list[tuple[object, ...]]:
    con = duckdb.connect()
    con.register("t", pa.Table.from_pylist(ROWS))
    return sorted(con.execute(sql).fetchall(), key=repr)


def _rows(answer: object) -> list[tuple[object, ...]]:
    return sorted((tuple(r.values()) for r in answer.rows), key=repr)  # type: ignore[attr-defined]


@pytest.mark.parametrize("sql", STATEMENTS)
def test_one_sub_request_per_node(tmp_path: object, sql: str) -> None:
    state_dir = str(tmp_path)
    write_table(state_dir, "t", ROWS, key="k", partitions=8)
    with start_cluster(state_dir, 2, standbys=0) as cluster:
        first = cluster[0]
        router = first.coordinator.router  # type: ignore[union-attr]
        assert _rows(first.sql(sql)) == _truth(sql)
        forwarded = router.forwarded
        assert _rows(first.sql(sql)) == _truth(sql)
        # the other node's four partitions in one sub-request (one per partition before)
        assert router.forwarded - forwarded == 1


def test_a_node_gone_mid_request_is_replaced_per_partition(tmp_path: object) -> None:
    state_dir = str(tmp_path)
    write_table(state_dir, "t", ROWS, key="k", partitions=8)
    with start_cluster(state_dir, 3, standbys=1) as cluster:
        asked = cluster[0]
        sql = STATEMENTS[0]
        assert _rows(asked.sql(sql)) == _truth(sql)
        cluster[1].stop()  # its sub-request fails: its partitions go to their standbys
        assert _rows(asked.sql(sql)) == _truth(sql)
