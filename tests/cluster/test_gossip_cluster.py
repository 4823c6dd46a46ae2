"""Nodes with ``membership="gossip"`` (sparkiq.cluster.swim, swim_loop): the probe routes
are admitted like heartbeats, a planned leave is announced, a member sends one probe a
period whatever the cluster's size, no message but a join's carries more than a few hosted
records, and every node's view of what the others host matches what they host.

Gossip is the default, so every other cluster test runs under it too; the cluster tests
that also run under heartbeats (joins, stops, kill -9, a pause) are
tests/cluster/test_heartbeats_reused.py, test_heartbeats_processes.py and
test_heartbeats_pause.py."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from sparkiq import Node
from sparkiq.cluster.gossip import LEFT
from sparkiq.cluster.nodeauth import REQUEST_HEADER, NodeKey
from sparkiq.cluster.swim import GossipMembership
from sparkiq.cluster.transport import LocalTransport
from sparkiq.wire.values import pack
from tests import http_calls
from tests.changelog.helpers import expected_rows, make_table, write_batch
from tests.cluster.cluster_helpers import (
    CLUSTER_SECRET,
    FAST,
    settle,
    start_http_cluster,
    wait_until,
)

HISTORY: list[dict[str, int | None]] = [
    {f"k{i:03d}": i for i in range(100)},
    {f"k{i:03d}": i * 10 for i in range(0, 100, 3)},
]
KEYS = [f"k{i:03d}" for i in range(100)]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> str:
    state_dir = str(tmp_path_factory.mktemp("gossip"))
    changelog = make_table(state_dir, partitions=8)
    for batch_id, rows in enumerate(HISTORY):
        write_batch(changelog, batch_id, rows)
    return state_dir


def view(node: Node) -> GossipMembership:
    assert node.coordinator is not None
    membership = node.coordinator.membership
    assert isinstance(membership, GossipMembership)
    return membership


def post(url: str, path: str, doc: Any, secret: str | None) -> httpx.Response:
    body = pack(doc)
    headers = {"content-type": "application/x-sparkiq-v1"}
    if secret is not None:
        headers[REQUEST_HEADER] = NodeKey(secret).sign_request("nx", "POST", path, body).header
    return http_calls.post(f"{url}{path}", content=body, headers=headers, timeout=10)


def test_signed_probes_only_and_a_malformed_one_changes_nothing(table: str) -> None:
    nodes = start_http_cluster(table, 2, membership="gossip", cluster_secret=CLUSTER_SECRET)
    try:
        n0 = nodes[0]
        assert n0.url
        before = view(n0).members()
        probe = {"node_id": "nx", "url": "http://127.0.0.1:9", "inc": 1, "updates": []}
        for path in ("/internal/probe", "/internal/probe-req"):
            refused = post(n0.url, path, probe, None)  # no node credential
            assert refused.status_code == 401, refused.text
            wrong = post(n0.url, path, probe, "another-cluster-secret")
            assert wrong.status_code == 401, wrong.text
        bad = dict(probe, updates=[["nx", "alive", -1, "http://127.0.0.1:9"]])
        answer = post(n0.url, "/internal/probe", bad, CLUSTER_SECRET)
        assert answer.status_code == 400 and "incarnation" in answer.text, answer.text
        bad_hosted = dict(probe, hosted=[["n1", 5, {"t": [[0, "live", 0, [1, 1]]]}]])
        answer = post(n0.url, "/internal/probe", bad_hosted, CLUSTER_SECRET)
        assert answer.status_code == 400 and "listed twice" in answer.text, answer.text
        assert view(n0).members() == before  # the sender was not taken in either
        assert "nx" not in view(n0).live()
        expected = expected_rows(HISTORY)
        for node in nodes:
            for key in KEYS[::7]:
                assert node.get("t", key) == expected.get(key)
    finally:
        for node in reversed(nodes):
            node.stop()


class Counting(LocalTransport):
    """The in-process transport, counting probes and the hosted records each carries."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.probes: dict[str, int] = {}
        self.records: list[tuple[bool, int]] = []  # (a join, records carried) per message

    def probe(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.probes[doc["node_id"]] = self.probes.get(doc["node_id"], 0) + 1
            self.records.append((bool(doc.get("join")), len(doc["hosted"])))
        ack = super().probe(url, doc)
        with self.lock:
            self.records.append((bool(doc.get("join")), len(ack["hosted"])))
        return ack


def test_one_probe_a_period_few_records_a_message_and_a_planned_leave(table: str) -> None:
    transport = Counting()
    options = dict(FAST, membership="gossip", transport=transport)
    nodes: list[Node] = []
    try:
        for i in range(6):
            peers = ["local://n0"] if i else []
            nodes.append(Node(table, node_id=f"n{i}", peers=peers, **options).start())  # type: ignore[arg-type]
        settle(nodes)
        for node in nodes:  # what each hosts, as every other sees it
            for other in nodes:
                if other is not node:
                    seen = view(node).hosted_state(other.node_id)
                    assert seen == other._hosting.hosted_state(), (node.node_id, other.node_id)
        with transport.lock:
            transport.probes.clear()
        rounds = {n.node_id: n.coordinator._rounds for n in nodes}  # type: ignore[union-attr]
        wait_until(
            lambda: all(n.coordinator._rounds >= rounds[n.node_id] + 20 for n in nodes),  # type: ignore[union-attr]
            60,
            "the protocol loops did not run 20 periods",
        )
        done = {n.node_id: n.coordinator._rounds - rounds[n.node_id] for n in nodes}  # type: ignore[union-attr]
        with transport.lock:
            probes = dict(transport.probes)
            records = list(transport.records)
        for node_id, count in done.items():  # one probe a period (and no indirect ones)
            assert probes.get(node_id, 0) <= count + 2, (node_id, probes, done)
            assert probes.get(node_id, 0) >= count // 2, (node_id, probes, done)
        assert max(n for join, n in records if not join) <= 9  # 8 pushed + 1 pulled
        assert max(n for join, n in records if join) >= 1  # a joiner gets every record
        leaver = nodes.pop(3)
        leaver.stop()
        for node in nodes:
            wait_until(
                lambda node=node: view(node).members()["n3"].status == LEFT,  # type: ignore[misc]
                30,
                f"{node.node_id} did not hear n3 leave",
            )
        settle(nodes)
        expected = expected_rows(HISTORY)
        for key in KEYS[::5]:
            assert nodes[0].get("t", key) == expected.get(key)
    finally:
        for node in reversed(nodes):
            node.stop()
