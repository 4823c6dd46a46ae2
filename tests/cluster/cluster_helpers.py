"""Starting clusters of nodes in the test process (HTTP on 127.0.0.1, or in-process)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sparkiq import Node
from sparkiq.cluster.transport import LocalTransport

FAST = {
    "heartbeat_interval": 0.1,
    "failure_timeout": 1.0,
    "release_grace": 0.5,
    "poll_interval": 0.01,
}


#: The nodes' shared secret where a test gives them a client token (which never admits one).
CLUSTER_SECRET = "tests-cluster-secret"


def start_http_cluster(state_dir: str, count: int, **options: Any) -> list[Node]:
    settings = FAST | options
    if settings.get("token") is not None:
        settings.setdefault("cluster_secret", CLUSTER_SECRET)
    first = Node(state_dir, node_id="n0", listen="127.0.0.1:0", peers=[], **settings).start()
    nodes = [first]
    for i in range(1, count):
        nodes.append(
            Node(
                state_dir, node_id=f"n{i}", listen="127.0.0.1:0", peers=[first.url], **settings
            ).start()
        )
    settle(nodes)
    return nodes


def start_local_cluster(state_dir: str, count: int, **options: Any) -> list[Node]:
    transport = LocalTransport()
    settings = FAST | options
    nodes = []
    for i in range(count):
        nodes.append(
            Node(
                state_dir,
                node_id=f"n{i}",
                transport=transport,
                peers=["local://n0"] if i else [],
                **settings,
            ).start()
        )
    settle(nodes)
    return nodes


def settle(nodes: list[Node], timeout: float = 20.0) -> None:
    """Wait until every node sees every other and hosts exactly its assignment, caught up."""
    ids = tuple(sorted(n.node_id for n in nodes))

    def settled() -> bool:
        for node in nodes:
            node.poll_once()
            coordinator = node.coordinator
            assert coordinator is not None
            if coordinator.membership.live() != ids:
                return False
            for table in node.tables:
                count = node.partition_count(table)
                want = coordinator.assignment.hosted_by(node.node_id, table, count)
                if set(node.replica(table).partitions) != want:
                    return False
            if not node.is_ready():
                return False
        for node in nodes:  # and heartbeats told everyone
            for other in nodes:
                if other is node:
                    continue
                seen = node.coordinator.membership.hosted_state(other.node_id)  # type: ignore[union-attr]
                for table in other.tables:
                    if set(seen.get(table, {})) != set(other.replica(table).partitions):
                        return False
        return True

    wait_until(settled, timeout, f"cluster {ids} did not settle")


def wait_until(check: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.05)
