"""``sparkiq serve`` processes with ``membership="heartbeats"`` (SPARKIQ_MEMBERSHIP, inherited
by the processes; gossip is the default) under query load: tests/cluster/test_cluster_kill.py's
kill -9 of an active node, run again; every answer checked as there."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.test_cluster_kill import (  # noqa: F401  (collected here, under heartbeats)
    cluster,
    test_kill_minus_nine_of_an_active_node,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def heartbeats() -> Iterator[None]:
    # module scope, like the cluster it must come before (an autouse fixture is set up
    # before the other fixtures of its scope; a function-scoped one would come too late)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("SPARKIQ_MEMBERSHIP", "heartbeats")
        yield
