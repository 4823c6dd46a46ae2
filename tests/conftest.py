"""Session-wide fixtures: one real SparkSession for the whole test run."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq.errors import ConfigError
from sparkiq.spark import worker_python
from sparkiq.testing import connect_server, spark_kafka_jars, spark_session
from tests.small_disk import mount_tmpfs, unmount
from tests.spark.short_jvm import SHORT_JVM_OPTIONS

# pytest keeps the test modules it rewrites (for assertion messages) only where bytecode may
# be written, and PYTHONDONTWRITEBYTECODE is set on CI's machine: each of the four workers
# rewrote every test module while collecting (some 5.5 CPU-seconds a worker on a fresh
# clone). Allowed in the test process, the worker that gets to a module first leaves it for
# the others: a fresh clone's start to the first test 45.8-45.9 -> 35.7-38.6 CPU-seconds,
# 23.7-23.9 -> 18.6-20.2 s (interleaved pairs; the Makefile's `unit` compiles the other
# modules, pytest's rewritten ones are its own).
sys.dont_write_bytecode = False

# Set before any session starts: the local session's workers, the Connect server's and those
# of the Spark drivers tests start as subprocesses (they inherit the environment).
# Spark's Python workers connect back at once, before their imports: a busy machine made them
# miss Spark's fixed 10 s deadline (see sparkiq.spark.worker_python).
os.environ.setdefault("PYSPARK_PYTHON", worker_python.command())
# Every Spark driver the tests start runs C1-only with the serial GC: a third less CPU for
# JVMs that live minutes (tests/spark/short_jvm.py has the measurements).
os.environ.setdefault("SPARK_SUBMIT_OPTS", SHORT_JVM_OPTIONS)


# Tests that use a SparkSession: after the slow ones, before those that need no JVM.
_SPARK_FIXTURES = {"spark", "connect_spark"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files with long tests first: files with a test marked ``slow`` (each starts
    JVMs or processes of its own), then files using the session's SparkSession, then the rest.

    ``make test`` spreads whole files over four workers (pytest-xdist, ``--dist loadfile``)
    in collection order; a long file left for the end would keep one worker busy while the
    other idles. The order within a file is unchanged, and the sort is stable, so every
    worker collects the same order."""
    tier: dict[Path, int] = {}
    for item in items:
        if item.get_closest_marker("slow"):
            rank = 0
        elif _SPARK_FIXTURES & set(item.fixturenames):
            rank = 1
        else:
            rank = 2
        tier[item.path] = min(rank, tier.get(item.path, rank))
    items.sort(key=lambda item: tier[item.path])


def pytest_collection_finish(session: pytest.Session) -> None:
    """Objects that exist once the tests are collected (the modules every test file
    imported: Spark's, Arrow's, DuckDB's, sparkiq's; the test items) live until the process
    ends: frozen, Python's cyclic collector stops walking them at each full collection,
    some 150 ms each in a worker and a dozen in a file like tests/server's."""
    gc.freeze()


#: Files that go to one worker together, as one unit of work, because they share costly
#: fixtures a worker starts once: the files of tests/kafka share a broker JVM (package scope,
#: about 5 CPU-s a start; file by file, each worker ran them in two stretches and started six
#: brokers where one does), and the files below with the Kafka ones run under Spark Connect
#: share the worker's Connect server (a JVM, started by the first test that asks for it):
#: one worker starts it instead of each. A path names a file or, ending in "/", a directory.
_ONE_WORKER_UNIT = (
    "tests/kafka/",
    "tests/spark/test_connect.py",
    "tests/spark/test_datasource.py",
    "tests/checkpoint/test_attach_everywhere.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the files of :data:`_ONE_WORKER_UNIT` as one unit. Files
    are otherwise handed out one at a time, in collection order."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _UnitTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if any(path == p or (p.endswith("/") and path.startswith(p)) for p in _ONE_WORKER_UNIT):
                return _ONE_WORKER_UNIT[0]
            return path

    return _UnitTogether(config, log)


def _kafka_connector() -> dict[str, str]:
    """``spark.jars`` with Spark's Kafka connector when ``make jvm-jars`` has fetched it,
    else nothing: only the Kafka tests fail then, with the error that says to fetch it."""
    try:
        return {"spark.jars": ",".join(spark_kafka_jars())}
    except ConfigError:
        return {}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession on both cores, started once per test session.

    Spark's state store maintenance (snapshots of state, cleanup of old files) runs every
    5 s instead of every minute, so tests of what it writes (tests/checkpoint) need not wait
    a minute for it; the states tests keep are small, so each run is cheap.

    Spark's Kafka connector is on its classpath when ``make jvm-jars`` has fetched it
    (``spark.jars`` counts only before the JVM starts, and a worker has one session): the
    tests in tests/kafka need it, and say how to get it when it is missing."""
    config = {"spark.sql.streaming.stateStore.maintenanceInterval": "5s", **_kafka_connector()}
    session = spark_session("sparkiq-tests", config=config)
    yield session
    session.stop()


# PySpark marks a process as Spark Connect (SPARK_CONNECT_MODE_ENABLED) once it creates a
# Connect session; from then on `pyspark.sql.functions` build Connect columns, which classic
# DataFrames refuse. The mark is therefore set only while a test using `connect_spark` runs.
_CONNECT_MODE = "SPARK_CONNECT_MODE_ENABLED"


@pytest.fixture(scope="session")
def _connect_session() -> Iterator[Any]:
    # The server's JVM reads Kafka for its sessions: the connector goes on its command line
    # (spark-submit puts `spark.jars` on the driver's classpath).
    with connect_server(python=os.environ["PYSPARK_PYTHON"], config=_kafka_connector()) as address:
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
    Connect mode for the test's duration. The server has Spark's Kafka connector when the
    session's SparkSession has it (``make jvm-jars``)."""
    monkeypatch.setenv(_CONNECT_MODE, "1")
    return _connect_session


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs to fill up (:mod:`tests.small_disk`); skips where mounting is refused."""
    disk = tmp_path / "small"
    disk.mkdir()
    error = mount_tmpfs(disk, 8)
    if error:
        pytest.skip(f"no tmpfs to fill ({error}); mounting needs root")
    try:
        yield disk
    finally:
        unmount(disk)
