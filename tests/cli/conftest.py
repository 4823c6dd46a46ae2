from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.cli.terminal import Terminal


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    """A tmux terminal of its own, closed after the test."""
    term = Terminal(f"sparkiq-test-{os.getpid()}-{time.monotonic_ns()}")
    try:
        yield term
    finally:
        term.close()
