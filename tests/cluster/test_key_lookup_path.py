"""Every key-lookup entry point takes one path, with the handler registry's rules.

``Node.get``, ``get_with_position``, ``local_lookup``, the REST ``GET /stores/{s}/keys/{k}``
and a routed lookup (the key's partition on another node) all refuse a plain key lookup on a
windowed table the way a ``KeyQuery`` does, and all use a ``KeyQuery`` handler a user
registered in place of the built-in one.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkiq import (
    InvalidQueryError,
    KeyQuery,
    Node,
    QueryContext,
    QueryResult,
    StateQueryRequest,
    register,
)
from sparkiq.stores.dispatch import handler_for
from sparkiq.stores.partition import PartitionStore
from sparkiq.testing import write_table
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster
from tests.sql.tables import WINDOW_TYPE

WIN = pa.schema([("k", pa.string()), ("window", WINDOW_TYPE), ("clicks", pa.int64())])
KEYS = [f"u{i}" for i in range(12)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    state_dir = str(tmp_path_factory.mktemp("lookup"))
    start = dt.datetime(2024, 1, 1, 12, 0)
    rows = [
        {"k": k, "window": {"start": start, "end": start + dt.timedelta(minutes=5)}, "clicks": i}
        for i, k in enumerate(KEYS)
    ]
    write_table(state_dir, "win", rows, key="k", window="window", schema=WIN)
    write_batch(make_table(state_dir, partitions=4), 0, {k: i for i, k in enumerate(KEYS)})
    nodes = start_http_cluster(state_dir, 2, standbys=0)  # each partition on one node only
    yield nodes
    for node in reversed(nodes):
        node.stop()


def _split(nodes: list[Node], table: str) -> tuple[str, str]:
    """A key the first node hosts and one only the second node hosts."""
    first = nodes[0]
    here = [k for k in KEYS if first.local_lookup(table, k) is not None]
    there = [k for k in KEYS if first.local_lookup(table, k) is None]
    assert here and there, "the two nodes should share the partitions"
    return here[0], there[0]


def test_a_windowed_table_refuses_key_lookups_on_every_path(cluster: list[Node]) -> None:
    first = cluster[0]
    for key in KEYS:  # read here and routed: the same refusal, never a missing row
        for lookup in (first.get, first.get_with_position, first.local_lookup):
            with pytest.raises(InvalidQueryError, match="'win' is windowed") as caught:
                lookup("win", key)
            assert f"SELECT * FROM win WHERE k = '{key}'" in caught.value.message
        for node in cluster:
            response = http_calls.get(f"{node.url}/stores/win/keys/{key}", timeout=10)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "invalid_query"
            # the statement and the REST body to use instead, not a Python class
            assert f"SELECT * FROM win WHERE k = '{key}'" in error["message"]
            body = f'{{"query": {{"type": "window_key", "key": "{key}", "from": null'
            assert f"POST /stores/win/query with {body}" in error["message"]


def test_a_plain_table_answers_on_every_path(cluster: list[Node]) -> None:
    first = cluster[0]
    local_key, remote_key = _split(cluster, "t")
    assert first.local_lookup("t", remote_key) is None
    for key in (local_key, remote_key):
        expected = {"k": key, "n": KEYS.index(key)}
        assert first.get("t", key) == expected
        row, position = first.get_with_position("t", key)
        assert row == expected and position.to_map()["t"] == {first.partition_for_key("t", key): 0}
        answer = http_calls.get(f"{first.url}/stores/t/keys/{key}", timeout=10).json()
        assert answer["row"] == expected and answer["partition"] == first.partition_for_key(
            "t", key
        )


def test_a_registered_key_handler_serves_every_local_path(tmp_path: Path) -> None:
    changelog = make_table(str(tmp_path), partitions=2)
    write_batch(changelog, 0, {"a": 1, "b": 2})
    builtin = handler_for(PartitionStore, KeyQuery)
    assert builtin is not None

    def doubled(store: PartitionStore, query: KeyQuery, ctx: QueryContext) -> QueryResult[Any]:
        answer = builtin(store, query, ctx)
        row = answer.result
        return QueryResult.for_result(
            None if row is None else row | {"n": row["n"] * 2}, answer.position
        )

    with Node(str(tmp_path)) as node:
        node.poll_once()
        assert node.get("t", "a") == {"k": "a", "n": 1}
        register(KeyQuery)(doubled)
        try:
            assert node.get("t", "a") == {"k": "a", "n": 2}
            assert node.get_with_position("t", "b")[0] == {"k": "b", "n": 4}
            found = node.local_lookup("t", "b")
            assert found is not None and found[0] == {"k": "b", "n": 4}
            request = StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("a"))
            assert node.query(request).only_partition_result().result == {"k": "a", "n": 2}
        finally:
            register(KeyQuery)(builtin)
        assert node.get("t", "a") == {"k": "a", "n": 1}


def test_a_routed_key_is_located_once_per_request(
    cluster: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key's partition is computed once per request on every path, and the location
    travels (to the read, the router and the sub-request) instead of being computed again."""
    from sparkiq.schema.partitioner import Partitioner

    calls: list[int] = []
    partition_of = Partitioner.__call__

    def counted(self: Partitioner, key: Any) -> int:
        calls.append(1)
        return partition_of(self, key)

    monkeypatch.setattr(Partitioner, "__call__", counted)
    first = cluster[0]
    _, there = _split(cluster, "t")
    calls.clear()
    paths = {
        "get": lambda: first.get("t", there),
        "query": lambda: first.query(
            StateQueryRequest.in_store("t").with_query(KeyQuery.with_key(there))
        ),
        "rest": lambda: http_calls.get(
            f"{first.url}/stores/t/keys/{there}", timeout=30
        ).raise_for_status(),
        "sql": lambda: first.sql(f"SELECT * FROM t WHERE k = '{there}'"),
    }
    counts = {}
    for name, call in paths.items():
        calls.clear()
        call()
        counts[name] = len(calls)
    assert counts == {"get": 1, "query": 1, "rest": 1, "sql": 1}
