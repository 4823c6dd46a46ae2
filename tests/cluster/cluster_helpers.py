"""Clusters of nodes in the test process, through the testing kit (``sparkiq.testing``),
with the settings the cluster tests share."""

from __future__ import annotations

from typing import Any

from sparkiq import Node
from sparkiq.testing import TEST_TIMINGS, LocalCluster, start_cluster, wait_until

__all__ = [
    "CLUSTER_SECRET",
    "FAST",
    "settle",
    "start_http_cluster",
    "start_local_cluster",
    "wait_until",
]

FAST = dict(TEST_TIMINGS)

#: The nodes' shared secret where a test gives them a client token (which never admits one).
CLUSTER_SECRET = "tests-cluster-secret"

#: How long a cluster of the tests may take to settle.
SETTLE_TIMEOUT = 20.0


def start_http_cluster(state_dir: str, count: int, **options: Any) -> list[Node]:
    if options.get("token") is not None:
        options.setdefault("cluster_secret", CLUSTER_SECRET)
    return start_cluster(state_dir, count, settle_timeout=SETTLE_TIMEOUT, **options).nodes


def start_local_cluster(state_dir: str, count: int, **options: Any) -> list[Node]:
    return start_cluster(
        state_dir, count, http=False, settle_timeout=SETTLE_TIMEOUT, **options
    ).nodes


def settle(nodes: list[Node], timeout: float = SETTLE_TIMEOUT) -> None:
    """Wait until every node sees every other and hosts exactly its assignment, caught up."""
    LocalCluster(nodes, http=True, token=None).settle(timeout)
