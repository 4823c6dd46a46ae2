"""tests/hosts needs root and ``ip netns``: without them each test is skipped, saying so."""

from __future__ import annotations

import pytest

from tests.hosts.netns import unavailable


@pytest.fixture(autouse=True)
def _namespaces_available() -> None:
    why = unavailable()
    if why:
        pytest.skip(why)
