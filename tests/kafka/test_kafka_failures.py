"""Failures of a Kafka pipeline against a real broker, each checked against the broker's
content: the records it acknowledged, and Spark's batch answer over the topic.

- the driver dies between a batch's segments and its commit record, and right after the
  commit record, and is restarted: every record is counted once;
- the broker is restarted while the pipeline runs: no record lost or counted twice;
- a partition is added to the topic: its records are counted, positions gain it;
- records age out before Spark reads them: with ``failOnDataLoss`` the query fails and
  ``App.process_all_available`` says why; without it, the lost records are skipped and the
  position is the topic's end offsets, what Spark read up to.

The tests share the worker's broker (tests/kafka/conftest.py); each has a topic of its own.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sparkiq import Node
from sparkiq.changelog import Changelog
from sparkiq.spark.sink import CRASH_ENV
from sparkiq.testing import assert_table_matches, table_rows
from tests.kafka.client import Delivered, create_topic, end_offsets, produce
from tests.kafka.pipeline import (
    batch,
    committed_positions,
    ends_of,
    expected_totals,
    orders,
    parse,
    totals,
)

# Starts JVMs of its own (Spark drivers, and the broker again): scheduled first.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4


def run_writer(
    bootstrap_servers: str, topic: str, state: Path, crash_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    """tests/kafka/writer_process.py in its own process, dying at ``crash_at`` if given."""
    env = {k: v for k, v in os.environ.items() if k not in (CRASH_ENV, "SPARK_REMOTE")}
    if crash_at:
        env[CRASH_ENV] = crash_at
    command = [sys.executable, "-m", "tests.kafka.writer_process", bootstrap_servers, topic]
    return subprocess.run(
        [*command, str(state)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def assert_exactly_once(
    state: Path, topic: str, delivered: list[Delivered], bootstrap_servers: str
) -> None:
    """Each commit record's ``kafka:<topic>`` offsets move forward from the previous one's,
    the last equal the topic's end offsets, and the batches between them hold every
    acknowledged record once: the offsets of consecutive batches tile the topic."""
    positions = committed_positions(str(state), "totals", topic)
    assert sorted(positions) == list(range(len(positions)))
    previous = dict.fromkeys(range(PARTITIONS), 0)
    for batch_id, position in sorted(positions.items()):
        assert all(position.get(p, 0) >= previous[p] for p in previous), (batch_id, position)
        previous = {p: position.get(p, 0) for p in previous}
    assert previous == ends_of(delivered, PARTITIONS)
    assert end_offsets(bootstrap_servers, topic, PARTITIONS) == previous
    assert sum(previous.values()) == len(delivered)


def test_a_driver_killed_at_a_commit_boundary_counts_every_record_once(
    kafka_spark: Any, kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic, state = "orders-crash", tmp_path / "state"
    create_topic(kafka_bootstrap, topic, PARTITIONS)
    rng = random.Random(5)
    delivered = produce(kafka_bootstrap, topic, orders(rng, 120))  # three batches at least
    changelog = Changelog(str(state), "totals")

    # Killed between the segments of batch 1 and its commit record: batch 1 is re-run.
    crashed = run_writer(kafka_bootstrap, topic, state, crash_at="before_commit:totals:1")
    assert crashed.returncode == 86, crashed.stderr[-3000:]
    assert list((state / "tables" / "totals" / "segments").glob(f"*/{1:020d}.arrow"))
    assert changelog.committed_batch_ids() == [0]

    # Killed right after the commit record of batch 2: its re-run must write nothing.
    crashed = run_writer(kafka_bootstrap, topic, state, crash_at="after_commit:totals:2")
    assert crashed.returncode == 86, crashed.stderr[-3000:]
    assert changelog.committed_batch_ids() == [0, 1, 2]
    commit_1, commit_2 = (Path(changelog.commit_path(b)).read_bytes() for b in (1, 2))

    # Records produced while the driver is down are read by the restarted one.
    delivered += produce(kafka_bootstrap, topic, orders(rng, 60))
    finished = run_writer(kafka_bootstrap, topic, state)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert Path(changelog.commit_path(1)).read_bytes() == commit_1
    assert Path(changelog.commit_path(2)).read_bytes() == commit_2

    assert_exactly_once(state, topic, delivered, kafka_bootstrap)
    with Node(str(state), store="memory") as node:
        node.poll_once()
        assert table_rows(node, "totals") == expected_totals(delivered)
        assert_table_matches(
            node, "totals", totals(parse(batch(kafka_spark, kafka_bootstrap, topic)))
        )
