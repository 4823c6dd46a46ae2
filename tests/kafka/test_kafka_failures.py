"""Failures of a Kafka pipeline against a real broker, each checked against the broker's
content: the records it acknowledged, and Spark's batch answer over the topic.

- the driver, its own process, dies between a batch's segments and its commit record and is
  restarted while more records arrive: every record is counted once (the sink's other crash
  point, right after a commit record, is tests/spark/test_exactly_once.py's: what the sink
  does there depends on its commit records only, not on the source);
- the broker is restarted while the pipeline runs: no record lost or counted twice;
- a partition is added to the topic: its records are counted, positions gain it;
- records age out before Spark reads them: with ``failOnDataLoss`` the query fails and
  ``App.process_all_available`` says why, and so do a node's ``/stats`` and ``/metrics``,
  ``sparkiq status`` and the console (the writer status record); without it, the lost
  records are skipped and the position is the topic's end offsets, what Spark read up to
  (and the writer shows running again).

The tests share the worker's broker (tests/kafka/conftest.py); each has a topic of its own.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from sparkiq import App, Node
from sparkiq.changelog import Changelog
from sparkiq.errors import SparkiqError
from sparkiq.spark.sink import CRASH_ENV, WRITE_ENV
from sparkiq.testing import KafkaBroker, assert_table_matches, table_rows
from tests import http_calls
from tests.browser import CHROMIUM, chromium, open_first_table
from tests.cluster.cluster_helpers import wait_until
from tests.kafka.client import (
    Delivered,
    add_partitions,
    create_topic,
    delete_records,
    end_offsets,
    produce,
)
from tests.kafka.pipeline import (
    batch,
    committed_positions,
    ends_of,
    expected_totals,
    orders,
    parse,
    stream,
    totals,
)
from tests.kafka.test_kafka_lag import metric_samples
from tests.kafka.writer_process import BATCH_RECORDS, writer_app

# Starts JVMs of its own (Spark drivers, and the broker again): scheduled first.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4


def run_writer(
    bootstrap_servers: str, topic: str, state: Path, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    """tests/kafka/writer_process.py in its own process, dying at ``crash_at`` if given.

    Its batches are written on the driver (``SPARKIQ_SINK_WRITE``): batch 1, where it dies,
    is written there in either mode (batch 0 is small), while batch 0 through write tasks
    started a Python daemon and workers in that JVM, 2.2 of its 16 CPU-s (measured). The
    writer process of tests/spark/test_exactly_once.py still writes its batch 0 by tasks."""
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, "SPARK_REMOTE")}
    env[WRITE_ENV] = "driver"
    if crash_at:
        env[CRASH_ENV] = crash_at
    command = [sys.executable, "-m", "tests.kafka.writer_process", bootstrap_servers, topic]
    return subprocess.run(
        [*command, str(state)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def assert_positions_reach_the_end(
    state: Path, topic: str, bootstrap_servers: str, partitions: int = PARTITIONS
) -> dict[int, int]:
    """Each commit record's ``kafka:<topic>`` offsets move forward from the previous one's,
    and the last equal the topic's end offsets (returned)."""
    positions = committed_positions(str(state), "totals", topic)
    assert sorted(positions) == list(range(len(positions)))
    previous = dict.fromkeys(range(partitions), 0)
    for batch_id, position in sorted(positions.items()):
        assert all(position.get(p, 0) >= previous[p] for p in previous), (batch_id, position)
        previous = {p: position.get(p, 0) for p in previous}
    assert end_offsets(bootstrap_servers, topic, partitions) == previous
    return previous


def assert_exactly_once(
    state: Path,
    topic: str,
    delivered: list[Delivered],
    bootstrap_servers: str,
    partitions: int = PARTITIONS,
) -> None:
    """The commit records' positions reach the topic's end offsets, the offsets the broker
    acknowledged, and the batches between them tile the topic: every acknowledged record is
    in exactly one batch (the table's counts then say none was applied twice)."""
    ends = assert_positions_reach_the_end(state, topic, bootstrap_servers, partitions)
    assert ends == ends_of(delivered, partitions)
    assert sum(ends.values()) == len(delivered)


def wait_for_commit(state: Path, batch_id: int, timeout: float = 600.0) -> None:
    """Wait until table ``totals`` has committed ``batch_id`` (generous: a busy machine)."""
    changelog = Changelog(str(state), "totals")
    deadline = time.monotonic() + timeout
    while not changelog.has_commit(batch_id):
        assert time.monotonic() < deadline, f"batch {batch_id} not committed in {timeout} s"
        time.sleep(0.05)


def writer_of(
    url: str, state: str, also: Callable[[dict[str, Any]], bool] = lambda _: True
) -> dict[str, Any]:
    """Table ``totals``' writer in the node's ``GET /stats`` once it is in ``state``."""
    seen: list[dict[str, Any]] = []

    def shown() -> bool:
        writers = http_calls.get(f"{url}/stats", timeout=30).json()["writers"]
        seen[:] = [w for w in writers if w["table"] == "totals"]
        return bool(seen) and seen[0]["state"] == state and also(seen[0])

    wait_until(shown, 120, f"the writer of 'totals' never showed {state}: {seen}")
    return seen[0]


def assert_the_data_loss_reason(text: str, topic: str) -> None:
    """``text`` says, in Spark's words, that records of ``topic`` aged out unread."""
    assert "Some data may have been lost because they are not available in Kafka" in text
    assert re.search(
        rf"Could not read records in offset \[\d+, \d+\) for topic partition {topic}-", text
    )
    assert "source option failOnDataLoss to false" in text
    assert "Traceback" not in text and "\tat " not in text, text


def run_status(state: Path) -> str:
    """``sparkiq status`` run as users run it."""
    command = [sys.executable, "-m", "sparkiq.cli", "status", "--state-dir", str(state)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_the_console_shows_the_failure(url: str, topic: str) -> None:
    """The console's table view: the writer section says failed, with Spark's reason."""
    with chromium() as browser:
        page = browser.new_page()
        open_first_table(page, url)
        page.wait_for_selector("#table-writer-reason")
        assert "FAILED" in page.inner_text("#table-writer")
        assert_the_data_loss_reason(page.inner_text("#table-writer-reason"), topic)


@pytest.fixture
def app_factory(kafka_spark: Any, tmp_path: Path) -> Iterator[Any]:
    """Start Apps materializing ``totals`` over a topic in ``tmp_path/state``; each is
    stopped when the next starts and at the end."""
    started: list[App] = []

    def start(bootstrap_servers: str, topic: str, **options: str) -> App:
        for app in started:
            app.stop()
        records = stream(kafka_spark, bootstrap_servers, topic, **options)
        app = App(kafka_spark, state_dir=str(tmp_path / "state"), name="kafka-failures")
        app.materialize("totals", totals(parse(records)), key="user", partitions=4)
        started.append(app.start())
        return app

    yield start
    for app in started:
        app.stop()


def test_a_driver_killed_at_a_commit_boundary_counts_every_record_once(
    kafka_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The driver dies between the segments of batch 1 and its commit record; restarted,
    it runs batch 1 again over the same offsets, then the records produced while it was down.

    The restart is the same pipeline on this process's session: a driver that knows of the
    state_dir and the checkpoint only what is on disk, as a restarted process does (one
    writer JVM started instead of three)."""
    topic, state = "orders-crash", tmp_path / "state"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    rng = random.Random(5)
    delivered = produce(kafka_bootstrap, topic, orders(rng, 2 * BATCH_RECORDS))  # 2 batches
    changelog = Changelog(str(state), "totals")

    crashed = run_writer(kafka_bootstrap, topic, state, crash_at="before_commit:totals:1")
    assert crashed.returncode == 86, crashed.stderr[-3000:]
    assert list((state / "tables" / "totals" / "segments").glob(f"*/{1:020d}.arrow"))
    assert changelog.committed_batch_ids() == [0]
    commit_0 = Path(changelog.commit_path(0)).read_bytes()

    # Records produced while the driver is down are read by the restarted one.
    delivered += produce(kafka_bootstrap, topic, orders(rng, BATCH_RECORDS))
    app = writer_app(kafka_spark, kafka_bootstrap, topic, str(state))
    app.start(local_node=False)
    try:
        app.process_all_available(timeout=600)
    finally:
        app.stop()
    assert Path(changelog.commit_path(0)).read_bytes() == commit_0
    assert len(changelog.committed_batch_ids()) >= 3  # batch 1 again, then the new records

    assert_exactly_once(state, topic, delivered, kafka_bootstrap)
    with Node(str(state), store="memory") as node:
        node.poll_once()
        assert table_rows(node, "totals") == expected_totals(delivered)
        assert_table_matches(
            node, "totals", totals(parse(batch(kafka_spark, kafka_bootstrap, topic)))
        )


def test_a_broker_restarted_mid_stream_loses_and_repeats_nothing(
    kafka_spark: Any, kafka_cluster: KafkaBroker, app_factory: Any, tmp_path: Path
) -> None:
    servers, topic, state = kafka_cluster.bootstrap_servers, "orders-restart", tmp_path / "state"
    create_topic(servers, topic, PARTITIONS)
    rng = random.Random(7)
    delivered = produce(servers, topic, orders(rng, 200))  # five batches of 40 records
    app = app_factory(servers, topic, maxOffsetsPerTrigger="40")
    try:
        wait_for_commit(state, 0)
        read = committed_positions(str(state), "totals", topic)
        kafka_cluster.restart()  # mid-stream: batches of the first records are still to run
        delivered += produce(servers, topic, orders(rng, 80))
        app.process_all_available(timeout=600)
    finally:
        kafka_cluster.start()  # the worker's other tests need it (a no-op once it runs)
    # when the broker went down, the query had read part of the first 200 records only
    assert sum(read[max(read)].values()) < 200, read
    assert_exactly_once(state, topic, delivered, servers)
    assert table_rows(app, "totals") == expected_totals(delivered)
    assert_table_matches(app, "totals", totals(parse(batch(kafka_spark, servers, topic))))


def test_records_of_a_partition_added_mid_stream_are_counted(
    kafka_spark: Any, kafka_bootstrap: str, app_factory: Any, tmp_path: Path
) -> None:
    servers, topic, state = kafka_bootstrap, "orders-grow", tmp_path / "state"
    create_topic(servers, topic, 2)
    rng = random.Random(3)
    delivered = produce(servers, topic, orders(rng, 60))
    app = app_factory(servers, topic)
    app.process_all_available(timeout=600)
    assert_exactly_once(state, topic, delivered, servers, partitions=2)

    add_partitions(servers, topic, 3)
    delivered += produce(servers, topic, orders(rng, 90))
    assert {d.partition for d in delivered} == {0, 1, 2}
    app.process_all_available(timeout=600)
    assert_exactly_once(state, topic, delivered, servers, partitions=3)
    assert table_rows(app, "totals") == expected_totals(delivered)
    assert_table_matches(app, "totals", totals(parse(batch(kafka_spark, servers, topic))))


def test_records_aged_out_before_spark_read_them(
    kafka_spark: Any, kafka_bootstrap: str, app_factory: Any, tmp_path: Path
) -> None:
    """Kafka deletes records Spark has not read yet (DeleteRecords moves each partition's
    log start offset, as retention does): with ``failOnDataLoss`` (Spark's default) the query
    fails and ``process_all_available`` says why; restarted with it false, the query skips
    them and the position is the topic's end offsets, though the table lacks the lost ones."""
    servers, topic, state = kafka_bootstrap, "orders-aged", tmp_path / "state"
    partitions = 2
    create_topic(servers, topic, partitions)
    rng = random.Random(11)
    read = produce(servers, topic, orders(rng, 40))
    app = app_factory(servers, topic, failOnDataLoss="true")
    app.process_all_available(timeout=600)
    read_ends = assert_positions_reach_the_end(state, topic, servers, partitions)
    app.stop()  # the pipeline is down while Kafka ages records out

    unread = produce(servers, topic, orders(rng, 40))
    unread_ends = ends_of(unread, partitions)
    cut = {p: (read_ends[p] + unread_ends[p]) // 2 for p in range(partitions)}
    assert all(read_ends[p] < cut[p] < unread_ends[p] for p in cut), (read_ends, unread_ends)
    held = batch(kafka_spark, servers, topic).select("partition", "offset", "value").collect()
    assert delete_records(servers, topic, cut) == cut
    survivors = [d for d in unread if d.offset >= cut[d.partition]]
    lost = len(unread) - len(survivors)

    app = app_factory(servers, topic, failOnDataLoss="true")
    with pytest.raises(SparkiqError) as failure:
        app.process_all_available(timeout=600)
    # Spark's reason in a few lines: the records lost, where, and the option; no traces
    said = str(failure.value)
    assert said.startswith("the Spark query of 'totals' failed: "), said
    assert "Some data may have been lost because they are not available in Kafka" in said
    assert re.search(
        rf"Could not read records in offset \[\d+, \d+\) for topic partition {topic}-", said
    )
    assert "source option failOnDataLoss to false" in said
    assert "The table stays at batch 0" in said
    assert "Traceback" not in said and "\tat " not in said, said
    assert failure.value.store == "totals"
    assert isinstance(failure.value.__cause__, StreamingQueryException)  # every trace there
    assert committed_positions(str(state), "totals", topic)[0] == read_ends  # nothing more
    assert table_rows(app, "totals") == expected_totals(read)

    # ... and where users look: a node's /stats and /metrics, sparkiq status, the console
    reader = Node(str(state), node_id="reader", listen="127.0.0.1:0", standbys=0, store="memory")
    try:
        url = reader.start().url or ""
        failed = writer_of(url, "failed")
        assert failed["batch_id"] == 0 and failed["failed_at"] is not None
        assert_the_data_loss_reason(failed["reason"], topic)
        assert failed["reason"] in said  # the same reason process_all_available gave
        assert metric_samples(url, "sparkiq_writer_up") == {("totals",): 0.0}
        assert metric_samples(url, "sparkiq_writer_state") == {("failed", "totals"): 1.0}
        status = run_status(state)
        assert "writer FAILED at " in status and "last commit batch 0" in status, status
        assert_the_data_loss_reason(status, topic)
        if CHROMIUM is not None:
            assert_the_console_shows_the_failure(url, topic)

        app = app_factory(servers, topic, failOnDataLoss="false")
        app.process_all_available(timeout=600)
        newest = max(committed_positions(str(state), "totals", topic))
        # Spark posts a batch's progress after the sink committed it, so a record rewritten
        # in between names the batch before its duration: wait for both.
        running = writer_of(
            url,
            "running",
            lambda w: w["batch_id"] == newest and w["batch_duration_ms"] is not None,
        )
        assert running["reason"] is None and running["batch_duration_ms"] > 0
        assert running["input_rows_per_second"] is not None
        assert 0 <= running["last_commit_age_seconds"] < 600
        assert metric_samples(url, "sparkiq_writer_up") == {("totals",): 1.0}
    finally:
        reader.stop()
    assert assert_positions_reach_the_end(state, topic, servers, partitions) == unread_ends
    assert table_rows(app, "totals") == expected_totals(read + survivors)
    # Spark's batch answer over what the topic held before and holds now
    now = batch(kafka_spark, servers, topic).select("partition", "offset", "value").collect()
    assert sorted((r.partition, r.offset) for r in now) == sorted(
        (d.partition, d.offset) for d in survivors
    )
    kept = [r for r in held if r.offset < read_ends[r.partition]] + now
    frame = kafka_spark.createDataFrame(kept, "partition int, offset long, value binary")
    assert_table_matches(app, "totals", totals(parse(frame)))
    assert lost > 0
