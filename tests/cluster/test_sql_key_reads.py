"""SQL key lookups inside larger statements, in a two-node cluster: the keys of a table
reference travel in one request, each node answers its partitions' keys as Arrow, and a
partial aggregate over them runs where the partitions are.

Each partition lives on one node only (no standbys), so every routed sub-request is visible
in the router's count of requests forwarded to the other node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from sparkiq import Node, StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.sql import SqlEngine, SqlFragmentQuery
from sparkiq.testing import LocalCluster, start_cluster, write_table

ROWS = [
    {"k": f"u{i:03d}", "n": i * 7 % 50, "region": ["eu", "us", "apac"][i % 3]} for i in range(80)
]
REGIONS = [{"region": "eu", "name": "Europe"}, {"region": "us", "name": "Americas"}]
KEYS = [f"u{i:03d}" for i in range(0, 80, 4)]  # 20 keys
IN = ", ".join(f"'{k}'" for k in [*KEYS, "nope"])
STATEMENTS = [
    f"SELECT region, count(*) AS c, sum(n) AS s, max(k) AS hi FROM t WHERE k IN ({IN}) "
    "GROUP BY region",
    f"SELECT t.k, t.n, r.name FROM t JOIN regions AS r ON t.region = r.region WHERE t.k IN ({IN})",
    f"SELECT count(*) AS c, sum(n * 2) AS s FROM t WHERE k IN ({IN})",
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    state_dir = str(tmp_path_factory.mktemp("sqlkeys"))
    write_table(state_dir, "t", ROWS, key="k", partitions=2)
    write_table(state_dir, "regions", REGIONS, key="region", partitions=2)
    with start_cluster(state_dir, 2, standbys=0) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def ground() -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    con.register("t", pa.Table.from_pylist(ROWS))
    con.register("regions", pa.Table.from_pylist(REGIONS))
    yield con
    con.close()


class Counting:
    """A node as the engine's source, counting the requests the engine sends it."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.requests: list[StateQueryRequest] = []
        self.tables = node.tables

    def schema(self, store: str) -> Any:
        return self.node.schema(store)

    def partition_count(self, store: str) -> int:
        return self.node.partition_count(store)

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        self.requests.append(request)
        return self.node.query(request)


def _sorted(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


@pytest.mark.parametrize("sql", STATEMENTS)
def test_every_node_answers_key_lookups_like_duckdb(
    cluster: LocalCluster, ground: duckdb.DuckDBPyConnection, sql: str
) -> None:
    want = _sorted(ground.execute(sql).fetchall())
    for node in cluster:
        got = node.sql(sql)
        assert _sorted([tuple(r.values()) for r in got.rows]) == want
        # one batch of t for both partitions, wherever each was read
        assert set(got.position.to_map()["t"]) == {0, 1}


def test_a_routed_multi_key_lookup_sends_one_request_per_node(cluster: LocalCluster) -> None:
    """20 keys in both partitions, one on each node: the engine sends one request for the
    table, and the node it reaches forwards one sub-request to the other node (the old
    path sent a KeyQuery per key), whose partition runs the partial aggregate itself."""
    first = cluster[0]
    remote = [k for k in KEYS if first.local_lookup("t", k) is None]
    assert remote and len(remote) < len(KEYS), "each node should hold one partition of t"
    router = first.coordinator.router  # type: ignore[union-attr]
    source = Counting(first)
    engine = SqlEngine(source)  # type: ignore[arg-type]
    engine.execute(STATEMENTS[0])  # planned (and its dry run done) before counting
    source.requests.clear()
    forwarded = router.forwarded
    got = engine.execute(STATEMENTS[0])
    assert router.forwarded - forwarded == 1
    assert len(source.requests) == 1
    (request,) = source.requests
    assert isinstance(request.query, SqlFragmentQuery)
    assert request.query.keys is not None and len(request.query.keys) == len(KEYS) + 1
    assert request.query.sql is not None  # the partial aggregate, run by each partition
    assert request.partitions == frozenset({0, 1})
    want = {
        region: sum(1 for r in ROWS if r["k"] in KEYS and r["region"] == region)
        for region in ("eu", "us", "apac")
    }
    assert {r["region"]: r["c"] for r in got.rows} == want
