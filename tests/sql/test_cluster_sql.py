"""The same SQL gives the same answers from one node and from a three-node cluster, where
fragments run on the nodes hosting each partition and travel back over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from sparkiq import Client, Node
from sparkiq.sql import SqlEngine, SqlLimits
from tests.cluster.cluster_helpers import start_http_cluster
from tests.sql.compare import assert_same, normalize, reference
from tests.sql.tables import Truth
from tests.sql.test_differential import QUERIES


@pytest.fixture(scope="module")
def cluster(world_dir: tuple[str, Truth]) -> Iterator[list[Node]]:
    nodes = start_http_cluster(world_dir[0], 3)
    yield nodes
    for node in reversed(nodes):
        node.stop()


@pytest.mark.parametrize(("sql", "ordered"), QUERIES, ids=[q for q, _ in QUERIES])
def test_three_nodes_answer_like_one(
    cluster: list[Node],
    node: Node,
    ground: duckdb.DuckDBPyConnection,
    sql: str,
    ordered: bool,
) -> None:
    names, rows = reference(ground, sql)
    single = node.sql(sql)
    assert_same(single, names, rows, ordered)
    for i, member in enumerate(cluster):
        # every partition's fragment runs wherever the partition is hosted
        clustered = SqlEngine(member, SqlLimits(fragment_min_rows=0)).execute(sql)
        assert_same(clustered, names, rows, ordered)
        if i == 0:
            assert clustered.columns == single.columns


def test_client_sql_over_http_keeps_types_and_positions(cluster: list[Node], node: Node) -> None:
    with Client(cluster[2].url) as client:
        for sql, ordered in QUERIES[::4]:
            local = node.sql(sql)
            remote = client.sql(sql)
            assert remote.columns == local.columns
            got = [tuple(normalize(r[c]) for c in remote.columns) for r in remote.rows]
            want = [tuple(normalize(r[c]) for c in local.columns) for r in local.rows]
            if not ordered:
                got, want = sorted(got, key=repr), sorted(want, key=repr)
            assert got == want  # dates, timestamps and decimals arrive as Python types
            if local.rows:
                assert not remote.position.is_empty()
        answer = client.sql("SELECT * FROM t WHERE k = 'k001'")
        again = client.sql("SELECT * FROM t WHERE k = 'k002'", bound=answer.position)
        assert again.rows[0]["k"] == "k002"
