"""Clusters of nodes in one process: assignment, routing, standbys, bounds, handoffs.

Nodes talk over real HTTP on 127.0.0.1 (and, for the transport contract, in-process);
answers are compared with the ground truth the changelog was written from."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sparkiq import (
    FailureReason,
    KeyQuery,
    Node,
    Position,
    PositionBound,
    RangeQuery,
    ResultOrder,
    StateQueryRequest,
)
from sparkiq.cluster.assignment import Assignment, rendezvous_order
from tests.changelog.helpers import expected_rows, make_table, write_batch
from tests.cluster.cluster_helpers import (
    settle,
    start_http_cluster,
    start_local_cluster,
    wait_until,
)

HISTORY: list[dict[str, int | None]] = [
    {f"k{i:03d}": i for i in range(200)},
    {f"k{i:03d}": i * 10 for i in range(0, 200, 3)},
    {f"k{i:03d}": None for i in range(0, 200, 7)} | {"new": 1},
]


def all_rows(node: Node, request: StateQueryRequest) -> list[tuple[Any, dict[str, Any]]]:
    result = node.query(request)
    rows = []
    for partition_result in result.partition_results.values():
        assert partition_result.is_success, partition_result
        rows.extend(partition_result.result)
    return rows


@pytest.fixture(params=["http", "local"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    changelog = make_table(str(tmp_path), partitions=8)
    for batch_id, rows in enumerate(HISTORY):
        write_batch(changelog, batch_id, rows)
    start = start_http_cluster if request.param == "http" else start_local_cluster
    nodes = start(str(tmp_path), 3)
    yield nodes
    for node in reversed(nodes):
        node.stop()


def test_rendezvous_is_deterministic_and_moves_little() -> None:
    three = Assignment(("a", "b", "c"), standbys=1)
    four = Assignment(("a", "b", "c", "d"), standbys=1)
    moved = sum(three.active("t", p) != four.active("t", p) for p in range(1000))
    assert 150 < moved < 350  # about a quarter of the partitions move to the new member
    for p in range(1000):
        replicas = three.replicas("t", p)
        assert len(replicas) == 2 and len(set(replicas)) == 2
        assert list(replicas) == rendezvous_order(["c", "a", "b"], "t", p)[:2]
        if four.active("t", p) != three.active("t", p):
            assert four.active("t", p) == "d"  # only the newcomer takes partitions


def test_every_node_answers_every_key_and_range(cluster: list[Node]) -> None:
    expected = expected_rows(HISTORY)
    for node in cluster:
        for i in range(200):
            key = f"k{i:03d}"
            assert node.get("t", key) == expected.get(key)
        rows = all_rows(
            node, StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
        )
        assert dict(rows) == expected
        ranged = all_rows(
            node,
            StateQueryRequest.in_store("t").with_query(
                RangeQuery.with_range("k050", "k099").with_result_order(ResultOrder.DESCENDING)
            ),
        )
        assert dict(ranged) == {k: v for k, v in expected.items() if "k050" <= k <= "k099"}


def test_each_partition_has_one_active_and_one_standby(cluster: list[Node]) -> None:
    hosts: dict[int, list[str]] = {}
    for node in cluster:
        for partition in node.replica("t").partitions:
            hosts.setdefault(partition, []).append(node.node_id)
    assert sorted(hosts) == list(range(8))
    assert all(len(h) == 2 for h in hosts.values())
    node = cluster[0]
    for i in range(50):
        meta = node.metadata_for_key("t", f"k{i:03d}")
        assert meta.partition == node.partition_for_key("t", f"k{i:03d}")
        assert meta.active_host is not None
        assert sorted([meta.active_host.node_id, *(h.node_id for h in meta.standby_hosts)]) == (
            sorted(hosts[meta.partition])
        )
    nodes = {m.node_id: m for m in node.all_metadata()}
    assert sorted(nodes) == ["n0", "n1", "n2"]
    actives = sorted(p for m in nodes.values() for p in m.active["t"])
    assert actives == list(range(8))
    for meta in nodes.values():
        assert set(meta.hosted["t"]) == set(meta.active["t"]) | set(meta.standby["t"])
        assert all(state == (2, "live", 0) for state in meta.hosted["t"].values())


def test_require_active_is_answered_by_the_active_only(cluster: list[Node]) -> None:
    node = cluster[0]
    for partition in range(8):
        meta_active = node.coordinator.assignment.active("t", partition)  # type: ignore[union-attr]
        standby = node.coordinator.assignment.replicas("t", partition)[1]  # type: ignore[union-attr]
        request = (
            StateQueryRequest.in_store("t")
            .with_query(RangeQuery.with_no_bounds())
            .with_partitions([partition])
            .require_active()
        )
        assert node.query(request).partition_results[partition].is_success
        by_id = {n.node_id: n for n in cluster}
        refused = by_id[standby].query_local(request).partition_results[partition]
        assert refused.failure_reason is FailureReason.NOT_ACTIVE
        assert repr(meta_active) in (refused.failure_message or "")


def test_a_bound_no_replica_reached_fails_only_that_partition(
    cluster: list[Node], tmp_path: Path
) -> None:
    """Batch 3's segment of one partition is corrupted: every replica of that partition stays
    at batch 2; a request bound at batch 3 fails there only and the others answer."""
    changelog = make_table(str(tmp_path), partitions=8)  # reopens the existing table
    rows = {f"k{i:03d}": 1000 + i for i in range(200)}
    record = write_batch(changelog, 3, rows, commit=False)
    victim = min(record.segments)
    segment = changelog.segment_path(victim, 3)
    data = bytearray(changelog.storage.read_bytes(segment))
    data[len(data) // 2] ^= 0xFF
    changelog.storage.write_atomic(segment, bytes(data))
    changelog.write_commit(record)
    wait_until(
        lambda: all(
            n.poll_once() >= 0 and all(s.batch_id == 3 for s in n.status() if s.partition != victim)
            for n in cluster
        ),
        10,
        "the healthy partitions did not reach batch 3",
    )
    bound = PositionBound.at(Position.from_map({"t": {0: 3}}))
    request = (
        StateQueryRequest.in_store("t")
        .with_query(RangeQuery.with_no_bounds())
        .with_position_bound(bound)
    )
    # Each replica of the victim waits its catch-up time (2 s) before it refuses, one after
    # the other within a request: the nodes are asked at once, not in turn.
    with ThreadPoolExecutor(len(cluster)) as pool:
        results = list(pool.map(lambda node: node.query(request), cluster))
    for node, result in zip(cluster, results, strict=True):
        failed = {p for p, r in result.partition_results.items() if r.is_failure}
        assert failed == {victim}
        assert result.partition_results[victim].failure_reason is FailureReason.NOT_UP_TO_BOUND
        answered = {
            k: v for p, r in result.partition_results.items() if r.is_success for k, v in r.result
        }
        truth = expected_rows([*HISTORY, rows])
        assert answered == {
            k: row for k, row in truth.items() if node.partition_for_key("t", k) != victim
        }


def test_a_stopped_node_is_routed_around_and_its_partitions_reassigned(
    cluster: list[Node],
) -> None:
    expected = expected_rows(HISTORY)
    victim = cluster[1]
    victim.stop()
    survivors = [cluster[0], cluster[2]]
    for node in survivors:  # answered at once by the standbys, before any heartbeat times out
        for i in range(0, 200, 5):
            key = f"k{i:03d}"
            assert node.get("t", key) == expected.get(key)
    settle(survivors)
    for node in survivors:
        assert set(node.replica("t").partitions) == set(range(8))  # 2 nodes, 1 standby
    cluster[1] = Node(
        victim.state_dir,
        node_id="n1",
        listen=victim.listen and "127.0.0.1:0",
        transport=victim._transport,
        peers=[cluster[0].url] if victim.listen else ["local://n0"],
        heartbeat_interval=0.1,
        failure_timeout=1.0,
        release_grace=0.5,
        poll_interval=0.01,
    ).start()
    settle(cluster)
    for node in cluster:
        assert (
            dict(
                all_rows(
                    node, StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
                )
            )
            == expected
        )


def test_a_new_node_takes_over_partitions_while_the_old_owner_answers(
    cluster: list[Node], tmp_path: Path
) -> None:
    expected = expected_rows(HISTORY)
    before = {n.node_id: set(n.replica("t").partitions) for n in cluster}
    transport = cluster[0]._transport
    newcomer = Node(
        str(tmp_path),
        node_id="n3",
        listen=None if transport is not None else "127.0.0.1:0",
        transport=transport,
        peers=["local://n0"] if transport is not None else [cluster[0].url],
        heartbeat_interval=0.1,
        failure_timeout=1.0,
        release_grace=0.5,
        poll_interval=0.01,
    ).start()
    cluster.append(newcomer)
    # While the cluster rebalances every answer stays complete and correct.
    wait_until(
        lambda: (
            all(
                dict(
                    all_rows(
                        n, StateQueryRequest.in_store("t").with_query(RangeQuery.with_no_bounds())
                    )
                )
                == expected
                for n in cluster
            )
            and set(newcomer.replica("t").partitions)
            == newcomer.coordinator.assignment.hosted_by("n3", "t", 8)
        ),  # type: ignore[union-attr]
        20,
        "the newcomer did not take its partitions",
    )
    settle(cluster)
    after = {n.node_id: set(n.replica("t").partitions) for n in cluster}
    assert after["n3"]  # it took some partitions...
    assert sum(len(v) for v in after.values()) == 16  # ...and the old owners released them
    assert any(after[n] != before[n] for n in before)


def test_local_directories_of_released_partitions_are_deleted(cluster: list[Node]) -> None:
    node = cluster[0]
    if node.listen is None:
        pytest.skip("rocksdb directories are checked once, over HTTP")
    assert node.local_dir is not None
    wait_until(
        lambda: (
            sorted(os.listdir(os.path.join(node.local_dir, "t")))  # type: ignore[arg-type]
            == sorted([f"{p:05d}" for p in node.replica("t").partitions] + ["replica.json"])
        ),
        10,
        "released partitions' files remain",
    )


def test_key_query_goes_to_one_partition_with_a_position(cluster: list[Node]) -> None:
    for node in cluster:
        result = node.query(StateQueryRequest.in_store("t").with_query(KeyQuery.with_key("k001")))
        only = result.only_partition_result()
        assert only.result == {"k": "k001", "n": 1}
        assert only.position.to_map() == {"t": {node.partition_for_key("t", "k001"): 2}}
