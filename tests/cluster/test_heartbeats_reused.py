"""Cluster tests of tests/cluster/test_cluster.py run again with ``membership="heartbeats"``
(every node reads SPARKIQ_MEMBERSHIP; gossip is the default): answers from every node, a
stopped node routed around and its partitions reassigned, a joining node taking partitions
while the old owners answer."""

from __future__ import annotations

import pytest

from tests.cluster.test_cluster import (  # noqa: F401  (collected here, under heartbeats)
    cluster,
    test_a_new_node_takes_over_partitions_while_the_old_owner_answers,
    test_a_stopped_node_is_routed_around_and_its_partitions_reassigned,
    test_every_node_answers_every_key_and_range,
)


@pytest.fixture(autouse=True)
def heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKIQ_MEMBERSHIP", "heartbeats")
