"""Session-wide fixtures: one real SparkSession for the whole test run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from sparkiq.testing import connect_server, spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession on both cores, started once per test session."""
    session = spark_session("sparkiq-tests")
    yield session
    session.stop()


# PySpark marks a process as Spark Connect (SPARK_CONNECT_MODE_ENABLED) once it creates a
# Connect session; from then on `pyspark.sql.functions` build Connect columns, which classic
# DataFrames refuse. The mark is therefore set only while a test using `connect_spark` runs.
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@pytest.fixture(scope="session")
def _connect_session() -> Iterator[Any]:
    with connect_server() as address:
        had_mark = _CONNECT_MODE in os.environ
        session = spark_session("sparkiq-connect-tests", remote=address)
        if not had_mark:
            os.environ.pop(_CONNECT_MODE, None)
        yield session
        session.stop()


@pytest.fixture
def connect_spark(_connect_session: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Spark Connect session to a local Connect server (a second JVM, started once, by
    the first test that asks for it: tests/spark/test_connect.py), with the process in
    Connect mode for the test's duration."""
    monkeypatch.setenv(_CONNECT_MODE, "1")
    return _connect_session
