"""Session-wide fixtures: one real SparkSession for the whole test run."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq.testing import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession on both cores, started once per test session."""
    session = spark_session("sparkiq-tests")
    yield session
    session.stop()
