"""A ``sparkiq serve`` process paused (SIGSTOP, 10 s) under load with
``membership="heartbeats"`` (gossip is the default): tests/cluster/test_cluster_pause.py run
again -- no answer may fail or be wrong, and the node that was itself stalled declares
nobody gone."""

from __future__ import annotations

import pytest

from tests.cluster.test_cluster_pause import (  # noqa: F401  (collected here, under heartbeats)
    cluster,
    test_a_paused_node_costs_no_answer,
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKIQ_MEMBERSHIP", "heartbeats")
