"""Stalls and late heartbeats, in one process: what made ``test_three_nodes_answer_like_one``
flake on a loaded machine.

The failure was ``partition 3 of 'w' could not answer (NOT_PRESENT): ... not hosted on node
'n1'``. When a whole process is starved of CPU for longer than ``failure_timeout`` (all
nodes of an in-process cluster at once), no heartbeat is sent or answered meanwhile. On
waking, each node used to judge the others by silence that accrued while it was not running
itself: it saw itself alone, computed an assignment that put every partition on itself, and
its router -- which only asked the assignment's live replicas -- asked only itself, which
did not host the partition. Here the stall is made deterministic: every node's heartbeat
loop is held and every heartbeat times out for 2.5 failure timeouts, then everything resumes
at once while queries arrive on every node.

Every test runs under both memberships (``heartbeats`` and ``gossip``): a stall is the same
hazard for a node that probes one member a period as for one that hears from all.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node
from sparkiq.cluster.assignment import Assignment
from sparkiq.cluster.httppool import NodeTimeoutError
from sparkiq.cluster.swim import GossipMembership
from sparkiq.cluster.transport import LocalTransport
from tests.changelog.helpers import expected_rows, make_table, write_batch
from tests.cluster.cluster_helpers import FAST, settle, wait_until

KEYS = [f"k{i:03d}" for i in range(64)]
HISTORY: list[dict[str, int | None]] = [{k: i for i, k in enumerate(KEYS)}]


class LateBeats(LocalTransport):
    """The in-process transport, except that membership messages (heartbeats, gossip
    probes and probe requests) between the pairs in ``cut`` (and to or from any node in
    ``silent``) time out, as they do when a process is not scheduled; queries still go
    through."""

    def __init__(self) -> None:
        super().__init__()
        self.silent: set[str] = set()
        self.cut: set[frozenset[str]] = set()

    def _late(self, url: str, doc: dict[str, Any]) -> None:
        sender = doc.get("url")
        if url in self.silent or sender in self.silent or frozenset((url, sender)) in self.cut:
            raise NodeTimeoutError(f"{url} did not answer in time")

    def heartbeat(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        self._late(url, doc)
        return super().heartbeat(url, doc)

    def probe(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        self._late(url, doc)
        return super().probe(url, doc)

    def probe_req(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        self._late(url, doc)
        return super().probe_req(url, doc)


class Loops:
    """Holds every node's membership loop (heartbeat rounds, gossip periods) between
    :meth:`stop` and :meth:`resume`."""

    def __init__(self, nodes: list[Node], monkeypatch: pytest.MonkeyPatch) -> None:
        self.running = threading.Event()
        self.running.set()
        self._lock = threading.Condition()
        self._inside = 0  # rounds under way
        for node in nodes:
            coordinator = node.coordinator
            assert coordinator is not None
            original = coordinator.heartbeat_round

            def held(*args: Any, _original: Any = original, **kwargs: Any) -> None:
                while True:
                    self.running.wait()
                    with self._lock:
                        if self.running.is_set():
                            self._inside += 1
                            break
                try:
                    _original(*args, **kwargs)
                finally:
                    with self._lock:
                        self._inside -= 1
                        self._lock.notify_all()

            monkeypatch.setattr(coordinator, "heartbeat_round", held)

    def stop(self) -> None:
        """No round starts from now on, and none is under way on return: a stopped process
        runs none either (a round left running would meet the silence of the stall as it
        begins and judge the others by it, which a stopped process never does)."""
        with self._lock:
            self.running.clear()
            assert self._lock.wait_for(lambda: self._inside == 0, timeout=60), "a round hung"

    def resume(self) -> None:
        self.running.set()


@pytest.fixture(params=["heartbeats", "gossip"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[list[Node], LateBeats]]:
    changelog = make_table(str(tmp_path), partitions=8)
    for batch_id, rows in enumerate(HISTORY):
        write_batch(changelog, batch_id, rows)
    transport = LateBeats()
    nodes = [
        Node(
            str(tmp_path),
            node_id=f"n{i}",
            transport=transport,
            peers=["local://n0"] if i else [],
            membership=request.param,
            **FAST,
        ).start()
        for i in range(3)
    ]
    settle(nodes)
    yield nodes, transport
    for node in reversed(nodes):
        node.stop()


def record_rebalances(nodes: list[Node], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    seen: list[tuple[str, ...]] = []
    for node in nodes:
        rebalancer = node._rebalancer
        assert rebalancer is not None
        original = rebalancer.rebalance

        def recording(assignment: Assignment, _original: Any = original) -> None:
            seen.append(assignment.members)
            _original(assignment)

        monkeypatch.setattr(rebalancer, "rebalance", recording)
    return seen


def test_a_stalled_cluster_answers_every_key_when_it_resumes(
    cluster: tuple[list[Node], LateBeats], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes, transport = cluster
    expected = expected_rows(HISTORY)
    loops = Loops(nodes, monkeypatch)
    rebalanced = record_rebalances(nodes, monkeypatch)
    hosted_before = {n.node_id: set(n.replica("t").partitions) for n in nodes}

    loops.stop()  # the process is not scheduled: no heartbeat or probe goes out or in ...
    transport.silent = {n.url for n in nodes if n.url}
    threading.Event().wait(2.5 * FAST["failure_timeout"])  # ... for 2.5 failure timeouts
    transport.silent = set()
    loops.resume()  # everything resumes at once, with queries already waiting

    def read_all(node: Node) -> dict[str, Any]:
        return {key: node.get("t", key) for key in KEYS}

    with ThreadPoolExecutor(len(nodes)) as pool:
        answers = list(pool.map(read_all, nodes))
    for answer in answers:
        assert answer == {k: expected.get(k) for k in KEYS}

    everyone = tuple(sorted(n.node_id for n in nodes))
    assert all(members == everyone for members in rebalanced), set(rebalanced)
    # Nobody opened (and restored) a partition that never left its owners.
    assert {n.node_id: set(n.replica("t").partitions) for n in nodes} == hosted_before


def test_a_node_whose_heartbeats_are_late_is_still_asked_for_what_it_hosts(
    cluster: tuple[list[Node], LateBeats],
) -> None:
    nodes, transport = cluster
    n0, _, n2 = nodes
    assert n0.url and n2.url and n0.coordinator and n2.coordinator
    only_on_n2 = [
        p
        for p in range(8)
        if p in n2.replica("t").partitions and p not in n0.replica("t").partitions
    ]
    assert only_on_n2
    transport.cut = {frozenset((n0.url, n2.url))}  # n0 and n2 stop hearing each other
    membership = n0.coordinator.membership
    if isinstance(membership, GossipMembership):
        # One link cut is routed around: n0's probes of n2 fail, n1 probes n2 for it and
        # its ack comes back through n1, so n2 is never suspected (SWIM's indirect probes).
        # Watched for three suspicion timeouts (of periods on n0's own clock).
        watched = 3 * membership.gossip.suspicion_timeout() + 1.0
        deadline = time.monotonic() + watched
        while time.monotonic() < deadline:
            assert membership.live() == ("n0", "n1", "n2"), membership.members()
            time.sleep(0.05)
        assert n2.coordinator.membership.live() == ("n0", "n1", "n2")
    else:
        wait_until(lambda: "n2" not in membership.live(), 20, "n2 stayed live on n0")
    for partition in only_on_n2:  # n0's view lost n2 (heartbeats), but n2 says it hosts them
        assert "n2" in n0.coordinator.router.candidates("t", partition, False)
    expected = expected_rows(HISTORY)
    for key in KEYS:
        assert n0.get("t", key) == expected.get(key)


def test_a_stall_while_waiting_for_replies_is_noticed(
    cluster: tuple[list[Node], LateBeats], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause that lands while the heartbeat loop waits for replies (where a busy node
    spends much of its time) is a stall too: the node resynchronizes before it is fresh."""
    nodes, _ = cluster
    coordinator = nodes[1].coordinator
    assert coordinator is not None
    original = coordinator.heartbeat_round
    stall = threading.Event()
    caught_up: list[bool] = []
    monkeypatch.setattr(coordinator, "_catch_up", lambda: caught_up.append(True))

    def paused_mid_round(wait: float) -> None:
        original(wait)
        if stall.is_set():  # the process is stopped after the beats went out
            stall.clear()
            threading.Event().wait(coordinator.stall_limit + 0.5)

    monkeypatch.setattr(coordinator, "heartbeat_round", paused_mid_round)
    stall.set()
    wait_until(lambda: not stall.is_set(), 10, "the heartbeat loop never ran")
    wait_until(lambda: caught_up, 20, "the node never resynchronized after the stall")
    wait_until(coordinator.is_fresh, 20, "the node stayed not fresh")
    assert nodes[1].get("t", KEYS[0]) == expected_rows(HISTORY)[KEYS[0]]
