"""``sparkiq serve`` processes with ``membership="heartbeats"`` (SPARKIQ_MEMBERSHIP, inherited
by the processes; gossip is the default) under query load: tests/cluster/test_cluster_kill.py's
kill -9 of an active node, run again; every answer checked as there."""

from __future__ import annotations

import pytest

from tests.cluster.test_cluster_kill import (  # noqa: F401  (collected here, under heartbeats)
    cluster,
    test_kill_minus_nine_of_an_active_node,
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKIQ_MEMBERSHIP", "heartbeats")
