"""sparkiq on a real Spark cluster: a standalone master and worker in their own JVMs on this
host, executors in their own JVM and working directory, and a driver in its own process
started with a RELATIVE ``state_dir``.

What a cluster changes compared with local mode: executors do not share the driver's working
directory, so a path that is not resolved on the driver lands somewhere readers never look.
The driver here runs the differential pipeline, dies mid-batch once (between a batch's
segments and its commit record), restarts, and checks every table against Spark batch mode
after every input file; the test then reads the changelog with a fresh node and checks that
nothing was written in the executors' working directory. The restarted driver then runs the
Kafka differential's first round with its executor reading the topic from a real broker (a
second test checks that run): two drivers, and two executors, for the module instead of three.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App, Node
from sparkiq.changelog import Changelog
from sparkiq.changelog.snapshot import list_snapshots
from sparkiq.errors import SparkiqError
from sparkiq.spark.sink import (
    CRASH_ENV,
    SEGMENT_FAULT_ENV,
    WRITE_ENV,
    TableSink,
    absolute_location,
)
from sparkiq.testing import (
    JsonSource,
    assert_table_matches,
    diff_table,
    kafka_broker,
    spark_kafka_jars,
)
from tests.spark.short_jvm import JVM_OPTIONS
from tests.spark.standalone_kafka import ROUNDS
from tests.spark.test_differential import normalize, write_orders

# Starts JVMs or processes of its own: scheduled first (tests/conftest.py).
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def written_by_executors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments written by the cluster's executors, in their own working directories: small
    batches would otherwise be written on the driver from the second one on (the driver
    processes get the same setting from :func:`_spark_env`)."""
    monkeypatch.setenv(WRITE_ENV, "tasks")


ROOT = Path(__file__).resolve().parents[2]
TABLES = ("by_product", "by_user_day", "orders")
#: Deadlines sized for a loaded 2-core machine; each wait ends as soon as its condition holds.
START_TIMEOUT = 180.0
DRIVER_TIMEOUT = 600.0
DRIVER = "tests.spark.standalone_driver"


def free_port() -> int:
    with socket.socket() as probe:  # free now; the JVM takes it moments later
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Standalone:
    """A running standalone cluster: its master URL and the worker's work directory (where
    each executor gets its own working directory)."""

    master: str
    web: str
    work_dir: Path
    logs: Path

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.web}/json/", timeout=10) as response:
            return dict(json.load(response))


def _spark_env(logs: Path) -> dict[str, str]:
    from pyspark.find_spark_home import _find_spark_home

    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", CRASH_ENV)}
    env.update(
        SPARK_HOME=_find_spark_home(),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_DAEMON_JAVA_OPTS=JVM_OPTIONS,
        SPARK_LOG_DIR=str(logs),
        PYSPARK_PYTHON=sys.executable,
    )
    env[WRITE_ENV] = "tasks"  # the drivers' segments too are written by the executors
    return env


def _start_daemon(command: list[str], env: dict[str, str], log: Path, cwd: Path) -> Any:
    with open(log, "wb") as out:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped with what it started
        )


def _group_alive(group: int) -> bool:
    """Whether a process of process group ``group`` is still running (zombies aside)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process just went away
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _stop(process: Any) -> None:
    """Stop ``process`` and everything in its process group, even when it has exited
    itself: a driver that died abruptly may leave its JVM behind for a moment."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        process.poll()  # reap the leader, so only live members count
        if not _group_alive(process.pid):
            break
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + 30
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
    process.wait()


def _wait_until(what: str, condition: Any, timeout: float, *logs: Path) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except (OSError, ValueError):  # not listening yet, or its web UI answers before
            pass  # it has a status to give (an empty body: JSONDecodeError is a ValueError)
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-3000:]}" for p in logs)
            raise AssertionError(f"{what} within {timeout} s\n{tails}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """A master and one worker (1 core, 1 GB) on 127.0.0.1, started with pyspark's bundled
    ``spark-class``; both process groups are stopped when the module's tests end."""
    root = tmp_path_factory.mktemp("standalone")
    logs, work_dir = root / "logs", root / "work"
    logs.mkdir()
    work_dir.mkdir()
    env = _spark_env(logs)
    spark_class = os.path.join(env["SPARK_HOME"], "bin", "spark-class")
    port, web_port = free_port(), free_port()
    master_url, web = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}"
    processes = []
    try:
        master_log = logs / "master.log"
        processes.append(
            _start_daemon(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--webui-port",
                    str(web_port),
                ],
                env,
                master_log,
                root,
            )
        )
        cluster = Standalone(master_url, web, work_dir, logs)
        _wait_until(
            "the master did not come up",
            lambda: cluster.status().get("status") == "ALIVE",
            START_TIMEOUT,
            master_log,
        )
        worker_log = logs / "worker.log"
        processes.append(
            _start_daemon(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work_dir),
                    master_url,
                ],
                env,
                worker_log,
                root,
            )
        )
        _wait_until(
            "the worker did not register with the master",
            lambda: cluster.status().get("aliveworkers", 0) >= 1,
            START_TIMEOUT,
            master_log,
            worker_log,
        )
        yield cluster
    finally:
        for process in reversed(processes):
            _stop(process)


def run_driver(
    cluster: Standalone, cwd: Path, module: str, *args: str, crash_at: str = ""
) -> subprocess.CompletedProcess[str]:
    """Run the driver ``module`` (tests/spark/standalone_driver.py) with ``args`` in ``cwd``,
    this checkout's sources first; its process group is killed if it outlives
    :data:`DRIVER_TIMEOUT`."""
    env = _spark_env(cluster.logs)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    if crash_at:
        env[CRASH_ENV] = crash_at
    command = [sys.executable, "-m", module, cluster.master, *args]
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=DRIVER_TIMEOUT)
    finally:
        _stop(process)
    return subprocess.CompletedProcess(command, process.returncode, output, "")


def _reports(report: Path) -> list[dict[str, Any]]:
    if not report.exists():
        return []
    return [json.loads(line) for line in report.read_text().splitlines() if line]


@dataclass
class Restarted:
    """What the module's two driver runs left: the first died in batch 1, the second, on the
    same relative state_dir, finished the file pipeline, then ran the Kafka round."""

    driver_cwd: Path
    report: Path  # the file pipeline's checks, a JSON line each
    second: subprocess.CompletedProcess[str]
    kafka_report: Path  # the Kafka round's checks
    jars: list[str]  # Spark's Kafka connector, shipped to the executor
    second_app_dir: Path  # the second run's application folder in the worker's work_dir


@pytest.fixture(scope="module")
def restarted(standalone: Standalone, tmp_path_factory: pytest.TempPathFactory) -> Restarted:
    jars = spark_kafka_jars()  # raises ConfigError naming `make jvm-jars` when missing
    root = tmp_path_factory.mktemp("restart")
    driver_cwd, staged, source = root / "driver", root / "staged", root / "in"
    for folder in (driver_cwd, staged, source):
        folder.mkdir()
    rng = random.Random(12)
    for index in range(3):
        write_orders(staged, index, rng, count=200)
    report, kafka_report = root / "report.jsonl", root / "kafka.jsonl"

    # First run: batch 0 is checked, then the driver dies in batch 1 of "orders" after its
    # segments were written and before its commit record.
    args = (str(staged), str(source), "state", str(report))  # a relative state_dir
    first = run_driver(standalone, driver_cwd, DRIVER, *args, crash_at="before_commit:orders:1")
    assert first.returncode == 86, first.stdout[-4000:]
    assert [r["files"] for r in _reports(report)] == [1], first.stdout[-4000:]
    state = driver_cwd / "state"
    assert Changelog(str(state), "orders").committed_batch_ids() == [0]
    assert list((state / "tables" / "orders" / "segments").glob("*/*1.arrow"))

    # Second run on the same relative state_dir: batch 1 re-runs, then batch 2; then Kafka.
    before = set(standalone.work_dir.glob("app-*"))
    with kafka_broker() as servers:
        kafka = (servers, "orders", "kafka-state", str(kafka_report))  # relative, too
        second = run_driver(standalone, driver_cwd, DRIVER, *args, *kafka)
    (app_dir,) = set(standalone.work_dir.glob("app-*")) - before
    return Restarted(driver_cwd, report, second, kafka_report, jars, app_dir)


def test_relative_state_dir_on_a_standalone_cluster_with_a_driver_restart(
    standalone: Standalone, restarted: Restarted
) -> None:
    second, driver_cwd = restarted.second, restarted.driver_cwd
    assert second.returncode == 0, second.stdout[-4000:]
    checked = _reports(restarted.report)
    assert [r["files"] for r in checked] == [1, 2, 3], second.stdout[-4000:]
    state = driver_cwd / "state"
    for step in checked:
        assert step["cwd"] == str(driver_cwd)
        assert step["state_dir"] == str(state)  # resolved once, on the driver
        assert step["diffs"] == {name: "" for name in TABLES}, step["diffs"]
        assert all(step["rows"][name] > 0 for name in TABLES)

    # What a reader sees: every batch committed once, every segment where readers look.
    for name in TABLES:
        assert Changelog(str(state), name).committed_batch_ids() == [0, 1, 2], name
        assert list_snapshots(Changelog(str(state), name), 0), name  # compact() ran on the cluster
    # batch mode, computed by the driver
    truth = pickle.loads(Path(f"{restarted.report}.truth").read_bytes())
    assert set(truth) == set(TABLES)
    with Node(str(state), listen=None, store="memory") as node:
        node.poll_once()
        for name in TABLES:
            diff = diff_table(node, name, list(truth[name].values()), normalize=normalize)
            assert diff.is_empty, str(diff)

    # The executors ran in their own working directories and wrote nothing there.
    executor_dirs = [p for p in standalone.work_dir.glob("app-*/*") if p.is_dir()]
    assert len(executor_dirs) >= 2, list(standalone.work_dir.rglob("*"))  # one per driver run
    assert not [p for p in standalone.work_dir.rglob("*") if p.suffix in (".arrow", ".json")]


def test_executors_read_kafka_on_a_standalone_cluster(restarted: Restarted) -> None:
    """The Kafka differential's first round (tests/kafka/differential.py: a plain
    aggregation, a windowed one with a watermark and a stream-static join, checked against
    batch mode and the acknowledged records) with the cluster's executor reading the topic;
    the driver ships Spark's Kafka connector to it with ``spark.jars``."""
    second = restarted.second
    assert second.returncode == 0, second.stdout[-4000:]
    checked = _reports(restarted.kafka_report)
    assert len(checked) == ROUNDS, second.stdout[-4000:]
    assert all(n > 0 for n in checked[-1]["rows"].values()), checked
    # its state_dir, relative, resolved on the driver like the file pipeline's
    assert Changelog(str(restarted.driver_cwd / "kafka-state"), "totals").committed_batch_ids()
    # The executor (the only one: a standalone driver runs no task) fetched the connector.
    jar_names = {p.name for p in restarted.second_app_dir.glob("*/*.jar")}
    assert {Path(jar).name for jar in restarted.jars} <= jar_names


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        ("truncate", "did not land where it was written"),  # the executor's read-back
        ("remove_after_verify", "missing where the driver looks"),  # the driver's check
    ],
)
def test_a_segment_that_did_not_land_fails_the_batch(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, says: str
) -> None:
    """A segment damaged between its write and the commit (by the sink's test hook) stops
    the query with an error naming it, and its batch is not committed; a restart without the
    fault commits the batch, and the table equals Spark batch mode."""
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", "k string, n long")
    state = tmp_path / "state"

    def start(local_node: bool) -> App:
        stream = source.stream(spark).groupBy("k").agg(F.sum("n").alias("n"))
        app = App(spark, state_dir=str(state), name="landing", snapshot_every=None)
        app.materialize("sums", stream, key="k", partitions=3)
        return app.start(local_node=local_node)

    source.write({"k": f"k{i % 7}", "n": i} for i in range(40))
    monkeypatch.setenv(SEGMENT_FAULT_ENV, f"{fault}:sums:1")
    app = start(local_node=False)
    try:
        app.process_all_available()  # batch 0 is not damaged
        source.write({"k": f"k{i % 9}", "n": i * 10} for i in range(40))
        with pytest.raises(SparkiqError) as failed:
            app.process_all_available()
    finally:
        app.stop()
    changelog = Changelog(str(state), "sums")
    message = str(failed.value)
    assert says in message, message[-3000:]
    # the sink's own error, out of Spark's traces (an executor's, or the driver's)
    failed_with = r"the Spark query of 'sums' failed: (sparkiq\.errors\.)?CorruptSegmentError: "
    assert re.match(failed_with, message), message
    assert "Traceback" not in message and "\tat " not in message, message
    assert str(state / "tables" / "sums" / "segments") in message
    assert changelog.committed_batch_ids() == [0]

    monkeypatch.delenv(SEGMENT_FAULT_ENV)
    app = start(local_node=True)
    try:
        app.process_all_available(timeout=120)
        assert changelog.committed_batch_ids() == [0, 1]
        expected = source.batch(spark).groupBy("k").agg(F.sum("n").alias("n"))
        assert_table_matches(app, "sums", expected)
    finally:
        app.stop()


def test_relative_locations_are_made_absolute_on_the_driver(
    spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the App and its sinks hold (and ship to executors) names the same place in any
    working directory; URIs are left as they are."""
    from sparkiq.changelog import TableManifest
    from sparkiq.schema.types import TableSchema
    from tests.changelog.helpers import SCHEMA_JSON

    monkeypatch.chdir(tmp_path)
    app = App(spark, state_dir="state", checkpoint_dir="checkpoints")
    assert (app.state_dir, app.checkpoint_dir) == (
        str(tmp_path / "state"),
        str(tmp_path / "checkpoints"),
    )
    assert App(spark, state_dir="./state/").checkpoint_dir == str(tmp_path / "state/checkpoints")
    schema = TableSchema.from_spark_json(SCHEMA_JSON, ["k"], None)
    manifest = TableManifest(name="t", schema=schema, partitions=2, output_mode="update")
    sink = TableSink("state", manifest, "checkpoints/t", 4)
    assert (sink.state_dir, sink.checkpoint_location) == (
        str(tmp_path / "state"),
        str(tmp_path / "checkpoints" / "t"),
    )
    assert absolute_location("~/state") == os.path.expanduser("~/state")
    for uri in ("s3://bucket/shop", "file:///data/shop", "hdfs://nn:8020/shop"):
        assert absolute_location(uri) == uri
